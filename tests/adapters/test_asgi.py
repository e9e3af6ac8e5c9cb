"""What only the ASGI middleware has: scopes, streaming, send/receive wrapping, cancellation.

The shared suite (test_suite.py) covers the HTTP behaviour table through every harness. These
tests drive the middleware with raw ASGI calls, so they control exactly when each message is
received and sent, and can look at the Redis record between two messages.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import httpx
import pytest
import pytest_asyncio
import redis.asyncio

from idemkey import AsyncRedisStore, Event, Policy, StoreError
from idemkey._core import record_state as state_of
from idemkey.adapters._asgi_messages import head_of
from idemkey.adapters.asgi import IdempotencyMiddleware, Receive, Scope, Send
from idemkey.http import Exchange, Headers, Request, begin
from tests._servers import RedisServer, async_wait_until

Message = dict[str, Any]
KEY = ("idempotency-key", "key-1")
JSON = ("content-type", "application/json")
DEADLINE = 10.0


def http_scope(
    method: str = "POST", path: str = "/charges", headers: Sequence[tuple[str, str]] = (KEY, JSON)
) -> Scope:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in headers],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }


def body_messages(body: bytes, pieces: int = 1) -> list[Message]:
    """``body`` as ``pieces`` http.request messages, the last one with more_body False."""
    size = -(-len(body) // pieces) if body else 0
    chunks = [body[i : i + size] for i in range(0, len(body), size)] if size else [b""]
    return [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]


class Channel:
    """The server's side of one ASGI call: scripted ``receive``, recorded ``send``.

    Once the scripted messages run out, ``receive`` waits for the client to leave
    (``disconnect()``) and then answers ``http.disconnect``, as a server does.
    """

    def __init__(self, incoming: Sequence[Message] = ()) -> None:
        self.incoming = list(incoming)
        self.received = 0
        self.sent: list[Message] = []
        self.left = asyncio.Event()

    async def receive(self) -> Message:
        self.received += 1
        if self.incoming:
            return self.incoming.pop(0)
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def disconnect(self) -> None:
        self.left.set()

    @property
    def status(self) -> int:
        return int(next(m["status"] for m in self.sent if m["type"] == "http.response.start"))

    @property
    def headers(self) -> dict[str, str]:
        start = next(m for m in self.sent if m["type"] == "http.response.start")
        return {n.decode().lower(): v.decode() for n, v in start["headers"]}

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


async def call(
    app: Any,
    body: bytes = b'{"amount": 1}',
    *,
    pieces: int = 1,
    scope: Scope | None = None,
    channel: Channel | None = None,
) -> Channel:
    channel = channel or Channel(body_messages(body, pieces))
    await app(scope or http_scope(), channel.receive, channel.send)
    return channel


class Charges:
    """A raw ASGI app: counts runs, records what it received, answers 201 with JSON."""

    def __init__(self) -> None:
        self.runs = 0
        self.bodies: list[bytes] = []
        self.messages: list[Message] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = dict(await receive())
        self.messages.append(message)
        self.bodies.append(message.get("body", b""))
        self.runs += 1
        await asyncio.sleep(0)  # let concurrent requests interleave with this one
        payload = json.dumps({"id": f"ch_{self.runs}"}).encode()
        await send(start(201))
        await send({"type": "http.response.body", "body": payload, "more_body": False})


def start(status: int) -> Message:
    return {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json")],
    }


@pytest_asyncio.fixture
async def store(async_client: redis.asyncio.Redis, prefix: str) -> AsyncIterator[AsyncRedisStore]:
    store = AsyncRedisStore(async_client, Policy(prefix=prefix))
    try:
        yield store
    finally:
        await store.aclose()


async def record_state(store: AsyncRedisStore) -> str | None:
    """The state of the record of POST /charges with the test key (None: no record)."""
    step = begin(store.policy, Request("POST", "/charges", "", Headers([KEY, JSON])))
    assert isinstance(step, Exchange)
    state = state_of(await store.client.hgetall(step.record.key))
    return state if state in ("complete", "in_progress") else None  # released: only a fence


def state_is(store: AsyncRedisStore, expected: str | None) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await record_state(store) == expected

    return check


# ---- pass-through ---------------------------------------------------------------------------


async def test_websocket_lifespan_and_unguarded_methods_pass_through_untouched(
    store: AsyncRedisStore,
) -> None:
    seen: list[tuple[str, Receive, Send]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append((scope["type"], receive, send))
        if scope["type"] == "lifespan":
            assert (await receive())["type"] == "lifespan.startup"
            await send({"type": "lifespan.startup.complete"})
        elif scope["type"] == "websocket":
            assert (await receive())["type"] == "websocket.connect"
            await send({"type": "websocket.accept"})
        else:
            await send(start(200))
            await send({"type": "http.response.body", "body": b"[]"})

    middleware = IdempotencyMiddleware(app, store)
    lifespan = Channel([{"type": "lifespan.startup"}])
    await middleware(
        {"type": "lifespan", "asgi": {"version": "3.0"}}, lifespan.receive, lifespan.send
    )
    socket = Channel([{"type": "websocket.connect"}])
    ws_scope = {**http_scope("GET", "/ws"), "type": "websocket"}
    await middleware(ws_scope, socket.receive, socket.send)
    # A key on GET is ignored: the app gets the server's own channel, nothing is claimed.
    get = Channel([{"type": "http.request", "body": b""}])
    await middleware(http_scope("GET"), get.receive, get.send)

    assert [(kind, r, s) for kind, r, s in seen] == [
        ("lifespan", lifespan.receive, lifespan.send),
        ("websocket", socket.receive, socket.send),
        ("http", get.receive, get.send),
    ]
    assert lifespan.sent == [{"type": "lifespan.startup.complete"}]
    assert socket.sent == [{"type": "websocket.accept"}]
    assert get.status == 200
    assert await store.client.keys(f"{store.policy.prefix}*") == []


# ---- the request body -----------------------------------------------------------------------


async def test_request_body_is_replayed_byte_identical_in_one_message(
    store: AsyncRedisStore,
) -> None:
    app = Charges()
    middleware = IdempotencyMiddleware(app, store)
    body = bytes(range(256)) * 3  # every byte value, NUL and non-UTF-8 included

    first = await call(middleware, body, pieces=5)
    # The same bytes cut into other pieces are the same request: a replay.
    again = await call(middleware, body, pieces=2)

    assert app.bodies == [body]
    assert app.messages == [{"type": "http.request", "body": body, "more_body": False}]
    assert first.status == again.status == 201
    assert again.body == first.body
    assert again.headers["idempotent-replayed"] == "true"


async def test_receive_after_the_replayed_body_reaches_the_real_channel(
    store: AsyncRedisStore,
) -> None:
    messages: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        messages.append(dict(await receive()))
        messages.append(dict(await receive()))  # waits until the client leaves
        await send(start(201))
        await send({"type": "http.response.body", "body": b"{}"})

    channel = Channel(body_messages(b'{"amount": 1}', pieces=3))
    task = asyncio.create_task(call(IdempotencyMiddleware(app, store), channel=channel))
    await async_wait_until(lambda: len(messages) == 1, DEADLINE, "the app to get the body")
    assert not task.done()  # the second receive waits on the real channel
    channel.disconnect()
    await asyncio.wait_for(task, DEADLINE)

    assert messages == [
        {"type": "http.request", "body": b'{"amount": 1}', "more_body": False},
        {"type": "http.disconnect"},
    ]


async def test_declared_length_over_the_limit_is_413_without_reading_the_body(
    store: AsyncRedisStore,
) -> None:
    app = Charges()
    policy = store.policy.replace(max_request_bytes=100)
    channel = Channel(body_messages(b"x" * 101))
    scope = http_scope(headers=(KEY, JSON, ("content-length", "101")))

    await call(IdempotencyMiddleware(app, store, policy), scope=scope, channel=channel)

    assert channel.status == 413
    assert channel.headers["content-type"] == "application/problem+json"
    assert json.loads(channel.body)["code"] == "request_too_large"
    assert channel.received == 0
    assert app.runs == 0


async def test_unbounded_body_reading_stops_past_the_limit(store: AsyncRedisStore) -> None:
    app = Charges()
    policy = store.policy.replace(max_request_bytes=250)
    channel = Channel(body_messages(b"x" * 1000, pieces=10))  # 100-byte pieces, no length

    await call(IdempotencyMiddleware(app, store, policy), channel=channel)

    assert channel.status == 413
    assert channel.received == 3  # 300 bytes read: over the limit, the rest left unread
    assert app.runs == 0
    assert await store.client.keys(f"{store.policy.prefix}*") == []


async def test_client_leaving_before_its_body_claims_nothing(store: AsyncRedisStore) -> None:
    app = Charges()
    channel = Channel([{"type": "http.request", "body": b'{"am', "more_body": True}])
    channel.disconnect()

    await call(IdempotencyMiddleware(app, store), channel=channel)

    assert channel.sent == []
    assert app.runs == 0
    assert await store.client.keys(f"{store.policy.prefix}*") == []


# ---- the response ---------------------------------------------------------------------------


@pytest.mark.parametrize("sized", [True, False], ids=["content-length", "no-length"])
async def test_first_byte_reaches_the_client_while_the_app_still_works(
    store: AsyncRedisStore, sized: bool
) -> None:
    more = asyncio.Event()
    head = start(200)
    if sized:
        head["headers"].append((b"content-length", b"10"))

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send(head)
        await send({"type": "http.response.body", "body": b"first;", "more_body": True})
        await more.wait()
        await send({"type": "http.response.body", "body": b"last", "more_body": False})

    middleware = IdempotencyMiddleware(app, store)
    channel = Channel(body_messages(b"{}"))
    task = asyncio.create_task(call(middleware, channel=channel))

    await async_wait_until(lambda: channel.body == b"first;", DEADLINE, "the first chunk")
    assert not task.done()
    assert await record_state(store) == "in_progress"
    more.set()
    await asyncio.wait_for(task, DEADLINE)
    assert channel.body == b"first;last"

    replay = await call(middleware, b"{}")
    assert replay.headers["idempotent-replayed"] == "true"
    if sized:  # a body of known length is kept, however many messages carried it
        assert replay.body == b"first;last"
        assert "idempotent-body-not-kept" not in replay.headers
    else:  # streamed: status and headers replayed, the body said to be left out
        assert (replay.status, replay.body) == (200, b"")
        assert replay.headers["idempotent-body-not-kept"] == "true"


async def test_completed_only_after_the_final_message_is_sent(store: AsyncRedisStore) -> None:
    """A background task that fails after the response went out cannot release it."""
    app = Charges()
    states: list[str | None] = []

    async def failing_background(scope: Scope, receive: Receive, send: Send) -> None:
        await app(scope, receive, send)
        raise RuntimeError("background task failed after the response was sent")

    class Watching(Channel):
        async def send(self, message: Message) -> None:
            if message["type"] == "http.response.body":
                states.append(await record_state(store))
            await super().send(message)

    middleware = IdempotencyMiddleware(failing_background, store)
    channel = Watching(body_messages(b'{"amount": 1}'))
    with pytest.raises(RuntimeError, match="background task failed"):
        await call(middleware, channel=channel)

    assert states == ["in_progress"]  # not completed before the client had the answer
    assert await record_state(store) == "complete"
    replay = await call(middleware)
    assert (replay.status, replay.body) == (201, channel.body)
    assert app.runs == 1


async def test_starlette_background_task_failure_keeps_the_response(
    store: AsyncRedisStore,
) -> None:
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    runs = []

    def fail() -> None:
        raise RuntimeError("email service down")

    async def charge(request: Any) -> JSONResponse:
        runs.append(1)
        return JSONResponse({"id": f"ch_{len(runs)}"}, 201, background=BackgroundTask(fail))

    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/charges", charge, methods=["POST"])]), store
    )
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        first = await client.post("/charges", headers=[KEY], content=b"{}")
        again = await client.post("/charges", headers=[KEY], content=b"{}")

    assert (first.status_code, first.json()) == (201, {"id": "ch_1"})
    assert (again.status_code, again.json()) == (201, {"id": "ch_1"})
    assert again.headers["idempotent-replayed"] == "true"
    assert len(runs) == 1


async def test_app_raising_before_it_starts_its_response_releases_the_key(
    store: AsyncRedisStore,
) -> None:
    runs = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("failed before answering")
        await send(start(200))
        await send({"type": "http.response.body", "body": b"whole", "more_body": False})

    middleware = IdempotencyMiddleware(app, store)
    with pytest.raises(RuntimeError, match="failed before answering"):
        await call(middleware)
    assert await record_state(store) is None  # released: the retry runs again

    retry = await call(middleware)
    assert retry.body == b"whole"
    assert len(runs) == 2


async def test_app_raising_after_its_response_started_completes_without_the_body(
    store: AsyncRedisStore,
) -> None:
    """The status and headers went out: the client may hold the answer and the work is done,
    so the key is never released (issue 10, case 1); the retry gets the head, no body."""
    runs = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        runs.append(1)
        await send(start(200))
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        raise RuntimeError("stream broke")

    middleware = IdempotencyMiddleware(app, store)
    with pytest.raises(RuntimeError, match="stream broke"):
        await call(middleware)
    assert await record_state(store) == "complete"

    retry = await call(middleware)
    assert (retry.status, retry.body) == (200, b"")
    assert retry.headers["content-type"] == "application/json"
    assert retry.headers["idempotent-body-not-kept"] == "true"
    assert len(runs) == 1


async def test_send_failing_on_the_final_message_still_completes(store: AsyncRedisStore) -> None:
    """The app finished its work; the client vanishing while it is written loses nothing."""
    app = Charges()

    class Vanishing(Channel):
        async def send(self, message: Message) -> None:
            await super().send(message)
            if message["type"] == "http.response.body":
                raise OSError("client disconnected")

    middleware = IdempotencyMiddleware(app, store)
    with pytest.raises(OSError, match="client disconnected"):
        await call(middleware, channel=Vanishing(body_messages(b'{"amount": 1}')))

    replay = await call(middleware)
    assert (replay.status, replay.headers["idempotent-replayed"]) == (201, "true")
    assert app.runs == 1


async def test_cancelled_during_the_completion_write_still_completes(
    store: AsyncRedisStore,
) -> None:
    """A server cancelling the request task on disconnect does not cancel the store write."""
    app = Charges()
    writing, proceed = asyncio.Event(), asyncio.Event()

    class SlowComplete(AsyncRedisStore):
        async def complete(self, *args: Any, **kwargs: Any) -> bool:
            writing.set()
            await proceed.wait()
            return await super().complete(*args, **kwargs)

    slow = SlowComplete(store.client, store.policy)
    middleware = IdempotencyMiddleware(app, slow)
    task = asyncio.create_task(call(middleware))
    await asyncio.wait_for(writing.wait(), DEADLINE)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    proceed.set()

    await async_wait_until(
        state_is(store, "complete"), DEADLINE, "the shielded completion to be written"
    )
    replay = await call(IdempotencyMiddleware(app, store))
    assert replay.headers["idempotent-replayed"] == "true"
    assert app.runs == 1
    await slow.aclose()


async def test_completion_cut_off_in_flight_by_a_cancel_is_sent_again(
    private_redis_server: RedisServer, prefix: str
) -> None:
    """The complete command is on the wire to a stalled Redis when the request is cancelled:
    redis-py drops that connection, and the write is sent again on another one."""
    app = Charges()
    sending = asyncio.Event()
    client = private_redis_server.async_client()

    class Stalling(AsyncRedisStore):
        async def complete(self, *args: Any, **kwargs: Any) -> bool:
            if not sending.is_set():
                private_redis_server.pause()  # the first attempt waits for a reply that is late
                sending.set()
            return await super().complete(*args, **kwargs)

    store = Stalling(client, Policy(prefix=prefix))
    try:
        task = asyncio.create_task(call(IdempotencyMiddleware(app, store)))
        await asyncio.wait_for(sending.wait(), DEADLINE)
        await asyncio.sleep(0)  # let the command be written before the cancel (either way works)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        private_redis_server.resume()

        await async_wait_until(state_is(store, "complete"), DEADLINE, "the re-sent completion")
        replay = await call(IdempotencyMiddleware(app, store))
        assert replay.headers["idempotent-replayed"] == "true"
        assert app.runs == 1
    finally:
        if private_redis_server.paused:
            private_redis_server.resume()
        await store.aclose()
        await client.aclose()


async def test_cancelled_while_claiming_frees_a_claim_already_taken(
    store: AsyncRedisStore,
) -> None:
    """Redis took the claim, but the request was cancelled before the reply came back."""
    app = Charges()
    claimed, never = asyncio.Event(), asyncio.Event()

    class LateReply(AsyncRedisStore):
        async def claim(self, *args: Any, **kwargs: Any) -> Any:
            decision = await super().claim(*args, **kwargs)
            claimed.set()
            await never.wait()  # the reply is lost: the middleware never sees it
            return decision

    late = LateReply(store.client, store.policy)
    task = asyncio.create_task(call(IdempotencyMiddleware(app, late)))
    await asyncio.wait_for(claimed.wait(), DEADLINE)
    assert await record_state(store) == "in_progress"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    await async_wait_until(state_is(store, None), DEADLINE, "the orphan claim to be released")
    retry = await call(IdempotencyMiddleware(app, store))
    assert (retry.status, app.runs) == (201, 1)  # runs now, instead of 409 for a whole lease
    await late.aclose()


async def test_cancelled_mid_stream_completes_without_the_body(store: AsyncRedisStore) -> None:
    """A server cancels the request when its client leaves a stream: the response had started,
    so the record completes without its body instead of freeing the key for a second run."""
    runs, more = [], asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        runs.append(1)
        await send(start(200))
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await more.wait()
        await send({"type": "http.response.body", "body": b"b", "more_body": False})

    channel = Channel(body_messages(b"{}"))
    task = asyncio.create_task(call(IdempotencyMiddleware(app, store), channel=channel))
    await async_wait_until(lambda: channel.body == b"a", DEADLINE, "the first chunk")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    await async_wait_until(state_is(store, "complete"), DEADLINE, "the record to complete")
    retry = await call(IdempotencyMiddleware(app, store), b"{}")
    assert (retry.status, retry.body) == (200, b"")
    assert retry.headers["idempotent-body-not-kept"] == "true"
    assert len(runs) == 1


async def test_cancelled_before_the_response_started_keeps_the_key_to_lapse(
    store: AsyncRedisStore,
) -> None:
    # The app may have done its work before the server cancelled it: a release would let the
    # retry run it again at once (issue 36). The claim stays, unrenewed, and an operator is told.
    runs, never = [], asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        runs.append(1)
        await never.wait()  # still working when the server cancels

    task = asyncio.create_task(call(IdempotencyMiddleware(app, store)))
    await async_wait_until(lambda: runs, DEADLINE, "the app to run")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    (entry,) = await async_wait_until(store.uncertain, DEADLINE, "the uncertain entry")
    assert entry.kind == "cancelled"
    assert await record_state(store) == "in_progress"
    assert not store._leases  # no longer renewed: it lapses after one lease


async def test_completion_failure_after_the_response_is_logged_not_raised(
    store: AsyncRedisStore,
) -> None:
    events: list[Event] = []

    class BrokenComplete(AsyncRedisStore):
        async def complete(self, *args: Any, **kwargs: Any) -> bool:
            raise StoreError("Redis failed during complete: ConnectionError")

    policy = store.policy.replace(on_event=events.append)
    broken = BrokenComplete(store.client, policy)
    channel = await call(IdempotencyMiddleware(Charges(), broken, policy))

    assert channel.status == 201  # the client already has its answer
    assert [e.kind for e in events] == ["claimed", "store_error"]
    assert "response not stored" in events[-1].detail
    await broken.aclose()


async def test_server_sent_file_completes_without_its_body(store: AsyncRedisStore) -> None:
    runs = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        runs.append(1)
        await send(start(200))
        await send({"type": "http.response.pathsend", "path": "/srv/receipt.pdf"})

    middleware = IdempotencyMiddleware(app, store)
    first = await call(middleware)
    replay = await call(middleware)

    assert first.sent[-1]["type"] == "http.response.pathsend"
    assert replay.status == 200
    assert replay.headers["idempotent-body-not-kept"] == "true"
    assert len(runs) == 1


# ---- concurrency ----------------------------------------------------------------------------


@pytest.mark.parametrize("wait", [0.0, 5.0], ids=["no-wait", "wait"])
async def test_100_concurrent_requests_on_one_key_run_once(
    store: AsyncRedisStore, wait: float
) -> None:
    app = Charges()
    middleware = IdempotencyMiddleware(app, store, store.policy.replace(wait=wait))

    answers = await asyncio.wait_for(
        asyncio.gather(*(call(middleware) for _ in range(100))), DEADLINE * 3
    )

    assert app.runs == 1
    statuses = {a.status for a in answers}
    # Without a wait, a duplicate gets 409 while the first runs, or its replay after.
    assert statuses == {201} if wait else 201 in statuses and statuses <= {201, 409}
    assert {a.body for a in answers if a.status == 201} == {b'{"id": "ch_1"}'}
    assert all(a.headers.get("retry-after") for a in answers if a.status == 409)


@pytest.mark.parametrize(
    "raw",
    [
        [(b"content-type", b"text/plain"), (b"x-id", b"\xe9")],
        [(bytearray(b"content-type"), b"text/plain"), (b"x-id", memoryview(b"\xe9"))],
        [("content-type", "text/plain"), (b"x-id", b"\xe9")],
        ((b"content-type", b"text/plain"), (b"x-id", b"\xe9")),
    ],
)
def test_response_headers_read_alike_in_every_form_the_spec_allows(raw: Any) -> None:
    # head_of decodes all-bytes headers in place and everything else through _text: the two
    # must give the same text, or a replay would depend on how the app spelled its headers.
    _, status, headers = head_of({"type": "http.response.start", "status": 201, "headers": raw})
    assert status == 201
    assert headers == [("content-type", "text/plain"), ("x-id", "\xe9")]


@pytest.mark.parametrize(
    "raw",
    [[(b"x-id", 7)], [(b"x-id", "caf\xe9")], [(b"x-id", b"v", b"extra")], [b"x-id"]],
)
def test_response_headers_no_server_would_send_are_never_stored(raw: Any) -> None:
    _, _, headers = head_of({"type": "http.response.start", "status": 201, "headers": raw})
    assert headers is None


async def test_a_str_final_body_completes_without_it_and_never_holds_the_key(
    store: AsyncRedisStore,
) -> None:
    # A str body is an app bug a server refuses (uvicorn raises TypeError). The work is done:
    # the record completes without the body, never left in progress, renewed, every retry 409.
    runs = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        runs.append(1)
        await send(start(201))
        await send({"type": "http.response.body", "body": "text, not bytes"})

    class Strict(Channel):
        async def send(self, message: Message) -> None:
            if not isinstance(message.get("body", b""), bytes):
                raise TypeError("data argument must be a bytes-like object, not 'str'")
            await super().send(message)

    middleware = IdempotencyMiddleware(app, store)
    with pytest.raises(TypeError, match="bytes-like"):
        await call(middleware, channel=Strict(body_messages(b'{"amount": 1}')))
    assert await record_state(store) == "complete"
    retry = await call(middleware)
    assert (retry.status, retry.body) == (201, b"")
    assert retry.headers["idempotent-body-not-kept"] == "true"
    assert len(runs) == 1
