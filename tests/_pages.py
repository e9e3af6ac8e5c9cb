"""Run the python blocks of a documentation page as printed.

Every ```python block of a page in :data:`PAGES` follows a ``<!-- run -->`` line, and the page's
test runs every one of them (``tests/test_pages.py`` checks both). A block runs in a namespace
of its own holding nothing but ``__name__``: what it uses it imports or defines, as a reader
who copies that block alone has it. The only change is the Redis URL, the page's
``redis://localhost:6379`` pointed at the test's private redis-server. A page whose samples
call your own services imports them from a module it names (``from shop import psp``); the
test puts its fakes in ``sys.modules`` under that name. The pages a newcomer starts from
run twice in a row (:func:`run_twice`), and as a script in a fresh virtual environment built
from the page's own install line (``python tests/_pages.py PAGE REDIS_URL``; see
tests/test_pages_fresh.py).
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The pages whose every python block runs in the tests as printed.
PAGES = (
    "docs/behaviour.md",
    "docs/guard.md",
    "docs/steps.md",
    "docs/queues.md",
    "docs/client.md",
    "docs/effects.md",
    "docs/testing.md",
    "docs/mcp.md",
    "docs/operators.md",
    "docs/glide.md",
)
MARKED = re.compile(r"<!-- run -->\n```python\n(.*?)```", re.DOTALL)
ANY_PYTHON = re.compile(r"^```python\n", re.MULTILINE)
LOCAL_REDIS = re.compile(r"redis://localhost:6379(/\d+)?")


def blocks(path: str) -> list[str]:
    """The page's python blocks; every one must be marked ``<!-- run -->``."""
    text = (ROOT / path).read_text("utf-8")
    found = MARKED.findall(text)
    assert found, f"{path}: no <!-- run --> block"
    assert len(found) == len(ANY_PYTHON.findall(text)), f"{path}: a python block is not marked"
    return found


def point_at(code: str, redis_url: str | None) -> str:
    """The block with its Redis URL on the test's server (the database number is kept)."""
    if redis_url is None:
        return code
    base = re.sub(r"/\d+$", "", redis_url)
    return LOCAL_REDIS.sub(lambda m: base + (m[1] or ""), code)


def run_block(
    path: str,
    index: int,
    code: str,
    redis_url: str | None,
    replace: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run one block; ``replace`` maps other addresses of the page (a server's URL) to the
    test's."""
    code = point_at(code, redis_url)
    for old, new in (replace or {}).items():
        code = code.replace(old, new)
    name = f"docs_{Path(path).stem}_{index}"
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses, pickling and Celery look definitions up by module
    try:
        exec(compile(code, f"{path}[{index}]", "exec"), module.__dict__)
    finally:
        sys.modules.pop(name, None)
    return module.__dict__


def run_page(
    path: str,
    redis_url: str | None = None,
    replace: Mapping[str, str] | None = None,
    served: Collection[int] = (),
) -> list[dict[str, Any]]:
    """Run every python block of ``path`` in order, each on its own; their namespaces.

    ``served``: the indexes of blocks the caller runs in a real server process instead (a
    Celery worker imports its block as ``tasks.py``); their namespaces are empty here.
    """
    code = blocks(path)
    assert all(0 <= i < len(code) for i in served), served
    return [
        {} if i in served else run_block(path, i, block, redis_url, replace)
        for i, block in enumerate(code)
    ]


def run_twice(
    path: str,
    redis_url: str | None = None,
    replace: Mapping[str, str] | None = None,
    served: Collection[int] = (),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run the page's blocks as :func:`run_page` does, then all of them again against the same
    Redis: a reader who runs a sample twice, as an idempotency library's samples invite, must
    see the second run replay, never an error from what the first run stored."""
    first = run_page(path, redis_url, replace, served)
    return first, run_page(path, redis_url, replace, served)


@contextmanager
def fake_modules(modules: Mapping[str, Mapping[str, Any]]) -> Iterator[None]:
    """Install modules (name -> attributes) the page imports, for the duration."""
    saved = {name: sys.modules.get(name) for name in modules}
    try:
        for name, attributes in modules.items():
            module = types.ModuleType(name)
            module.__dict__.update(attributes)
            sys.modules[name] = module
        yield
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous


def write_page(path: str, directory: Path, redis_url: str | None = None) -> list[Path]:
    """Save every python block of ``path`` as the file its first line names (``# app.py``),
    for a page whose samples are files run together (by pytest, say)."""
    written = []
    for index, code in enumerate(blocks(path)):
        first = code.splitlines()[0]
        assert re.fullmatch(r"# [\w/]+\.py", first), f"{path}[{index}]: no '# file' line"
        target = directory / first[2:]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(point_at(code, redis_url))
        written.append(target)
    return written


def main(argv: list[str]) -> int:
    """``python tests/_pages.py PAGE REDIS_URL [OLD=NEW ...]``: every block of ``PAGE``, twice
    (a reader running the samples twice), under the interpreter that runs this: a fresh
    virtual environment built from the page's install line (tests/test_pages_fresh.py)."""
    page, redis_url, *pairs = argv
    replace = dict(pair.split("=", 1) for pair in pairs)
    for run in (1, 2):
        print(f"== run {run}", flush=True)
        run_page(page, redis_url, replace)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
