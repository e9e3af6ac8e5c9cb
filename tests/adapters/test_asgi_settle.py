"""When the ASGI middleware settles a record: as soon as the client may hold the whole answer.

The twin of tests/adapters/test_wsgi_settle.py (issue 35). A response that declares its
``Content-Length`` is wholly the client's once the message reaching that length is sent, even
if the app sends its final (empty) body message later, as Starlette's ``StreamingResponse``
does after its generator's last ``yield``: a retry sent the moment the client read it is a
replay, not ``409 in_flight``. Without a length the end reaches the client only with the final
message, so the record completes after that one.
"""

from __future__ import annotations

import asyncio

import pytest

from idemkey import AsyncRedisStore
from idemkey.adapters.asgi import IdempotencyMiddleware, Receive, Scope, Send
from tests._servers import async_wait_until
from tests.adapters.test_asgi import (
    DEADLINE,
    Channel,
    body_messages,
    call,
    record_state,
    start,
    store,
)

__all__ = ["store"]  # the fixture, imported


async def test_the_message_reaching_the_content_length_completes_the_record(
    store: AsyncRedisStore,
) -> None:
    cleanup = asyncio.Event()  # the generator's code after its last yield

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        head = start(201)
        head["headers"].append((b"content-length", b"10"))
        await send(head)
        await send({"type": "http.response.body", "body": b"first;", "more_body": True})
        await send({"type": "http.response.body", "body": b"last", "more_body": True})
        await cleanup.wait()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    middleware = IdempotencyMiddleware(app, store)
    channel = Channel(body_messages(b"{}"))
    task = asyncio.create_task(call(middleware, channel=channel))
    await async_wait_until(lambda: channel.body == b"first;last", DEADLINE, "the whole body")

    assert await record_state(store) == "complete"  # the client holds it all: a replay
    replay = await call(middleware, b"{}")
    assert (replay.status, replay.headers["idempotent-replayed"], replay.body) == (
        201,
        "true",
        b"first;last",
    )
    cleanup.set()
    await asyncio.wait_for(task, DEADLINE)
    assert channel.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


async def test_without_a_length_only_the_final_message_completes_the_record(
    store: AsyncRedisStore,
) -> None:
    more = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send(start(201))
        await send({"type": "http.response.body", "body": b"first;", "more_body": True})
        await more.wait()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    middleware = IdempotencyMiddleware(app, store)
    channel = Channel(body_messages(b"{}"))
    task = asyncio.create_task(call(middleware, channel=channel))
    await async_wait_until(lambda: channel.body == b"first;", DEADLINE, "the first chunk")
    assert await record_state(store) == "in_progress"  # more may follow
    more.set()
    await asyncio.wait_for(task, DEADLINE)
    assert await record_state(store) == "complete"


@pytest.mark.parametrize(
    ("status", "headers", "bodies", "kept"),
    [
        (201, [(b"content-length", b"2")], [b"{}extra"], b"{}"),
        (201, [(b"content-length", b"3")], [b"ab", b"cdef"], b"abc"),
        (201, [(b"content-length", b"0")], [b"late"], b""),
        (204, [], [b"oops"], b""),
        (304, [], [b"oops"], b""),
    ],
    ids=["past-length", "past-length-2-messages", "length-0", "204", "304"],
)
async def test_bytes_the_server_never_sends_are_never_replayed(
    store: AsyncRedisStore,
    status: int,
    headers: list[tuple[bytes, bytes]],
    bodies: list[bytes],
    kept: bytes,
) -> None:
    """h11 refuses a body past the declared Content-Length, or any with a 204 or 304: the
    replay is what the first client could get, never a body (and length) it could not, which
    h11 would refuse again on every retry."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": status, "headers": headers})
        for index, body in enumerate(bodies):
            more = index < len(bodies) - 1
            await send({"type": "http.response.body", "body": body, "more_body": more})

    middleware = IdempotencyMiddleware(app, store)
    await call(middleware, b"{}")
    replay = await call(middleware, b"{}")
    assert (replay.status, replay.headers["idempotent-replayed"], replay.body) == (
        status,
        "true",
        kept,
    )
    assert "idempotent-body-not-kept" not in replay.headers
    declared = dict(headers).get(b"content-length")
    assert replay.headers.get("content-length") == (declared.decode() if declared else None)
