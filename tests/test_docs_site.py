"""The docs site's generated reference: every Policy field and every problem code, from the code.

scripts/mkdocs_hooks.py builds the tables when `mkdocs build` runs (CI runs it with --strict);
here the tables are checked against the code itself, so a field added without its `#:`
comment, or a problem code whose status the hook cannot find, fails the test run too.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

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
