"""The pages' samples run as printed: docs/guard.md, client.md, effects.md, testing.md here;
docs/steps.md in tests/steps/test_docs.py and docs/queues.md in tests/contrib/test_queues_page.py.

See :mod:`tests._pages` for what "as printed" means: each python block runs alone, in an empty
namespace, with only its Redis URL pointed at the test's private redis-server.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._pages import PAGES, ROOT, blocks, point_at, run_page
from tests._servers import RedisServer

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_of_the_page_is_marked_and_a_test_runs_the_page(page: str) -> None:
    assert blocks(page)  # every python block follows <!-- run --> (else an AssertionError)
    runners = [
        path
        for path in (ROOT / "tests").rglob("*.py")
        if re.search(rf"run_page\(\s*\"{re.escape(page)}\"", path.read_text("utf-8"))
    ]
    assert runners, f"no test calls run_page({page!r})"


def test_an_unmarked_python_block_fails_the_check(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- run -->\n```python\nx = 1\n```\n\n```python\ny = 2\n```\n")
    with pytest.raises(AssertionError, match="not marked"):
        blocks(str(page))  # an absolute path: ROOT / page is page


@pytest.fixture
def url(private_redis_server: RedisServer) -> str:
    return private_redis_server.url


def test_guard_page(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    first, reuse, asynchronous, decorator = run_page("docs/guard.md", url)
    assert first["psp"].charged == [1000]  # the block's own assertion held; once more here
    assert first["handle"](first["job"]) == {"charge_id": "ch_1"}
    assert first["psp"].charged == [1000]
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["{'charge_id': 'ch_1'}"] * 2
    assert out[2].startswith("refused: ")
    assert out[3] == "['welcome mail to user 7']"
    assert type(decorator["again"]).__name__ == "Receipt"
    assert decorator["charges"] == ["inv-2002"]
