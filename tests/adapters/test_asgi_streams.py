"""The ASGI middleware under real servers (uvicorn, hypercorn, daphne, granian), real sockets: a
response that has started is never run twice, however it ends.

Once ``http.response.start`` has gone out with a status the policy stores, the key is never
released: a client that leaves a streamed answer, a client that times out during one, and an app
that raises after its response started all complete the record without its body, and the retry
gets the stored status and headers with ``Idempotent-Body-Not-Kept: true``. The handler counts
its runs in Redis (INCR), so the count is true across the server process.

Also the response head as the spec allows it (issue 10, case 8): headers given as a generator
reach the client and the record; header values the server refuses are not stored.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

import idemkey
from idemkey import Policy
from idemkey.http import Exchange, Headers, Request, begin
from tests._servers import AppServer, wait_until

pytestmark = pytest.mark.redis

STARTUP_DEADLINE = 30.0
SETTLE_DEADLINE = 20.0

APP = textwrap.dedent(
    '''
    """Starlette endpoints guarded by idemkey's ASGI middleware, each counting its runs."""
    import asyncio
    import os

    import redis.asyncio
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    from idemkey import AsyncRedisStore, Policy
    from idemkey.adapters.asgi import IdempotencyMiddleware

    prefix = os.environ["IDEMKEY_TEST_PREFIX"]
    client = redis.asyncio.Redis.from_url(os.environ["IDEMKEY_TEST_REDIS_URL"])


    async def count(request):
        key = request.headers["idempotency-key"]
        await client.incr(f"{prefix}:runs:{key}")  # the work: it must happen once


    async def health(request):
        return PlainTextResponse("ok")


    async def export(request):
        """Rows trickle out for a minute; clients leave (or time out) long before."""
        await count(request)

        async def rows():
            yield b"id,amount\\n"
            for n in range(60):
                await asyncio.sleep(1.0)  # longer than the timing-out client's read timeout
                yield b"%d,10\\n" % n

        return StreamingResponse(rows(), status_code=201, media_type="text/csv")


    async def broken(request):
        """The answer starts, then the app fails half-way through its body."""
        await count(request)

        async def rows():
            yield b"id,amount\\n"
            await asyncio.sleep(0.05)
            raise RuntimeError("the export broke after its first row")

        return StreamingResponse(rows(), status_code=201, media_type="text/csv")


    async def generated_head(scope, receive, send):
        """Raw ASGI: response headers as a generator, which the spec allows."""
        await receive()
        await client.incr(f"{prefix}:runs:generated")
        pairs = [(b"content-type", b"application/json"), (b"x-charge-id", b"ch_1")]
        head = {"type": "http.response.start", "status": 201, "headers": (p for p in pairs)}
        await send(head)
        await send({"type": "http.response.body", "body": b'{"id": "ch_1"}'})


    async def text_head(scope, receive, send):
        """Raw ASGI: header values as str, which the spec does not allow."""
        await receive()
        key = scope["path"].strip("/")
        await client.incr(f"{prefix}:runs:{key}")
        note = "caf\\xe9" if key == "latin" else "ok"
        headers = [(b"content-type", "text/plain"), (b"x-note", note)]
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})


    class Raw:
        """A raw ASGI endpoint (Starlette calls a plain function with a Request)."""

        def __init__(self, endpoint):
            self.endpoint = endpoint

        async def __call__(self, scope, receive, send):
            await self.endpoint(scope, receive, send)


    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/export", export, methods=["POST"]),
            Route("/broken", broken, methods=["POST"]),
            Route("/generated", Raw(generated_head), methods=["POST"]),
            Route("/ascii", Raw(text_head), methods=["POST"]),
            Route("/latin", Raw(text_head), methods=["POST"]),
        ]
    )
    app.add_middleware(IdempotencyMiddleware, store=AsyncRedisStore(client, Policy(prefix=prefix)))
    '''
)


def _command(server: str, port: int, app_dir: Path) -> list[str]:
    if server == "uvicorn":
        return [
            sys.executable, "-m", "uvicorn", "idemkey_stream_app:app", "--app-dir", str(app_dir),
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
        ]  # fmt: skip
    if server == "daphne":
        return [
            sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
            "idemkey_stream_app:app",
        ]  # fmt: skip
    if server == "granian":
        return [
            sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1",
            "--port", str(port), "--workers", "1", "--log-level", "warning",
            "idemkey_stream_app:app",
        ]  # fmt: skip
    return [
        sys.executable, "-m", "hypercorn", "idemkey_stream_app:app",
        "--bind", f"127.0.0.1:{port}", "--log-level", "warning",
    ]  # fmt: skip


@dataclass(frozen=True)
class Served:
    name: str
    base: str
    log: Path


@pytest.fixture(params=["uvicorn", "hypercorn", "daphne", "granian"])
def served(
    request: pytest.FixtureRequest, tmp_path: Path, redis_url: str, prefix: str
) -> Iterator[Served]:
    """The app above under a real server on a free port."""
    (tmp_path / "idemkey_stream_app.py").write_text(APP)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    log_path = tmp_path / "server.log"
    with AppServer(
        lambda port: _command(request.param, port, tmp_path), log=log_path, cwd=tmp_path,
        redis_url=redis_url, prefix=prefix, env={"PYTHONPATH": path}, name=request.param,
        timeout=STARTUP_DEADLINE,
    ) as server:  # fmt: skip
        yield Served(request.param, server.url, log_path)


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    with contextlib.closing(client):
        yield client


def record_key(prefix: str, path: str, key: str) -> str:
    step = begin(
        Policy(prefix=prefix), Request("POST", path, "", Headers([("Idempotency-Key", key)]))
    )
    assert isinstance(step, Exchange)
    return step.record.key


def settled(r: redis.Redis, prefix: str, path: str, key: str) -> bool:
    """The first request's record is no longer in progress (completed, or released)."""
    return r.hget(record_key(prefix, path, key), "state") != b"in_progress"


def _first_row(base: str, path: str, key: str) -> socket.socket:
    """A raw client: send the request and read until the answer's first row."""
    host, port = base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nIdempotency-Key: {key}\r\n"
        "Content-Length: 0\r\n\r\n".encode()
    )
    received = b""
    while b"id,amount" not in received:
        chunk = sock.recv(4096)
        assert chunk, f"the server closed before the first row: {received!r}"
        received += chunk
    assert received.startswith(b"HTTP/1.1 201")
    return sock


def leave_after_first_bytes(base: str, path: str, key: str) -> None:
    """The client reads the first row and hangs up."""
    _first_row(base, path, key).close()


def time_out_after_first_bytes(base: str, path: str, key: str) -> None:
    """The client reads with a short timeout (0.3 s, rows come every second), gives up when
    it fires, and hangs up, as an HTTP client's read timeout does."""
    with contextlib.closing(_first_row(base, path, key)) as sock:
        sock.settimeout(0.3)
        for _ in range(100):  # a late scheduler may deliver a row or two first
            try:
                assert sock.recv(4096), "the server ended the stream"
            except TimeoutError:
                return
        raise AssertionError("the stream never stalled for 0.3 s")


def read_until_broken(base: str, path: str, key: str) -> None:
    """The app fails mid-body: the server cuts the connection, the client sees it broken."""
    with (
        httpx.Client(base_url=base, timeout=10.0) as client,
        client.stream("POST", path, headers={"Idempotency-Key": key}) as answer,
    ):
        assert answer.status_code == 201
        with pytest.raises(httpx.HTTPError):
            for _ in answer.iter_raw():
                pass


def runs(r: redis.Redis, prefix: str, key: str) -> int:
    return int(r.get(f"{prefix}:runs:{key}") or 0)


@pytest.mark.parametrize(
    ("path", "first_request"),
    [
        ("/export", leave_after_first_bytes),
        ("/export", time_out_after_first_bytes),
        ("/broken", read_until_broken),
    ],
    ids=["client-leaves", "client-times-out", "app-raises"],
)
def test_a_started_response_is_never_run_again(
    served: Served, r: redis.Redis, prefix: str, path: str, first_request: object
) -> None:
    server = served.base
    key = f"k-{path.strip('/')}-{getattr(first_request, '__name__', '')}"
    first_request(server, path, key)  # type: ignore[operator]
    wait_until(
        lambda: settled(r, prefix, path, key), SETTLE_DEADLINE, "the first request to settle"
    )

    with httpx.Client(base_url=server, timeout=10.0) as client:
        retry = client.post(path, headers={"Idempotency-Key": key})

    assert runs(r, prefix, key) == 1  # the handler did not run again
    assert retry.status_code == 201
    assert retry.headers["idempotent-replayed"] == "true"
    assert retry.headers["idempotent-body-not-kept"] == "true"
    assert retry.headers["content-type"].startswith("text/csv")
    assert retry.content == b""


def test_headers_given_as_a_generator_reach_the_client_and_the_record(
    served: Served, r: redis.Redis, prefix: str
) -> None:
    with httpx.Client(base_url=served.base, timeout=10.0) as client:
        first = client.post("/generated", headers={"Idempotency-Key": "generated"})
        again = client.post("/generated", headers={"Idempotency-Key": "generated"})

    assert first.status_code == 201
    assert first.headers["x-charge-id"] == "ch_1"  # not consumed before the server saw them
    assert first.headers["content-type"] == "application/json"
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["x-charge-id"] == "ch_1"
    assert (again.status_code, again.content) == (201, first.content)
    assert runs(r, prefix, "generated") == 1


#: Where idemkey's own modules live: a frame there is idemkey's (a path that merely contains
#: "idemkey", such as a virtual environment named after the project, is not).
IDEMKEY_PACKAGE = str(Path(idemkey.__file__).resolve().parent) + "/"


def raised_in(log: Path) -> str:
    """The file of the innermost frame of the last traceback the server logged (waited for:
    a server may write it after the client already has its answer)."""

    def frames() -> list[str]:
        return [line for line in log.read_text().splitlines() if line.startswith('  File "')]

    wait_until(lambda: bool(frames()), 10, f"a traceback in {log}")
    return frames()[-1]


@pytest.mark.parametrize("value", ["ascii", "latin"])
def test_str_header_values_are_passed_to_the_server_as_the_app_sent_them(
    served: Served, r: redis.Redis, prefix: str, value: str
) -> None:
    """The spec wants bytes; idemkey neither fixes nor rejects the app's message, it forwards it
    so the server does what it does without idemkey. uvicorn (h11) sends ASCII text, so that
    answer reached the client and is stored like any other; hypercorn, granian and daphne refuse
    text, and h11 refuses non-ASCII text: the client got a server error and nothing is stored
    (the key is free for the fixed app). Never an error raised inside idemkey."""
    path = f"/{value}"
    with httpx.Client(base_url=served.base, timeout=10.0) as client:
        try:
            first = client.post(path, headers={"Idempotency-Key": value})
        except httpx.RemoteProtocolError:  # uvicorn drops a connection it cannot answer on
            first = None
        wait_until(lambda: settled(r, prefix, path, value), SETTLE_DEADLINE, "the first request")
        sent = served.name == "uvicorn" and value == "ascii"
        if sent:
            assert first is not None
            assert (first.status_code, first.headers["x-note"]) == (201, "ok")
            again = client.post(path, headers={"Idempotency-Key": value})
            assert again.headers["idempotent-replayed"] == "true"
            assert (again.status_code, again.headers["x-note"]) == (201, "ok")
        elif served.name == "daphne":  # refuses text with its own 500 page, no traceback
            assert first is not None
            assert first.status_code == 500
            assert b"Daphne" in first.content, first.content
            assert "Traceback" not in served.log.read_text()  # nothing raised in the app
        else:
            assert first is None or first.status_code == 500
            assert IDEMKEY_PACKAGE not in raised_in(served.log)  # the server's own refusal
            assert r.hget(record_key(prefix, path, value), "state") is None  # released
    assert runs(r, prefix, value) == 1
