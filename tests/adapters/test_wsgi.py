"""The WSGI middleware's byte moving, beyond the shared suite: PEP 3333 details a server relies on.

These drive ``IdempotencyMiddleware`` directly, playing the server by hand, so they can stop
iterating early, watch when chunks arrive, and check that ``close()`` is always called.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

import pytest

from idemkey import Policy, RedisStore
from idemkey.adapters.wsgi import IdempotencyMiddleware
from tests.adapters.harness import store_on
from tests.adapters.harness_wsgi import environ_for

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from idemkey import Event


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis), "fakeredis"])
def backend(request: pytest.FixtureRequest) -> str:
    """Tests taking ``store`` run on the real Redis, then on fakeredis[lua]."""
    name: str = request.param
    return name


KEY = ("Idempotency-Key", "k")


@pytest.fixture
def store(backend: str, request: pytest.FixtureRequest, prefix: str) -> Iterator[RedisStore]:
    url = request.getfixturevalue("redis_url") if backend == "redis" else None
    policy = Policy(prefix=prefix, max_request_bytes=64, max_response_bytes=64, lease=2, ttl=60)
    with store_on(url, policy) as store:
        yield store


class Server:
    """Plays the server: start_response, write(), and the body as the server pulls it."""

    def __init__(self) -> None:
        self.status = ""
        self.headers: list[tuple[str, str]] = []
        self.written: list[bytes] = []

    def start_response(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None):  # type: ignore[no-untyped-def]
        self.status, self.headers = status, headers
        return self.written.append

    def call(self, app: Any, *, body: bytes = b"", headers: Any = (KEY,)) -> bytes:
        result = app(environ_for("POST", "/things", headers, body), self.start_response)
        try:
            body = list(result)
            return b"".join([*self.written, *body])
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()


class Recorder:
    """A WSGI app whose body is a generator it controls; records close() and runs."""

    def __init__(self, chunks: Iterable[bytes], length: int | None = None) -> None:
        self.chunks = chunks
        self.length = length
        self.runs = 0
        self.closed = 0
        self.pulled = 0
        self.body = b""

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Any:
        self.runs += 1
        self.body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        headers = [("Content-Type", "text/plain")]
        if self.length is not None:
            headers.append(("Content-Length", str(self.length)))
        start_response("200 OK", headers)
        return _Closing(self)


class _Closing:
    def __init__(self, app: Recorder) -> None:
        self.app = app
        self.it = iter(app.chunks)

    def __iter__(self) -> _Closing:
        return self

    def __next__(self) -> bytes:
        chunk = next(self.it)
        self.app.pulled += 1
        return chunk

    def close(self) -> None:
        self.app.closed += 1


def test_body_chunks_are_forwarded_as_the_app_yields_them(store: RedisStore) -> None:
    produced_second = threading.Event()
    may_continue = threading.Event()

    def chunks() -> Iterator[bytes]:
        yield b"first "
        assert may_continue.wait(10)
        produced_second.set()
        yield b"second"

    app = Recorder(chunks(), length=12)
    server = Server()
    result = IdempotencyMiddleware(app, store)(
        environ_for("POST", "/things", [KEY]), server.start_response
    )
    iterator = iter(result)
    # The first chunk reaches the server while the app has not produced the second one yet.
    assert next(iterator) == b"first "
    assert not produced_second.is_set()
    may_continue.set()
    assert list(iterator) == [b"second"]
    result.close()  # type: ignore[attr-defined]
    assert app.closed == 1
    assert Server().call(IdempotencyMiddleware(app, store)) == b"first second"  # a replay
    assert app.runs == 1


def test_request_body_is_read_once_and_resupplied(store: RedisStore) -> None:
    app = Recorder([b"ok"], length=2)
    Server().call(IdempotencyMiddleware(app, store), body=b"payload")
    assert app.body == b"payload"


def test_early_close_drains_the_app_completes_and_closes(store: RedisStore) -> None:
    app = Recorder([b"a" * 10, b"b" * 10, b"c" * 10], length=30)
    server = Server()
    result = IdempotencyMiddleware(app, store)(
        environ_for("POST", "/things", [KEY]), server.start_response
    )
    assert next(iter(result)) == b"a" * 10
    result.close()  # type: ignore[attr-defined]  # the client went away
    assert app.pulled == 3
    assert app.closed == 1
    replay = Server()
    assert replay.call(IdempotencyMiddleware(app, store)) == b"a" * 10 + b"b" * 10 + b"c" * 10
    assert ("Idempotent-Replayed", "true") in replay.headers
    assert app.runs == 1


def test_early_close_of_an_endless_body_stops_past_the_limit(store: RedisStore) -> None:
    def endless() -> Iterator[bytes]:
        while True:
            yield b"x" * 16

    app = Recorder(endless())
    result = IdempotencyMiddleware(app, store)(
        environ_for("POST", "/things", [KEY]), Server().start_response
    )
    next(iter(result))
    result.close()  # type: ignore[attr-defined]
    assert app.pulled <= 64 // 16 + 1  # drained only until the copy went over the limit
    assert app.closed == 1
    replay = Server()
    assert replay.call(IdempotencyMiddleware(app, store)) == b""
    assert ("Idempotent-Body-Not-Kept", "true") in replay.headers
    assert app.runs == 1


def test_exception_at_call_releases_and_propagates(store: RedisStore) -> None:
    runs = []

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        runs.append(1)
        raise ValueError("boom")

    middleware = IdempotencyMiddleware(app, store)
    for _ in range(2):
        with pytest.raises(ValueError, match="boom"):
            Server().call(middleware)
    assert len(runs) == 2  # released: the retry ran again


def test_exception_after_the_first_body_byte_completes_without_the_body(
    store: RedisStore,
) -> None:
    """The client has the status and part of the body: the work is done, so a retry gets the
    stored head (the ASGI rule too), never a second run."""

    def chunks() -> Iterator[bytes]:
        yield b"partial"
        raise ValueError("mid-body")

    app = Recorder(chunks())
    with pytest.raises(ValueError, match="mid-body"):
        Server().call(IdempotencyMiddleware(app, store))
    assert app.closed == 1
    app.chunks = [b"whole"]
    retry = Server()
    assert retry.call(IdempotencyMiddleware(app, store)) == b""
    assert retry.status.startswith("200")
    assert ("Idempotent-Body-Not-Kept", "true") in retry.headers
    assert app.runs == 1


def test_exception_before_the_first_body_byte_releases_propagates_and_closes(
    store: RedisStore,
) -> None:
    def chunks() -> Iterator[bytes]:
        yield b""  # nothing reached the client yet: the app may still replace its status
        raise ValueError("before the body")

    app = Recorder(chunks())
    with pytest.raises(ValueError, match="before the body"):
        Server().call(IdempotencyMiddleware(app, store))
    assert app.closed == 1
    app.chunks = [b"whole"]
    assert Server().call(IdempotencyMiddleware(app, store)) == b"whole"
    assert app.runs == 2


def test_legacy_write_callable_is_kept_and_replayed(store: RedisStore) -> None:
    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        write = start_response("201 Created", [("Content-Length", "9")])
        write(b"via-write")
        return []

    first = Server()
    assert first.call(IdempotencyMiddleware(app, store)) == b"via-write"
    replay = Server()
    assert replay.call(IdempotencyMiddleware(app, store)) == b"via-write"
    assert ("Idempotent-Replayed", "true") in replay.headers


def test_start_response_called_lazily_inside_the_iterable(store: RedisStore) -> None:
    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterator[bytes]:
        start_response("201 Created", [("Content-Length", "4")])
        yield b"lazy"

    assert Server().call(IdempotencyMiddleware(app, store)) == b"lazy"
    replay = Server()
    assert replay.call(IdempotencyMiddleware(app, store)) == b"lazy"
    assert replay.status.startswith("201")


def test_pass_through_leaves_the_environ_alone(store: RedisStore) -> None:
    seen: list[Any] = []

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        seen.append(environ["wsgi.input"])
        start_response("200 OK", [])
        return [b""]

    environ = environ_for("GET", "/things", [KEY])
    original = environ["wsgi.input"]
    IdempotencyMiddleware(app, store)(environ, Server().start_response)
    assert seen == [original]


def test_complete_failure_is_reported_and_the_client_still_answered(store: RedisStore) -> None:
    events: list[Event] = []
    policy = store.policy.replace(on_event=events.append)
    app = Recorder([b"done"], length=4)
    middleware = IdempotencyMiddleware(app, store, policy)
    server = Server()
    result = middleware(environ_for("POST", "/things", [KEY]), server.start_response)
    broken = store.complete

    def failing(*args: Any, **kwargs: Any) -> bool:
        from idemkey import StoreError

        raise StoreError("Redis went away")

    store.complete = failing  # type: ignore[method-assign]
    try:
        assert b"".join(result) == b"done"
    finally:
        store.complete = broken  # type: ignore[method-assign]
        result.close()  # type: ignore[attr-defined]
    assert [e.kind for e in events if e.kind == "store_error"] == ["store_error"]


def test_importing_the_wsgi_adapter_does_not_import_flask() -> None:
    code = (
        "import sys, idemkey.adapters.wsgi, idemkey.adapters\n"
        "assert 'flask' not in sys.modules, 'flask imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_body_shorter_than_content_length_is_400_and_never_runs(store: RedisStore) -> None:
    app = Recorder([b"ok"], length=2)
    environ = environ_for("POST", "/things", [KEY], b"12345")
    environ["CONTENT_LENGTH"] = "10"  # the client went away after 5 bytes
    environ["wsgi.input"] = io.BytesIO(b"12345")
    server = Server()
    body = b"".join(IdempotencyMiddleware(app, store)(environ, server.start_response))
    assert server.status.startswith("400")
    assert json.loads(body)["code"] == "incomplete_body"
    assert app.runs == 0


def test_environ_headers_read_the_environ_like_headers() -> None:
    from idemkey.adapters.wsgi import EnvironHeaders

    environ = {
        "HTTP_IDEMPOTENCY_KEY": "k1",
        "HTTP_X_EMPTY": "",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": "",
        "REQUEST_METHOD": "POST",
    }
    headers = EnvironHeaders(environ)
    assert headers.get("idempotency-key") == headers["Idempotency-Key"] == "k1"
    assert headers.get_all("IDEMPOTENCY-KEY") == ["k1"]
    assert headers.get_all("X-Empty") == [""]  # sent empty: present
    assert headers.get("content-type") == "application/json"
    assert headers.get("content-length") is None  # the server's "" means absent
    assert "authorization" not in headers
    assert headers.get("authorization", "none") == "none"
    assert sorted(headers) == ["content-type", "idempotency-key", "x-empty"]
    assert len(headers) == 3


def test_the_exchange_leaves_the_environ_when_the_request_ends(store: RedisStore) -> None:
    # environ -> exchange -> request headers -> environ is a cycle: left in place, every
    # guarded request's environ (and its body) would wait for the cyclic garbage collector.
    seen: list[object] = []

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        seen.append(environ["idemkey.exchange"].claim.fence)
        start_response("201 Created", [("Content-Length", "2")])
        return [b"ok"]

    environ = environ_for("POST", "/things", (KEY,), b"")
    result = IdempotencyMiddleware(app, store)(environ, Server().start_response)
    assert list(result) == [b"ok"]
    result.close()  # type: ignore[attr-defined]
    assert seen == [seen[0]]
    assert isinstance(seen[0], int)
    assert "idemkey.exchange" not in environ


class Refused(Exception):
    """What a server raises for a block that is not bytes (werkzeug asserts, gunicorn raises
    TypeError), before it closes the iterable."""


@pytest.mark.parametrize("length", [None, 1], ids=["no-length", "content-length"])
def test_a_str_block_completes_without_its_body_and_never_holds_the_key(
    store: RedisStore, length: int | None
) -> None:
    # ["x"] instead of [b"x"]: the server refuses the block. The work is done, so the record
    # completes without the body; it is never left in progress, renewed, every retry a 409.
    app = Recorder(["x"], length=length)  # type: ignore[list-item]
    result = IdempotencyMiddleware(app, store)(
        environ_for("POST", "/things", [KEY]), Server().start_response
    )

    def serve() -> None:
        try:
            for block in result:
                if not isinstance(block, bytes):
                    raise Refused(block)
        finally:
            result.close()  # type: ignore[attr-defined]

    with pytest.raises(Refused):
        serve()
    assert app.closed == 1
    retry = Server()
    body = retry.call(IdempotencyMiddleware(app, store))
    assert (retry.status[:3], body) == ("200", b"")  # not 409 in_flight
    assert ("Idempotent-Body-Not-Kept", "true") in retry.headers
    assert app.runs == 1


@pytest.mark.parametrize("length", [None, 2], ids=["no-length", "content-length"])
def test_a_settle_step_that_raises_still_settles_the_record(
    store: RedisStore, length: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from idemkey.http import BodyCopy

    def broken(self: BodyCopy) -> bytes:
        raise RuntimeError("no body to store")

    app = Recorder([b"ok"], length=length)
    monkeypatch.setattr(BodyCopy, "body", broken)
    with pytest.raises(RuntimeError, match="no body to store"):
        Server().call(IdempotencyMiddleware(app, store))
    monkeypatch.undo()
    retry = Server()
    body = retry.call(IdempotencyMiddleware(app, store))
    assert (retry.status[:3], body) == ("200", b"")  # complete without the body, not 409
    assert ("Idempotent-Body-Not-Kept", "true") in retry.headers
    assert app.runs == 1


def test_headers_given_as_a_generator_are_stored_as_sent(store: RedisStore) -> None:
    # PEP 3333 asks for a list, gunicorn takes any iterable: the server reads it once.
    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        lines = [("Content-Type", "application/json"), ("Location", "/things/1")]
        start_response("201 Created", (line for line in lines))  # type: ignore[arg-type]
        return [b"{}"]

    first = Server()
    assert first.call(IdempotencyMiddleware(app, store)) == b"{}"
    sent = list(first.headers)
    assert ("Location", "/things/1") in sent
    replay = Server()
    assert replay.call(IdempotencyMiddleware(app, store)) == b"{}"
    assert replay.headers == [*sent, ("Idempotent-Replayed", "true")]


def test_an_int_content_length_reads_as_its_digits(store: RedisStore) -> None:
    # werkzeug's server sends ("Content-Length", 2) as "Content-Length: 2".
    runs: list[int] = []

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        runs.append(1)
        start_response("201 Created", [("Content-Length", 2)])  # type: ignore[list-item]
        return [b"ok"]

    assert Server().call(IdempotencyMiddleware(app, store)) == b"ok"
    replay = Server()
    assert replay.call(IdempotencyMiddleware(app, store)) == b"ok"
    assert replay.headers == [("Content-Length", "2"), ("Idempotent-Replayed", "true")]
    assert runs == [1]


def test_a_content_length_that_is_no_text_is_read_as_a_server_sends_it() -> None:
    from idemkey.http import BodyCopy

    for value, declared in [(7, 7), (-1, None), (True, None), (b"7", None), (7.0, None)]:
        copy = BodyCopy(64)
        assert copy.start([("Content-Length", value)]) == value  # type: ignore[list-item]
        assert copy.declared == declared, value
