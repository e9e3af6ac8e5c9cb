"""IdempotencyMiddleware for any ASGI 3 application (pure ASGI: no framework import).

::

    app = IdempotencyMiddleware(app, AsyncRedisStore(redis.asyncio.Redis.from_url(url)))

This module moves bytes: the order of the steps is the driver's (``_async_driver``), every
decision :mod:`idemkey.http`'s. The request body is read (bounded by ``max_request_bytes``)
before the claim, because the fingerprint covers it, and is replayed to the app. The response
is forwarded to the client as it streams, with a copy kept up to ``max_response_bytes``; the
record is completed once the final body message, or the one reaching the declared
``Content-Length``, has been *sent*, not when the app returns, so a background task that fails
afterwards cannot release a response the client already has.

Once the response has started (``http.response.start`` went out with a status the policy
stores), the key is never released: if the client leaves, times out, or the app fails before
the final body message, the record completes without its body and a retry gets the stored
status and headers with ``Idempotent-Body-Not-Kept: true``. Completion and release outlive a
cancellation. A client that leaves does not stop the app under uvicorn (it runs on, and its
response is stored); an app cancelled before its response started (a server or framework that
cancels the request when its client leaves) keeps the key until its lease lapses, with an
``uncertain`` entry (docs/guarantees.md, "Cancellation").
"""

from __future__ import annotations

import asyncio

from ..errors import LeaseLostError
from ..http import Headers, Request, Response, begin
from ..http._answers import lease_lost
from ..http._transitions import State
from ..http.routes import KnownRoute, Routes
from ..policy import Policy
from ..store import AsyncRedisStore
from ._asgi_messages import (
    ASGIApp,
    Message,
    Receive,
    ReplayReceive,
    Scope,
    Send,
    TeeSend,
    read_body,
    respond,
)
from ._async_driver import AsyncDriver
from ._checks import checked_policy, checked_routes, checked_store

__all__ = ["ASGIApp", "IdempotencyMiddleware", "Message", "Receive", "Scope", "Send"]


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
        self.store = store = checked_store(
            store, AsyncRedisStore, "IdempotencyMiddleware(store=...)"
        )
        policy = checked_policy(policy, "IdempotencyMiddleware(policy=...)")
        self.policy = policy if policy is not None else store.policy
        routes = checked_routes(routes, "IdempotencyMiddleware(routes=...)")
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
                # Behind a prefix, a route may be written with it or without it: whether the
                # server's path holds the prefix is the server's choice (uvicorn's does).
                if scope.get("root_path"):
                    path = scope["path"]
                    other = mounted_other(path, scope["root_path"])
                    selected = self.routes.select_mounted(scope["method"], path, other)
                if selected is None:
                    await self.app(scope, receive, send)
                    return
            policy, route = selected.policy, selected.route
        headers = Headers.from_latin1(scope["headers"])
        query = scope.get("query_string", b"").decode("latin-1")
        exchange = begin(policy, Request(scope["method"], scope["path"], query, headers, route))
        if exchange is None:
            await self.app(scope, receive, send)
            return
        if isinstance(exchange, Response):
            await respond(send, exchange)
            return
        answer = exchange.announced()
        if answer is not None:
            await respond(send, answer)
            return
        # The usual request, its whole body as bytes in its first message, is taken here as
        # read_body would return it (b"".join of one bytes object is that object).
        message = await receive()
        body = message.get("body", b"")
        if (
            message["type"] == "http.disconnect"
            or message.get("more_body", False)
            or type(body) is not bytes
        ):
            body = await read_body(receive, policy.max_request_bytes, message)
        if body is None:  # the client left before sending its request: nothing was claimed
            exchange.client_left()
            return
        answer = exchange.received(body) or await self.driver.claim(exchange)
        if answer is not None:
            await respond(send, answer)
            return
        if exchange.unprotected:  # Redis is down and the policy says run unprotected
            try:
                await self.app(scope, ReplayReceive(body, receive), send)
            finally:
                exchange.unprotected_ended()
            return
        tee = TeeSend(self.driver, exchange, send)
        try:
            await self.app(scope, ReplayReceive(body, receive), tee.send)
        except asyncio.CancelledError:
            if not tee.finished:
                if exchange.state is State.RUNNING:
                    # Cancelled before its head went out: the app may have done its work, so
                    # the key is kept until its lease lapses rather than released for a rerun.
                    self.driver.abandon(exchange)
                else:
                    await self.driver.fail(exchange, "the app did not finish its response")
            raise
        except BaseException as exc:
            if not tee.finished:  # the app raised
                unsent = exchange.state is State.RUNNING  # its response not started
                await self.driver.fail(exchange, "the app did not finish its response")
                if unsent and isinstance(exc, LeaseLostError):  # released: a 409, not a 500
                    await respond(send, lease_lost(policy, exc.committed))
                    return
            raise
        if not tee.finished:  # the app returned mid-response
            await self.driver.fail(exchange, "the app did not finish its response")


def mounted_other(path: str, root_path: str) -> str:
    """``path`` spelled the other way under the mount ``root_path``: uvicorn's ``path`` holds
    the root path, so it is taken away (as Starlette's ``get_route_path`` does); hypercorn's
    and daphne's does not, so it is put before it."""
    root = root_path.rstrip("/")
    if path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        return path[len(root) :] or "/"
    return root + path
