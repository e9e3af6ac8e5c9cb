"""The docs site's generated reference: every Policy field and every problem code, from the code.

scripts/mkdocs_hooks.py builds the tables when `mkdocs build` runs (CI runs it with --strict);
here the tables are checked against the code itself, so a field added without its `#:`
comment, or a problem code whose status the hook cannot find, fails the test run too.
"""

from __future__ import annotations

import dataclasses
import importlib.util
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
