"""The demo on the installs users make without our lock: no lupa (fakeredis without Lua), no
httpx, and an httpx whose JSON encoding differs from ours (0.27 writes spaces)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from idemkey.cli.demo_app import run_story

ROOT = Path(__file__).resolve().parents[2]
#: An interpreter start and a refusal; playing the story without Lua took about 50 s.
WITHIN = 30.0


def _cli_without(blocked: tuple[str, ...], *argv: str) -> subprocess.CompletedProcess[str]:
    """``idemkey ARGV`` in a fresh interpreter where ``blocked`` cannot be imported."""
    code = (
        "import sys\n"
        f"for name in {blocked!r}:\n"
        "    sys.modules[name] = None\n"
        "from idemkey.cli import main\n"
        f"sys.exit(main({list(argv)!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WITHIN,
        check=False,
    )


@pytest.mark.parametrize("command", [("demo",), ("serve", "--port", "0")])
def test_the_demo_without_lua_exits_2_with_the_install_line(command: tuple[str, ...]) -> None:
    result = _cli_without(("lupa",), *command)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "pip install 'idemkey-redis[demo]'" in result.stderr
    assert "lupa" in result.stderr or "Lua" in result.stderr


def test_the_demo_without_httpx_exits_2_with_the_install_line() -> None:
    result = _cli_without(("httpx",), "demo")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "the demo needs httpx: pip install 'idemkey-redis[demo]'" in result.stderr


def test_the_demo_story_passes_when_httpx_writes_json_with_spaces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """httpx 0.27 encoded ``json=`` with json.dumps' default separators; the demo's first
    attempt (http.client) and its retry (idemkey.client over httpx) must send the same bytes
    whatever httpx writes, or the retry is a 422 key_reused."""

    def spaced(obj: object, **_: object) -> str:
        return json.dumps(obj)

    monkeypatch.setattr(httpx._content, "json_dumps", spaced)
    assert httpx.Request("POST", "http://x/", json={"a": 1}).content == b'{"a": 1}'
    out = __import__("io").StringIO()
    assert run_story(None, "spaced", out), out.getvalue()
