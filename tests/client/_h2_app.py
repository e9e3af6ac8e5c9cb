"""An ASGI app for hypercorn, which speaks HTTP/2 over cleartext (prior knowledge) and HTTP/1.1.

``/health`` answers 200 at once; ``/trickle/<seconds>`` sends the head and the start of the
body at once and the rest after ``<seconds>``: a stream that stays open on a shared connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

Message = dict[str, Any]


async def app(
    scope: Message,
    receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    while (await receive()).get("more_body"):
        pass
    json = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": json})
    if not scope["path"].startswith("/trickle/"):
        await send({"type": "http.response.body", "body": b'{"ok": true}'})
        return
    await send({"type": "http.response.body", "body": b'{"ok":', "more_body": True})
    await asyncio.sleep(float(scope["path"].rsplit("/", 1)[1]))
    await send({"type": "http.response.body", "body": b" true}"})
