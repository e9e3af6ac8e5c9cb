"""Generate ``idemkey/client/_sync.py`` from ``idemkey/client/_async.py``.

``python -m tests.client.unasync`` rewrites the file (then ``ruff format`` it);
``tests/client/test_unasync.py`` fails when the committed file has drifted. The async file is
the source (encode/httpcore's ``scripts/unasync.py`` does the same with a substitution table).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "idemkey" / "client" / "_async.py"
TARGET = ROOT / "idemkey" / "client" / "_sync.py"

HEADER = '''"""The blocking shell over ``httpx``: :class:`Client` and :class:`IdempotentTransport`.

Generated from ``_async.py`` by ``python -m tests.client.unasync``: edit that file, not this
one (``tests/client/test_unasync.py`` fails on drift). Every decision is in ``_retry.py`` and
every action on one in ``_shell.py``: a shell only sends, reads and sleeps.
"""
'''

# Applied in order, as whole words; the longer names come first.
SUBSTITUTIONS = [
    (r"AsyncIdempotentTransport", "IdempotentTransport"),
    (r"AsyncHTTPTransport", "HTTPTransport"),
    (r"AsyncBaseTransport", "BaseTransport"),
    (r"AsyncClient", "Client"),
    (r"handle_async_request", "handle_request"),
    (r"__aenter__", "__enter__"),
    (r"__aexit__", "__exit__"),
    (r"aclose", "close"),
    (r"aread", "read"),
    (r"arun", "run"),
    (r"asyncio\.sleep", "time.sleep"),
    (r"Awaitable\[httpx\.Response\]", "httpx.Response"),
    (r"async def", "def"),
    (r"await ", ""),
    (r"import asyncio\n", ""),
    (r"Awaitable, ", ""),
]


def unasync(text: str) -> str:
    """The blocking twin of ``text`` (the async shell's source)."""
    docstring_end = text.index('"""', 3) + 4
    body = text[docstring_end:]
    for pattern, replacement in SUBSTITUTIONS:
        body = re.sub(rf"\b{pattern}" if pattern[0].isalpha() else pattern, replacement, body)
    return HEADER + body


def main() -> int:
    TARGET.write_text(unasync(SOURCE.read_text()))
    print(f"wrote {TARGET.relative_to(ROOT)}; now run: ruff format {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
