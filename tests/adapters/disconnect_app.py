"""An ASGI payment endpoint behind idemkey's middleware, for a client that leaves mid-handler
(tests/adapters/test_asgi_disconnect.py; ``uvicorn tests.adapters.disconnect_app:app``).

``POST /pay`` adds one to ``{prefix}:runs`` (the side effect), then, while ``{prefix}:gate``
exists, waits (10 s at most) for an item on ``{prefix}:open``, and answers 201. ``app`` is the
middleware as uvicorn runs it (a client that leaves does not stop the app);
``cancelling_app`` puts in front of it what some servers and frameworks do: cancel the request's
task when its client disconnects. Redis and the prefix: ``IDEMKEY_TEST_REDIS_URL``,
``IDEMKEY_TEST_PREFIX``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import redis.asyncio

from idemkey import AsyncRedisStore, Policy
from idemkey.adapters.asgi import IdempotencyMiddleware, Receive, Scope, Send

PREFIX = os.environ["IDEMKEY_TEST_PREFIX"]
client = redis.asyncio.Redis.from_url(os.environ["IDEMKEY_TEST_REDIS_URL"])
store = AsyncRedisStore(client, Policy(prefix=PREFIX, lease=1.5, wait=0))


async def pay(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    status = 200 if scope["path"] == "/health" else 201
    body = b"ok"
    if status == 201:
        runs = await client.incr(f"{PREFIX}:runs")
        if await client.exists(f"{PREFIX}:gate"):
            await client.blpop([f"{PREFIX}:open"], timeout=10)
        body = f'{{"payment": "pay_{runs}"}}'.encode()
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": body})


app = IdempotencyMiddleware(pay, store)


async def cancelling_app(scope: Scope, receive: Receive, send: Send) -> None:
    """``app``, its task cancelled when the client disconnects (once the body was read)."""
    if scope["type"] != "http":
        await app(scope, receive, send)
        return
    body_read = asyncio.Event()

    async def reading() -> Any:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body"):
            body_read.set()
        return message

    task = asyncio.ensure_future(app(scope, reading, send))
    read = asyncio.ensure_future(body_read.wait())
    await asyncio.wait([task, read], return_when=asyncio.FIRST_COMPLETED)
    read.cancel()
    if not task.done():
        listen = asyncio.ensure_future(receive())  # the app reads no more: only a disconnect
        await asyncio.wait([task, listen], return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and listen.result()["type"] == "http.disconnect":
            task.cancel()
        listen.cancel()
    with contextlib.suppress(asyncio.CancelledError):  # the server's own choice
        await task
