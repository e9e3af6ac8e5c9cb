"""The ASGI messages the middleware reads and writes, apart from its flow (``asgi.py``), and
the two channels it gives the app: :class:`ReplayReceive` (the body already read) and
:class:`TeeSend` (the response forwarded while a bounded copy is kept for the record).

The response head is read as servers read it: header names and values as bytes (or bytes-like),
and, since h11-based servers such as uvicorn accept it, ASCII text, which they send as its
bytes. Anything else is not ASGI, and what a server does with it is the server's business: the
message is forwarded untouched, and its head is never stored (:func:`head_of` gives None).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from ..http import BodyCopy, Response
from ..http._transitions import State
from ._wsgi_response import short_of_length

if TYPE_CHECKING:
    from ..http import Exchange
    from ._async_driver import AsyncDriver

__all__ = [
    "ASGIApp",
    "Message",
    "Receive",
    "ReplayReceive",
    "Scope",
    "Send",
    "TeeSend",
    "head_of",
    "read_body",
    "respond",
]

# ASGI types, defined here as in starlette.types so idemkey imports no framework.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def respond(send: Send, response: Response) -> None:
    """Send one of idemkey's own answers (a problem, a replay)."""
    # A loop, not a list comprehension: no frame of its own (before Python 3.12) to call.
    headers = []
    for name, value in response.headers:
        headers.append((name.encode("latin-1"), value.encode("latin-1")))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})


async def read_body(receive: Receive, limit: int, message: Message) -> bytes | None:
    """The request body, stopping once it is over ``limit``; None if the client went away.

    ``message`` is the first message, already received (the caller takes a body that comes
    whole in it without this call)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False) or size > limit:
            break
        message = await receive()
    return b"".join(chunks)


class ReplayReceive:
    """``receive`` for the app: the body already read, in one message, then the real channel
    (so ``http.disconnect`` still reaches the app)."""

    __slots__ = ("body", "real")

    def __init__(self, body: bytes, real: Receive) -> None:
        self.body: bytes | None = body
        self.real = real

    async def __call__(self) -> Message:
        body = self.body
        if body is None:
            return await self.real()
        self.body = None
        return {"type": "http.request", "body": body, "more_body": False}


def head_of(message: Message) -> tuple[Message, int, list[tuple[str, str]] | None]:
    """An ``http.response.start`` message: the message to forward, its status, and its headers
    as text (None: not readable, so never to be stored).

    The spec allows any iterable of headers, and a generator is used up by one reading: it is
    read once here, and the server is given the list.
    """
    raw = message.get("headers", ())
    if not isinstance(raw, (list, tuple)):
        raw = list(raw)
        message = {**message, "headers": raw}
    status = message.get("status")
    if type(status) is not int:
        return message, 0, None
    # The usual case, all bytes, decoded in place (two calls less per header) by a loop (no
    # list comprehension frame before Python 3.12); anything else goes through _text, which
    # gives the same text for bytes (tests/adapters keep them equal).
    try:
        text = []
        for name, value in raw:
            if type(name) is not bytes or type(value) is not bytes:
                return message, status, [(_text(name), _text(value)) for name, value in raw]
            text.append((name.decode("latin-1"), value.decode("latin-1")))
    except (TypeError, ValueError):  # not a pair, or not a header a server would send
        return message, status, None
    return message, status, text


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value).decode("latin-1")
    if isinstance(value, str) and value.isascii():
        return value
    raise TypeError(f"not a header a server sends: {type(value).__name__}")


class TeeSend:
    """``send`` for the app: forwards every message while a bounded copy is kept, and settles
    the record once the client may hold the whole answer: the body message reaching the
    declared ``Content-Length`` has been sent (an app may send its final, empty message later,
    as Starlette's ``StreamingResponse`` does after its generator's last ``yield``: the WSGI
    tee completes at the same point), else the final body message has."""

    __slots__ = ("copy", "driver", "exchange", "finished", "real", "remaining")

    def __init__(self, driver: AsyncDriver, exchange: Exchange, real: Send) -> None:
        self.driver, self.exchange, self.real = driver, exchange, real
        self.copy = BodyCopy(exchange.policy.max_response_bytes)
        self.finished = False
        self.remaining: int | None = None  # bytes still due of the declared Content-Length

    def _started(
        self, status: int, headers: list[tuple[str, str]] | None, trailers: object
    ) -> None:
        """The app's head is its answer: the exchange moves on, the copy reads its length.
        For a head the server could not send; ``send`` has these lines inline for one it sent
        (a call per response would cost every request ten bytecodes)."""
        self.exchange.started(status, headers)
        copy = self.copy
        copy.start(headers or ())
        self.remaining = copy.declared  # the Content-Length, if any
        if trailers:
            copy.drop()

    async def send(self, message: Message) -> None:
        kind = message["type"]
        exchange = self.exchange
        if kind == "http.response.start" and exchange.state is State.RUNNING:
            message, status, headers = head_of(message)
            if status < 200 and status >= 100:  # an interim answer (103): not the answer
                await self.real(message)
                return
            sent = exchange.first_headers(headers) if headers is not None else None
            if sent is not None:  # the policy adds headers: sent, never stored
                encoded = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in sent]
                message = {**message, "headers": encoded}
            try:
                await self.real(message)
            except Exception:
                # Not sent (the server raised: its client left), yet the app's work is done,
                # as after a final message the server could not send: the record completes,
                # without its body unless the app still sends it. (A cancel is not that: the
                # head may not have gone out, and the app stops; see ``asgi.py``.)
                self._started(status, headers, message.get("trailers"))
                raise
            # Sent: from here on the client may hold the answer, so the key is never released.
            exchange.started(status, headers)
            copy = self.copy
            copy.start(headers or ())
            self.remaining = copy.declared  # the Content-Length, if any
            if message.get("trailers"):
                copy.drop()  # trailers follow the body, and a replay sends none: not kept
            return
        if self.finished or exchange.state is not State.SENDING:
            await self.real(message)  # not ours to keep: the server judges it
            return
        if kind == "http.response.body":
            chunk = message.get("body", b"")
            self.copy.add(chunk)
            remaining = self.remaining
            if remaining is not None:
                remaining -= len(chunk)
                self.remaining = remaining
            self.finished = not message.get("more_body", False) or (
                remaining is not None and remaining <= 0
            )
        elif kind == "http.response.pathsend":
            self.copy.drop()  # a file sent by the server: too large to keep
            self.finished = True
        if not self.finished:
            await self.real(message)
            return
        # The app produced its final message: the work is done and must be stored, even if
        # the client is gone and send raises. After send returns, not before, so the stored
        # answer is never one the client did not get while the server could deliver it.
        if self.remaining and self.remaining > 0:  # (three steps on a whole answer)
            # Short of its declared length: the server cuts the answer, so the client never
            # gets it whole. Complete as any answer cut after its head: without the body.
            short_of_length(self.copy, exchange)
        try:
            await self.real(message)
        finally:
            await self.driver.finish(exchange, self.copy.body())
