"""IdempotencyMiddleware for any ASGI 3 application (pure ASGI: no framework import).

::

    app = IdempotencyMiddleware(app, AsyncRedisStore(redis.asyncio.Redis.from_url(url)))

This module moves bytes: the order of the steps is the driver's (``_async_driver``), every
decision :mod:`idemkey.http`'s. The request body is read (bounded by ``max_request_bytes``)
before the claim, because the fingerprint covers it, and is replayed to the app. The response
is forwarded to the client as it streams, with a copy kept up to ``max_response_bytes``; the
record is completed once the final body message has been *sent*, not when the app returns, so
a background task that fails afterwards cannot release a response the client already has.
Completion and release outlive a cancellation (a server cancelling the request when its client
leaves), so the handler still never runs twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..http import BodyCopy, Headers, Request, Response, begin
from ..policy import Policy
from ..routes import KnownRoute, Routes
from ..store import AsyncRedisStore
from ._async_driver import AsyncDriver
from ._lifecycle import Lifecycle

__all__ = ["IdempotencyMiddleware"]

# ASGI types, defined here as in starlette.types so idemkey imports no framework.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def _respond(send: Send, response: Response) -> None:
    headers = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in response.headers]
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body, stopping once it is over ``limit``; None if the client went away."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


class IdempotencyMiddleware:
    """Run each keyed request once; answer retries with the stored response.

    ``store`` is an :class:`~idemkey.AsyncRedisStore`; ``policy`` defaults to the store's.
    ``routes`` (:class:`~idemkey.routes.Routes`) chooses the guarded paths and their options;
    without it every path is guarded for ``policy.methods``. Websocket and lifespan scopes, and
    requests that are not guarded, pass straight through: no Redis call, no body read.
    """

    def __init__(
        self,
        app: ASGIApp,
        store: AsyncRedisStore,
        policy: Policy | None = None,
        *,
        routes: Routes | KnownRoute | None = None,
    ) -> None:
        self.app = app
        self.store = store
        self.policy = policy if policy is not None else store.policy
        self.routes = routes.bind(self.policy) if routes is not None else None
        self.driver = AsyncDriver(store)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.routes is None:
            policy, route = self.policy, ""
            if scope["method"] not in policy.methods:
                await self.app(scope, receive, send)
                return
        else:
            selected = self.routes.select(scope["method"], scope["path"])
            if selected is None:
                await self.app(scope, receive, send)
                return
            policy, route = selected.policy, selected.route
        headers = Headers((n.decode("latin-1"), v.decode("latin-1")) for n, v in scope["headers"])
        query = scope.get("query_string", b"").decode("latin-1")
        step = begin(policy, Request(scope["method"], scope["path"], query, headers, route))
        if step is None:
            await self.app(scope, receive, send)
            return
        if isinstance(step, Response):
            await _respond(send, step)
            return
        lifecycle = Lifecycle(step)
        answer = lifecycle.announced()
        if answer is not None:
            await _respond(send, answer)
            return
        body = await _read_body(receive, policy.max_request_bytes)
        if body is None:  # the client left before sending its request: nothing was claimed
            lifecycle.client_left()
            return
        answer = lifecycle.received(body) or await self.driver.claim(lifecycle)
        if answer is not None:
            await _respond(send, answer)
            return
        replay = _Replay(body, receive)
        if lifecycle.unprotected:  # Redis is down and the policy says run unprotected
            await self.app(scope, replay.receive, send)
            return
        tee = _Tee(self.driver, lifecycle, send)
        try:
            await self.app(scope, replay.receive, tee.send)
        finally:
            if not tee.finished:  # the app raised, was cancelled, or returned mid-response
                await self.driver.fail(lifecycle, "the app did not finish its response")


class _Replay:
    """``receive`` for the app: the body already read, in one message, then the real channel
    (so ``http.disconnect`` still reaches the app)."""

    __slots__ = ("body", "real")

    def __init__(self, body: bytes, real: Receive) -> None:
        self.body: bytes | None = body
        self.real = real

    async def receive(self) -> Message:
        body = self.body
        if body is None:
            return await self.real()
        self.body = None
        return {"type": "http.request", "body": body, "more_body": False}


class _Tee:
    """``send`` for the app: forwards every message while a bounded copy is kept, and settles
    the record once the final body message has been sent."""

    __slots__ = ("copy", "driver", "finished", "headers", "lifecycle", "real", "status")

    def __init__(self, driver: AsyncDriver, lifecycle: Lifecycle, real: Send) -> None:
        self.driver, self.lifecycle, self.real = driver, lifecycle, real
        self.copy = BodyCopy(lifecycle.exchange.policy.max_response_bytes)
        self.finished = False
        self.status = 0
        self.headers: list[tuple[str, str]] = []

    async def send(self, message: Message) -> None:
        if self.finished:  # after the final message: the server's business alone
            await self.real(message)
            return
        kind = message["type"]
        if kind == "http.response.start":
            self.status = message["status"]
            self.headers = [
                (n.decode("latin-1"), v.decode("latin-1")) for n, v in message.get("headers", ())
            ]
            self.copy.start(self.headers)
        elif kind == "http.response.body":
            self.finished = not message.get("more_body", False)
            self.copy.add(message.get("body", b""))
        elif kind == "http.response.pathsend":
            self.copy.drop()  # a file sent by the server: too large to keep
            self.finished = True
        if not self.finished:
            await self.real(message)
            return
        # The app produced its final message: the work is done and must be stored, even if
        # the client is gone and send raises. After send returns, not before, so the stored
        # answer is never one the client did not get while the server could deliver it.
        try:
            await self.real(message)
        finally:
            self.lifecycle.started(self.status, self.headers)
            await self.driver.finish(self.lifecycle, self.copy.body())
