"""The WSGI middleware under gunicorn's sync worker (one worker, one request at a time): a client
that leaves a streamed answer must not hold the worker while the middleware drains the app.

After the client leaves, the middleware keeps pulling the app's body so the handler's work is
done and stored, but for at most ``DRAIN_SECONDS`` (and ``max_response_bytes``): then the
record completes without its body. An unrelated request waits no longer than that bound, and
the retry is answered from the record, never by a second run.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from idemkey import Policy
from idemkey.http import Exchange, Headers, Request, begin
from tests._servers import AppServer

pytestmark = pytest.mark.redis

# What the app below would take to finish its body (a trickle of rows), and what an unrelated
# request may wait at most: the drain bound (1 s), plus a loaded CI box's scheduling.
TRICKLE_SECONDS = 40.0
UNRELATED_DEADLINE = 10.0

APP = textwrap.dedent(
    f'''
    """A CSV export behind idemkey's WSGI middleware, for gunicorn's sync worker."""
    import os
    import time

    import redis

    from idemkey import Policy, RedisStore
    from idemkey.adapters.wsgi import IdempotencyMiddleware

    prefix = os.environ["IDEMKEY_TEST_PREFIX"]
    client = redis.Redis.from_url(os.environ["IDEMKEY_TEST_REDIS_URL"])


    def export(environ, start_response):
        if environ["PATH_INFO"] == "/health":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok"]
        client.incr(f"{{prefix}}:runs:{{environ['HTTP_IDEMPOTENCY_KEY']}}")
        start_response("201 Created", [("Content-Type", "text/csv")])

        def rows():
            yield b"id,amount\\n"
            for n in range({int(TRICKLE_SECONDS * 10)}):
                time.sleep(0.1)
                yield b"%d,10\\n" % n

        return rows()


    app = IdempotencyMiddleware(export, RedisStore(client, Policy(prefix=prefix)))
    '''
)


@pytest.fixture
def gunicorn(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[str]:
    """gunicorn, one sync worker, serving APP; yields its base URL."""
    (tmp_path / "idemkey_drain_app.py").write_text(APP)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)

    def command(port: int) -> list[str]:
        return [
            sys.executable, "-m", "gunicorn", "--worker-class", "sync", "--workers", "1",
            "--timeout", "60", "--bind", f"127.0.0.1:{port}", "--log-level", "warning",
            "idemkey_drain_app:app",
        ]  # fmt: skip

    with AppServer(
        command, log=tmp_path / "gunicorn.log", cwd=tmp_path, env={"PYTHONPATH": path},
        redis_url=redis_url, prefix=prefix, name="gunicorn",
    ) as server:  # fmt: skip
        yield server.url


def test_a_client_leaving_a_stream_does_not_hold_the_worker(
    gunicorn: str, redis_url: str, prefix: str
) -> None:
    host, port = gunicorn.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"POST /export HTTP/1.1\r\nHost: {host}\r\nIdempotency-Key: k1\r\n"
            "Content-Length: 0\r\n\r\n".encode()
        )
        received = b""
        while b"id,amount" not in received:
            chunk = sock.recv(4096)
            assert chunk, f"gunicorn closed before the first row: {received!r}"
            received += chunk
    left = time.monotonic()

    # The worker notices the client is gone at its next write, closes the middleware's
    # iterable, and drains for at most DRAIN_SECONDS: an unrelated request waits that long.
    health = httpx.get(f"{gunicorn}/health", timeout=TRICKLE_SECONDS * 2)
    waited = time.monotonic() - left
    assert health.status_code == 200
    assert waited < UNRELATED_DEADLINE, f"an unrelated request waited {waited:.1f} s"

    step = begin(
        Policy(prefix=prefix), Request("POST", "/export", "", Headers([("Idempotency-Key", "k1")]))
    )
    assert isinstance(step, Exchange)
    r = redis.Redis.from_url(redis_url)
    with contextlib.closing(r):
        assert r.hexists(step.record.key, "resp")  # complete
        retry = httpx.post(f"{gunicorn}/export", headers={"Idempotency-Key": "k1"}, timeout=10)
        assert r.get(f"{prefix}:runs:k1") == b"1"  # the handler ran once
    assert retry.status_code == 201
    assert retry.headers["idempotent-replayed"] == "true"
    assert retry.headers["idempotent-body-not-kept"] == "true"
    assert retry.headers["content-type"] == "text/csv"
