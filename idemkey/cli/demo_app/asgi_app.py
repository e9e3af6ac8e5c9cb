"""The demo payments app as a plain ASGI app, behind :class:`IdempotencyMiddleware`.

The same routes and rules as the Flask app (:mod:`.flask_app`, :mod:`.payments`), for an ASGI
server such as uvicorn: ``uvicorn --factory 'idemkey.cli.demo_app.asgi_app:from_environment'``.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import TYPE_CHECKING, Any

from ...adapters.asgi import IdempotencyMiddleware, Message, Receive, Scope, Send
from .payments import DEFAULT_ACCOUNT, Ledger, Problem, demo_policy, parse_charge, parse_delay

if TYPE_CHECKING:
    from ...adapters.asgi import ASGIApp
    from ...policy import Policy
    from ...store import AsyncRedisStore

__all__ = ["create_asgi_app", "from_environment"]

_JSON = "application/json"


class PaymentsApp:
    """The routes, over one in-memory :class:`Ledger`."""

    def __init__(self) -> None:
        self.ledger = Ledger()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        headers = {n.decode("latin-1").lower(): v.decode("latin-1") for n, v in scope["headers"]}
        if path == "/charges" and method == "POST":
            await self._create(await _body(receive), headers, send)
        elif path == "/charges" and method == "GET":
            await _send(send, 200, json.dumps(self.ledger.listing()).encode())
        elif path.startswith("/charges/") and method == "GET":
            found = self.ledger.find(path.removeprefix("/charges/"))
            if found is None:
                await _problem(send, Problem(404, "not_found", f"no charge {path[9:]}"))
            else:
                await _send(send, 200, json.dumps(found).encode())
        else:
            await _problem(send, Problem(404, "not_found", f"no route {method} {path}"))

    async def _create(self, raw: bytes, headers: dict[str, str], send: Send) -> None:
        try:
            data: object = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: nested past what json parses
            data = None
        parsed = parse_charge(data)
        if isinstance(parsed, Problem):
            await _problem(send, parsed)
            return
        delay = parse_delay(headers.get("demo-delay"))
        if isinstance(delay, Problem):
            await _problem(send, delay)
            return
        self.ledger.begin()
        try:
            await asyncio.sleep(delay)
            charge = self.ledger.charge(headers.get("account", DEFAULT_ACCOUNT), *parsed)
        finally:
            self.ledger.end()
        location = [(b"location", f"/charges/{charge['id']}".encode())]
        await _send(send, 201, json.dumps(charge).encode(), extra=location)


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message: Message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _send(
    send: Send,
    status: int,
    body: bytes,
    content_type: str = _JSON,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [(b"content-type", content_type.encode()), *(extra or [])]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _problem(send: Send, problem: Problem) -> None:
    await _send(send, problem.status, problem.body(), "application/problem+json")


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def create_asgi_app(store: AsyncRedisStore, policy: Policy | None = None) -> ASGIApp:
    """The demo payments app over ``store``, wrapped in idemkey's ASGI middleware."""
    return IdempotencyMiddleware(PaymentsApp(), store, policy or store.policy)


def from_environment() -> Any:
    """An app factory for ASGI servers: the store on ``$IDEMKEY_REDIS_URL`` (required), records
    under ``$IDEMKEY_PREFIX`` (default ``idemkey``)."""
    from ...store import AsyncRedisStore
    from ...store._url import client_from_url

    url = os.environ["IDEMKEY_REDIS_URL"]
    client = client_from_url(url, asyncio=True, source="IDEMKEY_REDIS_URL")
    policy = demo_policy(os.environ.get("IDEMKEY_PREFIX", "idemkey"))
    return create_asgi_app(AsyncRedisStore(client, policy))
