"""The Django middleware's response side: the view's response settles its record once the
client can have the response's head.

A response in hand (``HttpResponse``) completes with its body (at most ``max_response_bytes``)
as the middleware returns it. A stream (``StreamingHttpResponse``) completes without its body,
when its head goes out:

* Under WSGI the server sends the head with the first non-empty block of the body (PEP 3333),
  or at the body's end. The stream settles as the WSGI middleware's
  :class:`~idemkey.adapters._wsgi_response.TeeIterable` settles an app's body: completed at
  its first non-empty chunk or at its end, released when it raises before (the client got a
  500 or a closed connection, never the view's status); a stream the server closes before
  its first byte is drained for at most :data:`~idemkey.adapters._wsgi_response.DRAIN_SECONDS`,
  then completed. Django reads an asynchronous stream whole before the server gets a block,
  so such a stream completes at its end. A stream that never reaches the server (a middleware
  listed above idemkey's raised, or answered instead) is released when Django finishes the
  request: the client got another answer.
* Under ASGI Django sends the head before it pulls the body: the client has the view's status
  whatever the stream does next (a cut body), so the record completes as the middleware
  returns, as the ASGI middleware completes any response whose head went out.

A ``FileResponse`` that the WSGI server may send itself (``wsgi.file_wrapper``) completes as
the middleware returns too: wrapping its content would take the file from the server.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from time import monotonic
from typing import TYPE_CHECKING, Any, Final

from django.core.handlers.wsgi import WSGIRequest

from ..http import parse_content_length
from ._wsgi_response import DRAIN_SECONDS

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponseBase

    from ..http import Exchange
    from ._sync_driver import Driver

__all__ = ["UNSENT_STREAM", "drop_unsent", "settle"]

#: The ``dispatch_uid`` of :func:`drop_unsent` on Django's ``request_finished``.
UNSENT_STREAM: Final = "idemkey.unsent_stream"

#: The stream of this context's request, until Django finishes the request.
_unsent: contextvars.ContextVar[_Settling | None] = contextvars.ContextVar(
    "idemkey_django_stream", default=None
)

Head = tuple[int, list[tuple[str, str]], str]

_RAISED: Final = "the view's stream raised before the server sent its head"


def settle(
    driver: Driver, exchange: Exchange, request: HttpRequest, response: HttpResponseBase
) -> None:
    """Settle the record with the view's response (now, or once a stream's head goes out),
    and add the headers the policy sends on a first answer (never stored)."""
    headers = list(response.items())
    head: Head = (response.status_code, headers, response.reason_phrase)  # "201 Charged OK"
    if not response.streaming:
        content: bytes = response.content
        if "Content-Length" in response:  # no byte past it is sent, nor replayed
            declared = parse_content_length(response["Content-Length"])
            content = content[:declared] if declared is not None else content
        kept = content if len(content) <= exchange.policy.max_response_bytes else None
        exchange.started(*head)
        driver.finish(exchange, kept)
    elif isinstance(request, WSGIRequest) and getattr(response, "file_to_stream", None) is None:
        ended = functools.partial(_stream_ended, driver, exchange, head)
        stream: _Settling
        if response.is_async:
            stream = _SettlingAsync(response.streaming_content, ended)
        else:
            stream = _SettlingSync(response.streaming_content, ended)
        response.streaming_content = stream
        _unsent.set(stream)
    else:
        exchange.started(*head)
        driver.finish(exchange, None)
    sent = exchange.first_headers(headers)
    if sent is not None:  # the policy adds headers: sent, never stored
        for name, value in sent[len(headers) :]:
            response[name] = value
        for name, value in sent[: len(headers)]:
            if response.get(name) != value:
                response[name] = value  # Access-Control-Expose-Headers, extended


def drop_unsent(sender: object, **_: object) -> None:
    """``request_finished``: a stream of this request that the server never took is released."""
    stream = _unsent.get()
    if stream is not None:
        _unsent.set(None)
        stream.dropped()


def _stream_ended(driver: Driver, exchange: Exchange, head: Head, failure: str | None) -> None:
    if failure is not None:
        driver.fail(exchange, failure)  # not started: released
    else:
        exchange.started(*head)
        driver.finish(exchange, None)


class _Settling:
    """A stream's content, which settles its record once (``ended``: None to complete)."""

    __slots__ = ("_ended", "settled", "taken")

    def __init__(self, ended: Callable[[str | None], None]) -> None:
        self._ended = ended
        self.settled = False
        self.taken = False  # the server pulled it or closed it: it is the server's

    def end(self, failure: str | None = None) -> None:
        if not self.settled:
            self.settled = True
            self._ended(failure)

    def dropped(self) -> None:
        if not self.taken:
            self.end("the response never reached the server")


class _SettlingSync(_Settling):
    """The server pulls each chunk and sends it: the head goes out with the first non-empty
    one (an empty chunk is no byte, as for ``TeeIterable``)."""

    __slots__ = ("_content",)

    def __init__(self, content: Iterable[bytes], ended: Callable[[str | None], None]) -> None:
        super().__init__(ended)
        self._content = iter(content)

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        self.taken = True
        try:
            chunk = next(self._content)
        except StopIteration:
            self.end()
            raise
        except BaseException:
            self.end(_RAISED)
            raise
        if chunk and not self.settled:  # the server sends the head with it
            self.end()
        return chunk

    def close(self) -> None:
        """Django's ``response.close()``, from the server. One that stopped before the first
        byte: what is left is drained (at most :data:`DRAIN_SECONDS`), then the record
        completes, the view's work being done, as ``TeeIterable.close`` does. (Django closes
        a generator before this: nothing of it is left to drain.)"""
        self.taken = True
        if self.settled:
            return
        deadline = monotonic() + DRAIN_SECONDS
        try:
            for _ in self:
                if self.settled or monotonic() > deadline:
                    break
        except Exception:
            return  # __next__ released the key; the server is gone, nobody to tell
        self.end()


class _SettlingAsync(_Settling):
    """Django's WSGI handler reads it whole (``async_to_sync``) before the server gets its
    first block: it completes at its end, and is released if it raises before."""

    __slots__ = ("_content",)

    def __init__(self, content: Any, ended: Callable[[str | None], None]) -> None:
        super().__init__(ended)
        self._content: AsyncIterator[bytes] = aiter(content)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        self.taken = True
        try:
            return await anext(self._content)
        except StopAsyncIteration:
            self.end()
            raise
        except BaseException:
            self.end(_RAISED)
            raise

    def close(self) -> None:
        self.taken = True
        self.end()
