"""docs/glide.md runs as printed: its sample makes a glide client from a Redis URL, a store and
two aguards. Run twice against one Redis, it prints what the page says of each run; the URL's
database, user and password reach glide (a ``/5`` that fell back to db 0 would give a fleet
moving from redis.asyncio a second copy of every record, and every retry across the move a
second run), and ``rediss://`` makes it speak TLS."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests._pages import ROOT, blocks, point_at, run_page, run_twice
from tests._servers import HOST, RedisServer, user_environ

PAGE = (ROOT / "docs" / "glide.md").read_text("utf-8")


@pytest.fixture(autouse=True)
def _glide() -> None:
    pytest.importorskip("glide", reason="valkey-glide is not installed (idemkey[glide])")


def printed_by(run: str) -> list[str]:
    """The lines the page says the sample prints on its first or second run."""
    if run == "first":
        return list(re.findall(r"It prints `(.+?)`, then `(.+?)`", PAGE)[0])
    (again,) = re.findall(r"Run again, it prints `(.+?)` twice", PAGE)
    return [again, again]


@pytest.mark.redis
def test_the_glide_page_runs_twice_as_printed(
    private_redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    run_page("docs/glide.md", private_redis_server.url)
    assert capsys.readouterr().out.splitlines() == printed_by("first")
    run_page("docs/glide.md", private_redis_server.url)  # a reader's second run
    assert capsys.readouterr().out.splitlines() == printed_by("second")
    assert printed_by("first") == ["False {'charge': 'ch_1'}", "True {'charge': 'ch_1'}"]


@pytest.mark.redis
def test_the_urls_database_user_and_password_reach_glide(
    redis_server_factory: Callable[..., RedisServer], capsys: pytest.CaptureFixture[str]
) -> None:
    server = redis_server_factory()
    with server.client() as admin:
        # alice's password is not the default user's: only a login as alice with it gets in.
        admin.acl_setuser(
            "alice", enabled=True, passwords=["+p@ss:1"], keys="*", commands=["+@all"]
        )
        admin.config_set("requirepass", "not-alices")
    at = f"redis://alice:p%40ss%3A1@{HOST}:{server.port}/5"  # percent-encoded, as in any URL
    run_twice("docs/glide.md", replace={"redis://localhost:6379/0": at})
    assert capsys.readouterr().out.splitlines() == printed_by("first") + printed_by("second")
    with (
        server.client(password="not-alices") as db0,
        server.client(password="not-alices", db=5) as db5,
    ):
        assert list(db0.scan_iter()) == []
        (stored,) = db5.scan_iter()
    assert stored.startswith(b"payments:{")


def test_a_rediss_url_makes_the_sample_speak_tls(tmp_path: Path) -> None:
    """No TLS server needed: the first bytes glide sends to a rediss:// address are a TLS
    record (0x16, handshake), where a plain client would send a RESP command (``*``)."""
    listener = socket.create_server((HOST, 0))
    url = f"rediss://{HOST}:{listener.getsockname()[1]}/5"
    first_bytes: list[bytes] = []
    received = threading.Event()

    def accept() -> None:
        with listener, listener.accept()[0] as connection:
            connection.settimeout(10)
            first_bytes.append(connection.recv(1))
            received.set()

    threading.Thread(target=accept, daemon=True).start()
    (code,) = blocks("docs/glide.md")
    sample = tmp_path / "sample.py"
    sample.write_text(point_at(code, None).replace("redis://localhost:6379/0", url))
    env = user_environ()
    env.pop("PYTHONPATH", None)
    process = subprocess.Popen([sys.executable, str(sample)], env=env, cwd=tmp_path)
    try:
        assert received.wait(30), "the sample never connected"
    finally:
        process.kill()
        process.wait(10)
    assert first_bytes == [b"\x16"]
