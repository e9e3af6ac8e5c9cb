"""IdempotencyMiddleware for any ASGI 3 application (pure ASGI: no framework import).

::

    app = IdempotencyMiddleware(app, AsyncRedisStore(redis.asyncio.Redis.from_url(url)))

Every decision is :mod:`idemkey.http`'s; this module moves bytes. The request body is read
(bounded by ``max_request_bytes``) before the claim, because the fingerprint covers it, and is
replayed to the app. The response is forwarded to the client as it streams, with a copy kept up
to ``max_response_bytes``; the record is completed once the final body message has been *sent*,
not when the app returns, so a background task that fails afterwards cannot release a response
the client already has. Completion and release outlive a cancellation (a server cancelling the
request when its client leaves): a write cut off is sent again in a task, so the handler still
never runs twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from time import perf_counter
from typing import Any

from .._core import new_owner
from ..errors import StoreError
from ..http import (
    BodyCopy,
    Complete,
    Exchange,
    Headers,
    Request,
    Response,
    begin,
    content_length,
)
from ..policy import Policy
from ..routes import KnownRoute, Routes
from ..store import AsyncRedisStore, detach, uncancellable

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
        declared = content_length(headers)
        if declared is not None and step.too_large(declared):
            await _respond(send, step.too_large_response())
            return
        body = await _read_body(receive, policy.max_request_bytes)
        if body is None:
            return  # the client left before sending its request: nothing was claimed
        if step.too_large(len(body)):
            await _respond(send, step.too_large_response())
            return

        replayed = False

        async def replay_receive() -> Message:
            nonlocal replayed
            if replayed:  # later calls: the real channel, so http.disconnect still arrives
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        owner = new_owner()
        started = perf_counter()
        try:
            decision = await self.store.claim(
                step.record,
                step.fingerprint(body),
                owner=owner,
                lease_ms=policy.lease_ms,
                ttl_ms=policy.ttl_ms,
                wait=policy.wait,
            )
        except asyncio.CancelledError:
            # The claim may have been taken before the cancel cut off its reply: free it, or
            # retries would get 409 until the lease lapses. Not ours: release changes nothing.
            detach(self._release(step, owner, "cancelled while claiming"))
            raise
        except StoreError as exc:
            failed = step.store_failed(exc)
            if failed is not None:
                await _respond(send, failed)
            else:
                await self.app(scope, replay_receive, send)
            return
        answer = step.decide(decision, perf_counter() - started)
        if isinstance(answer, Response):
            await _respond(send, answer)
            return
        copy = BodyCopy(policy.max_response_bytes)
        status, response_headers, finished = 0, [], False

        async def capture_send(message: Message) -> None:
            nonlocal status, response_headers, finished
            kind = message["type"]
            if kind == "http.response.start":
                status = message["status"]
                response_headers = [
                    (n.decode("latin-1"), v.decode("latin-1"))
                    for n, v in message.get("headers", ())
                ]
                copy.start(response_headers)
            elif kind == "http.response.body" and not finished:
                finished = not message.get("more_body", False)
                copy.add(message.get("body", b""))
            elif kind == "http.response.pathsend" and not finished:
                copy.drop()  # a file sent by the server: too large to keep
                finished = True
            else:
                await send(message)
                return
            if not finished:
                await send(message)
                return
            # The app produced its final message: the work is done and must be stored, even if
            # the client is gone and send raises. After send returns, not before, so the stored
            # answer is never one the client did not get while the server could deliver it.
            try:
                await send(message)
            finally:
                body_copy = copy.body()
                await uncancellable(
                    lambda: self._finish(step, owner, status, response_headers, body_copy)
                )

        try:
            await self.app(scope, replay_receive, capture_send)
        finally:
            if not finished:  # the app raised, was cancelled, or returned mid-response
                reason = "the app did not finish its response"
                await uncancellable(lambda: self._release(step, owner, reason))

    async def _finish(
        self,
        step: Exchange,
        owner: str,
        status: int,
        headers: list[tuple[str, str]],
        body: bytes | None,
    ) -> None:
        plan = step.finish(status, headers, body)
        if not isinstance(plan, Complete):
            await self._release(step, owner, plan.reason)
            return
        started = perf_counter()
        try:
            stored = await self.store.complete(
                step.record, owner, plan.stored, ttl_ms=step.policy.ttl_ms
            )
        except StoreError as exc:
            # The client already has its answer; the lease will lapse and a retry may run again.
            step.notify("store_error", detail=f"response not stored: {exc}")
            return
        step.completed(stored, perf_counter() - started)

    async def _release(self, step: Exchange, owner: str, reason: str) -> None:
        started = perf_counter()
        try:
            released = await self.store.release(step.record, owner)
        except StoreError as exc:
            step.notify("store_error", detail=f"key not released (its lease will lapse): {exc}")
            return
        step.released(reason, released, perf_counter() - started)
