"""The test infrastructure itself: servers start, die, pause and recover; fakeredis runs Lua.

Kept fast (well under 5 s): every wait is a condition with a deadline.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import fakeredis
import pytest
import redis
import redis.asyncio

from tests._servers import (
    RedisServer,
    RedisServerError,
    async_wait_until,
    free_port,
    no_retry,
    wait_until,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


def test_wait_until_returns_the_truthy_value() -> None:
    calls = iter([0, None, "", "done"])
    assert wait_until(lambda: next(calls), timeout=1, message="the fourth call") == "done"


def test_wait_until_fails_clearly_and_chains_the_last_ignored_error() -> None:
    def flaky() -> bool:
        raise ConnectionError("not yet")

    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"timed out after 0\.05s waiting for the moon") as exc:
        wait_until(flaky, timeout=0.05, message="the moon", ignore=(ConnectionError,))
    assert time.monotonic() - started < 1
    assert isinstance(exc.value.__cause__, ConnectionError)


def test_wait_until_does_not_swallow_unexpected_errors() -> None:
    def broken() -> bool:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        wait_until(broken, timeout=1, ignore=(ConnectionError,))


async def test_async_wait_until_accepts_coroutine_predicates() -> None:
    state = {"n": 0}

    async def third_time_lucky() -> int:
        state["n"] += 1
        return state["n"] if state["n"] >= 3 else 0

    assert await async_wait_until(third_time_lucky, timeout=1, message="three calls") == 3


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert 1024 <= port <= 65535


def test_session_server_answers(real_client: redis.Redis, prefix: str) -> None:
    assert real_client.ping() is True
    real_client.set(f"{prefix}:k", b"v", px=10_000)
    assert real_client.get(f"{prefix}:k") == b"v"


async def test_session_server_answers_async(
    real_async_client: redis.asyncio.Redis, prefix: str
) -> None:
    assert await real_async_client.ping() is True
    await real_async_client.set(f"{prefix}:k", b"v", px=10_000)
    assert await real_async_client.get(f"{prefix}:k") == b"v"


def test_extra_config_args_are_applied(redis_server_factory: Callable[..., RedisServer]) -> None:
    server = redis_server_factory(["--maxmemory-policy", "allkeys-lru"])
    client = server.client()
    try:
        # redis-py decodes CONFIG GET replies even with decode_responses=False.
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "allkeys-lru"}
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}
    finally:
        client.close()


def test_kill_then_restart_on_the_same_port(private_redis_server: RedisServer) -> None:
    server = private_redis_server
    port = server.port
    client = server.client(socket_connect_timeout=0.5, socket_timeout=0.5, retry=no_retry())
    try:
        client.set("k", b"v")
        server.kill()
        assert not server.running
        with pytest.raises(redis.ConnectionError):
            client.ping()
        server.restart()
        assert server.port == port
        # The pool reconnects; the data is gone (nothing is kept on disk).
        wait_until(
            client.ping, timeout=5, message="PING after restart", ignore=(redis.ConnectionError,)
        )
        assert client.get("k") is None
    finally:
        client.close()


def test_pause_times_out_and_resume_recovers(private_redis_server: RedisServer) -> None:
    server = private_redis_server
    # No retries: redis-py 8 retries a timed-out command 10 times by default (about 6 s here).
    client = server.client(socket_connect_timeout=0.5, socket_timeout=0.2, retry=no_retry())
    try:
        assert client.ping()
        server.pause()
        assert server.paused
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            client.ping()
        assert time.monotonic() - started < 2
        server.resume()
        assert not server.paused
        assert wait_until(
            client.ping, timeout=5, message="PING after resume", ignore=(redis.TimeoutError,)
        )
    finally:
        client.close()


def test_stop_on_a_paused_server_still_ends_it(private_redis_server: RedisServer) -> None:
    server = private_redis_server
    server.pause()
    server.stop(timeout=2)
    assert not server.running


def test_start_failure_is_reported_with_the_log(redis_server_bin: str) -> None:
    server = RedisServer(["--no-such-option", "x"], executable=redis_server_bin)
    try:
        with pytest.raises(RedisServerError, match=r"(?s)exited with code .*no-such-option"):
            server.start()
        assert not server.running
    finally:
        server.close()


def test_fakeredis_runs_lua() -> None:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    try:
        assert client.eval("return 1", 0) == 1
    finally:
        client.close()


SCRIPT = """
redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
return redis.call('GET', KEYS[1])
"""


def test_sync_client_runs_lua(sync_client: redis.Redis, prefix: str) -> None:
    assert sync_client.eval("return 1", 0) == 1
    script = sync_client.register_script(SCRIPT)
    assert script(keys=[f"{prefix}:k"], args=[b"v", 10_000]) == b"v"
    assert 0 < sync_client.pttl(f"{prefix}:k") <= 10_000


async def test_async_client_runs_lua(async_client: redis.asyncio.Redis, prefix: str) -> None:
    assert await async_client.eval("return 1", 0) == 1
    script = async_client.register_script(SCRIPT)
    assert await script(keys=[f"{prefix}:k"], args=[b"v", 10_000]) == b"v"
    assert 0 < await async_client.pttl(f"{prefix}:k") <= 10_000


def test_an_app_server_whose_port_was_taken_starts_on_another(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """free_port() releases its port before the server binds it: when another process took it
    meanwhile (another suite's server on a busy box), the server starts on a fresh port."""
    import socket
    import sys

    import tests._servers as servers

    holder = socket.create_server(("127.0.0.1", 0))  # the other process, in the port first
    ports = iter([holder.getsockname()[1], servers.free_port()])
    monkeypatch.setattr(servers, "free_port", lambda: next(ports))
    command = lambda port: [sys.executable, "-m", "http.server", "-b", "127.0.0.1", str(port)]  # noqa: E731
    with holder, servers.AppServer(command, log=tmp_path / "log", cwd=tmp_path, health="/") as app:
        assert app.port != holder.getsockname()[1]
        assert app.proc.poll() is None


# The server waits for the gate file (created once the port's other holder has answered), so
# that its start fails only after AppServer was answered by that other process.
GATED_SERVER = """
import pathlib, runpy, sys, time
gate, port = pathlib.Path(sys.argv[1]), sys.argv[2]
deadline = time.monotonic() + 30
while not gate.exists() and time.monotonic() < deadline:
    time.sleep(0.01)
sys.argv = ["http.server", "-b", "127.0.0.1", port]
runpy.run_module("http.server", run_name="__main__")
"""


def test_an_app_server_is_not_ready_on_another_process_answering_its_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The process that took the port may answer the health check while the server is still
    starting (and about to fail on the port): its answer does not make the server ready."""
    import http.server
    import sys
    import threading

    import tests._servers as servers

    gate = tmp_path / "answered"

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            gate.touch()
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    held = other.server_address[1]
    ports = iter([held, servers.free_port()])
    monkeypatch.setattr(servers, "free_port", lambda: next(ports))
    command = lambda port: [sys.executable, "-c", GATED_SERVER, str(gate), str(port)]  # noqa: E731
    try:
        with servers.AppServer(command, log=tmp_path / "log", cwd=tmp_path, health="/") as app:
            assert gate.exists()  # the other process was asked, and answered
            assert app.port != held
            assert app.proc.poll() is None
    finally:
        other.shutdown()
        other.server_close()


def test_a_redis_server_whose_port_was_taken_starts_on_another(
    monkeypatch: pytest.MonkeyPatch, redis_server_bin: str
) -> None:
    """What tests/contrib/test_celery.py's records server relies on: its port is RedisServer's
    own pick (not given), so a taken one is retried; a restart keeps the port it got."""
    import socket

    import tests._servers as servers

    holder = socket.create_server(("127.0.0.1", 0))
    ports = iter([holder.getsockname()[1], servers.free_port()])
    monkeypatch.setattr(servers, "free_port", lambda: next(ports))
    with holder, RedisServer(executable=redis_server_bin) as server:
        port = server.port
        assert port != holder.getsockname()[1]
        server.stop()
        server.restart()
        assert server.port == port
        client = server.client()
        try:
            assert client.ping()
        finally:
            client.close()


def test_a_redis_server_is_not_ready_on_another_redis_server_holding_its_port(
    monkeypatch: pytest.MonkeyPatch, redis_server_bin: str
) -> None:
    """Another redis-server on the port answers PING while ours is still starting (and about to
    fail on the port): that answer does not make ours ready, ours starts on another port, and
    nothing meant for ours reaches the other."""
    import tests._servers as servers

    real_free_port = servers.free_port
    with RedisServer(executable=redis_server_bin) as other:
        ports = iter([other.port])
        monkeypatch.setattr(servers, "free_port", lambda: next(ports, None) or real_free_port())
        with RedisServer(executable=redis_server_bin) as mine:
            assert mine.port != other.port
            with mine.client(retry=no_retry()) as client:
                assert client.set("written-to-mine", b"1")
            assert mine.running
        with other.client(retry=no_retry()) as client:
            assert client.dbsize() == 0
        assert other.running
