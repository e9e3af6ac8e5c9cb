"""The docs site's generated reference: every Policy field and every problem code, from the code,
and a docstring on every public name the API reference renders.

scripts/mkdocs_hooks.py builds the tables when `mkdocs build` runs (CI runs it with --strict);
here the tables are checked against the code itself, so a field added without its `#:`
comment, or a problem code whose status the hook cannot find, fails the test run too.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import re
import shutil
from pathlib import Path

import pytest

from idemkey.http._problems import _TITLES
from idemkey.policy import Policy

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "scripts/mkdocs_hooks.py")
assert spec is not None
assert spec.loader is not None
hooks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hooks)


def test_every_policy_option_is_a_row_with_its_default_and_comment() -> None:
    table = hooks.policy_table()
    options = [f for f in dataclasses.fields(Policy) if f.init]
    assert len(table.splitlines()) == 2 + len(options)
    assert "| `ttl` | `float` | `86400.0` | How long a completed record is kept" in table
    assert "| `mismatch_status` | `int` | `422` |" in table
    assert "lease_ms" not in table  # derived, not an option


def test_a_field_without_its_comment_fails_the_build() -> None:
    source = (ROOT / "idemkey/policy.py").read_text("utf-8")
    comments = hooks.field_comments(source.replace("#: The request header", "# x"), "Policy")
    assert comments["header"] == ""
    assert comments["prefix"].startswith("Redis key prefix")


def test_every_problem_code_has_its_status() -> None:
    table = hooks.problem_table()
    for code in _TITLES:
        assert f"| `{code}` |" in table
    assert "| `in_flight` | 409 |" in table
    assert "| `request_too_large` | 413 |" in table
    assert "| `key_reused` | `Policy.mismatch_status` (422 by default) |" in table


def test_the_home_page_pitch_is_the_readmes() -> None:
    pitch = hooks.readme_pitch()
    assert pitch.startswith("Make HTTP writes and background jobs safe to retry.")
    assert "\n- Same key, same request" in pitch


def _without_docstring(source: str, name: str) -> str:
    """``source`` with the docstring of the function or class ``name`` removed."""
    tree = ast.parse(source)
    (node,) = [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name
    ]
    doc = node.body[0]
    assert isinstance(doc, ast.Expr)
    assert doc.end_lineno is not None
    lines = source.splitlines(keepends=True)
    del lines[doc.lineno - 1 : doc.end_lineno]
    return "".join(lines)


def test_every_public_name_of_the_reference_has_a_docstring() -> None:
    pytest.importorskip("griffe")
    assert hooks.undocumented() == []


def test_a_public_name_without_a_docstring_fails_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("griffe")
    mkdocs_exceptions = pytest.importorskip("mkdocs.exceptions")
    shutil.copytree(ROOT / "idemkey", tmp_path / "idemkey", ignore=shutil.ignore_patterns("*.pyc"))
    assert hooks.undocumented(hooks.DOCUMENTED, tmp_path) == []
    for path, name, dotted in [
        ("contrib/sqlalchemy.py", "fenced", "idemkey.contrib.sqlalchemy.fenced"),
        ("client/_sync.py", "Client", "idemkey.client.Client"),  # re-exported from private
        ("guard/_call.py", "save", "idemkey.Call.save"),  # a public method
    ]:
        source = tmp_path / "idemkey" / path
        source.write_text(_without_docstring(source.read_text("utf-8"), name), "utf-8")
        assert dotted in hooks.undocumented(hooks.DOCUMENTED, tmp_path)
    monkeypatch.setattr(hooks, "ROOT", tmp_path)
    with pytest.raises(
        mkdocs_exceptions.PluginError, match=r"idemkey\.contrib\.sqlalchemy\.fenced"
    ):
        hooks.on_config({})


#: The entry points the API reference must render (issue 37), each in a ``:::`` directive or
#: its ``members`` list on a page of docs/reference/.
ENTRY_POINTS = [
    "guard", "aguard", "idempotent", "RedisStore", "AsyncRedisStore", "Call", "StepRetry",
    "Client", "AsyncClient", "RetryPolicy", "IdempotentTransport", "AsyncIdempotentTransport",
    "idemkey.adapters.flask.Idemkey", "idemkey.adapters.fastapi", "Idempotency",
    "IdempotentRoute", "idemkey.adapters.django", "IdempotencyMiddleware",
    "idemkey.adapters.wsgi.IdempotencyMiddleware", "idemkey.adapters.asgi.IdempotencyMiddleware",
    "IdempotentTask", "IdempotentTools", "fenced", "Effects",
]  # fmt: skip


def test_the_reference_pages_render_every_entry_point_and_are_in_the_nav() -> None:
    rendered = ""
    nav = (ROOT / "mkdocs.yml").read_text("utf-8")
    for page in sorted((ROOT / "docs" / "reference").glob("*.md")):
        assert f"reference/{page.name}" in nav, page.name
        text = page.read_text("utf-8")
        rendered += " ".join(re.findall(r"^::: (\S+)", text, re.M))
        rendered += " " + " ".join(re.findall(r"members: \[([^\]]*)\]", text))
        rendered += " " + " ".join(re.findall(r"^\s+- (\w+)$", text, re.M))
    names = set(re.split(r"[\s,]+", rendered))
    shown = names | {name.rsplit(".", 1)[-1] for name in names}
    assert [name for name in ENTRY_POINTS if name not in shown] == []


def test_the_home_page_names_the_version_the_install_line_and_the_repository() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text("utf-8")
    version = re.search(r'^version = "(.+)"', pyproject, re.M)[1]  # type: ignore[index]
    line = hooks.project_line()
    assert f"**idemkey-redis {version}**" in line
    assert "pip install -e '.[flask]'" in line
    assert "<!-- project-line -->" in (ROOT / "docs/index.md").read_text("utf-8")
    urls = '[project]\nname = "idemkey-redis"\nversion = "9.9"\n[project.urls]\n'
    with_url = hooks.project_line(urls + 'Repository = "https://example.org/idemkey"\n')
    assert "[repository](https://example.org/idemkey)" in with_url


def _blocks(page: str, language: str) -> list[str]:
    text = (ROOT / "docs" / page).read_text("utf-8")
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def test_the_fastapi_sample_fits_its_box() -> None:
    # Its longest line overflowed the code box at 1280 px (93 characters); 80 fit.
    lines = [line for block in _blocks("fastapi.md", "python") for line in block.splitlines()]
    assert max(map(len, lines)) <= 80


def test_one_redis_version_and_a_loopback_server_on_every_page() -> None:
    pages = sorted((ROOT / "docs").glob("*.md"))
    for page in pages:
        text = page.read_text("utf-8")
        assert "6.2+" not in text, page.name  # the supported servers: Redis 7.0+ and Valkey 9
        for block in _blocks(page.name, "bash"):
            for line in block.splitlines():
                if line.startswith("redis-server"):
                    assert "--bind 127.0.0.1" in line, (page.name, line)
                    assert "redis-cli -h 127.0.0.1 -p 6379 ping" in block, page.name
