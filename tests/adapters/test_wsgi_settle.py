"""When the WSGI middleware settles a record (issue 35): as soon as the response is wholly in hand.

A PEP 3333 server may send a block before it asks the app's iterable for the next, so the block
that reaches the declared ``Content-Length`` completes the record before it is handed over: a
retry sent the moment the client read it is a replay. A response with no length completes when
the iterable is exhausted (its end reaches the client only after that). Here the test plays the
server and stops between blocks; tests/adapters/test_immediate_retry.py races real servers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from idemkey.adapters.wsgi import IdempotencyMiddleware
from tests.adapters.harness_wsgi import environ_for
from tests.adapters.test_wsgi import KEY, Recorder, Server, backend, store

if TYPE_CHECKING:
    from collections.abc import Iterator

    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from idemkey import RedisStore

__all__ = ["backend", "store"]  # the fixtures, imported


def retry(app: IdempotencyMiddleware) -> tuple[str, dict[str, str], bytes]:
    server = Server()
    body = server.call(app)
    return server.status, dict(server.headers), body


def test_the_block_reaching_the_content_length_completes_before_it_is_handed_over(
    store: RedisStore,
) -> None:
    app = IdempotencyMiddleware(Recorder([b"first ", b"second"], length=12), store)
    first = Stepper(app)
    assert first.next() == b"first "
    status, _, _ = retry(app)
    assert status.startswith("409")  # the answer is not all out yet: still in progress
    assert first.next() == b"second"  # the last block, the server has not asked for more
    status, headers, body = retry(app)
    assert (status[:3], headers.get("Idempotent-Replayed"), body) == (
        "200",
        "true",
        b"first second",
    )
    first.finish()


def test_a_write_reaching_the_content_length_completes_before_it_is_sent(
    store: RedisStore,
) -> None:
    seen: list[str] = []

    def legacy(environ: WSGIEnvironment, start_response: StartResponse) -> Any:
        write = start_response("201 Created", [("Content-Length", "5")])
        write(b"hello")
        seen.append(retry(middleware)[0])  # the app is still running; the client has it all
        return []

    middleware = IdempotencyMiddleware(legacy, store)
    assert Server().call(middleware) == b"hello"
    assert seen == ["201 Created"]


def test_a_response_without_a_length_completes_when_the_iterable_is_exhausted(
    store: RedisStore,
) -> None:
    """Streamed (two non-empty blocks, no length): its end is the server's last chunk, sent after
    the iterable ran out, so the record stays in progress until then and keeps no body."""
    app = IdempotencyMiddleware(Recorder([b"a", b"b"]), store)
    first = Stepper(app)
    assert (first.next(), first.next()) == (b"a", b"b")
    assert retry(app)[0].startswith("409")
    first.finish()
    status, headers, body = retry(app)
    assert (status[:3], headers.get("Idempotent-Body-Not-Kept"), body) == ("200", "true", b"")


def test_an_oversized_sized_response_completes_without_its_body_at_its_last_block(
    store: RedisStore,
) -> None:
    """Over max_response_bytes (64 here): the copy is dropped, and the record still completes at
    the last block, before it goes out."""
    app = IdempotencyMiddleware(Recorder([b"x" * 50, b"y" * 50], length=100), store)
    first = Stepper(app)
    first.next()
    first.next()
    status, headers, body = retry(app)
    assert (status[:3], headers.get("Idempotent-Body-Not-Kept"), body) == ("200", "true", b"")
    first.finish()


class Stepper:
    """Plays the server one block at a time: ``next()`` asks for a block, ``finish()`` asks
    until the iterable is exhausted and closes it."""

    def __init__(self, app: IdempotencyMiddleware) -> None:
        self.server = Server()
        self.result = app(environ_for("POST", "/things", [KEY], b""), self.server.start_response)
        self.blocks: Iterator[bytes] = iter(self.result)

    def next(self) -> bytes:
        return next(self.blocks)

    def finish(self) -> None:
        with pytest.raises(StopIteration):
            next(self.blocks)
        self.result.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("status", "headers"),
    [("204 No Content", []), ("201 Created", [("Content-Length", "0")])],
    ids=["204", "length-0"],
)
def test_a_head_that_ends_the_response_completes_before_the_server_gets_it(
    store: RedisStore, status: str, headers: list[tuple[str, str]]
) -> None:
    """granian sends such a head before it pulls the empty body: the record is complete once the
    middleware returns, and the app's iterable still reaches the server and is closed."""
    closed: list[bool] = []

    def empty() -> Iterator[bytes]:
        try:
            yield b""
        finally:
            closed.append(True)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Any:
        start_response(status, list(headers))
        return empty()

    middleware = IdempotencyMiddleware(app, store)
    first = Stepper(middleware)  # the middleware returned; nothing pulled by the server yet
    again, replay_headers, _ = retry(middleware)
    assert (again, replay_headers.get("Idempotent-Replayed")) == (status, "true")
    assert first.next() == b""
    first.finish()
    assert closed == [True]


@pytest.mark.parametrize(
    ("status", "headers", "blocks", "kept"),
    [
        ("201 Created", [("Content-Length", "2")], [b"{}extra"], b"{}"),
        ("201 Created", [("Content-Length", "3")], [b"ab", b"cdef"], b"abc"),
        ("201 Created", [("Content-Length", "0")], [b"late"], b""),
        ("204 No Content", [], [b"oops"], b""),
        ("304 Not Modified", [], [b"oops"], b""),
    ],
    ids=["past-length", "past-length-2-blocks", "length-0", "204", "304"],
)
def test_bytes_the_server_never_sends_are_never_replayed(
    store: RedisStore,
    status: str,
    headers: list[tuple[str, str]],
    blocks: list[bytes],
    kept: bytes,
) -> None:
    """A server sends no byte past the declared Content-Length, and no body with a 204 or 304
    (gunicorn cuts it, h11 refuses it): the replay is what the first client could get, with the
    length it was declared with, not the app's overrun."""

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Any:
        start_response(status, list(headers))
        return list(blocks)

    middleware = IdempotencyMiddleware(app, store)
    Server().call(middleware)
    again, replay_headers, body = retry(middleware)
    assert (again, replay_headers.get("Idempotent-Replayed"), body) == (status, "true", kept)
    assert "Idempotent-Body-Not-Kept" not in replay_headers
    assert replay_headers.get("Content-Length") == dict(headers).get("Content-Length")


def test_an_early_close_drains_only_until_the_record_completes(store: RedisStore) -> None:
    """The block that reaches the declared length completes the record: the drain stops there
    rather than pull what no server sends (the worker serves nobody meanwhile)."""

    def past_its_length() -> Iterator[bytes]:
        while True:
            yield b"x" * 6

    recorder = Recorder(past_its_length(), length=12)
    result = IdempotencyMiddleware(recorder, store)(
        environ_for("POST", "/things", [KEY]), Server().start_response
    )
    next(iter(result))
    result.close()  # type: ignore[attr-defined]  # the client left after the first block
    assert recorder.pulled == 2
    assert recorder.closed == 1
    assert retry(IdempotencyMiddleware(recorder, store))[2] == b"x" * 12
    assert recorder.runs == 1
