"""The Django middleware's response side: the view's response settles its record once the
client can have the response's head.

A response in hand (``HttpResponse``) completes with its body (at most ``max_response_bytes``)
as the middleware returns it. A stream (``StreamingHttpResponse``) completes without its body,
when its head goes out:

* Under WSGI the server sends the head with the first non-empty block of the body (PEP 3333),
  or at the body's end. The stream is a :class:`~idemkey.adapters._wsgi_response.StreamedBody`
  (the WSGI middleware's tee, as Flask's streams are): completed at its first non-empty chunk
  or at its end, released when it raises before (the client got a 500 or a closed connection,
  never the view's status); a stream the server closes before its first byte is drained until
  then, for at most :data:`~idemkey.adapters._wsgi_response.DRAIN_SECONDS`. Django reads an
  asynchronous stream whole before the server gets a block, so such a stream completes at its
  end. A stream that never reaches the server (a middleware listed above idemkey's raised, or
  answered instead) is released when Django finishes the request: the client got another
  answer. Django's test ``Client`` finishes a streamed request only when the test reads the
  body or closes the response: a stream left unread keeps its key claimed.
* Under ASGI Django sends the head before it pulls the body: the client has the view's status
  whatever the stream does next (a cut body), so the record completes as the middleware
  returns, as the ASGI middleware completes any response whose head went out.

A ``FileResponse`` that the WSGI server may send itself (``wsgi.file_wrapper``) completes as
the middleware returns too: wrapping its content would take the file from the server.

A request whose view raised, or a middleware below idemkey's after the view (a unit of work
that could not commit), reaches the middleware as Django's 500 (``convert_exception_to_response``
wraps every layer); Django's ``got_request_exception`` marks it, and it is released as a
raise, never stored, even under ``store_server_errors`` (which stores a 5xx the view answered).
An exception a ``process_exception`` answered is no raise: its answer is the outcome.
"""

from __future__ import annotations

import contextvars
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final

from django.core.handlers.wsgi import WSGIRequest
from django.http import HttpResponse

from ..errors import LeaseLostError
from ..http import parse_content_length
from ..http._answers import lease_lost
from ._wsgi_response import StreamedBody

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponseBase

    from ..http import Exchange, Response
    from ._sync_driver import Driver

__all__ = [
    "RAISED_REQUEST",
    "STARTED_REQUEST",
    "UNSENT_STREAM",
    "drop_unsent",
    "forget_unsent",
    "lease_lost_answer",
    "respond",
    "mark_raised",
    "settle",
]

#: The ``dispatch_uid`` of :func:`drop_unsent` on Django's ``request_finished``.
UNSENT_STREAM: Final = "idemkey.unsent_stream"
#: The ``dispatch_uid`` of :func:`forget_unsent` on Django's ``request_started``.
STARTED_REQUEST: Final = "idemkey.started_request"
#: The ``dispatch_uid`` of :func:`mark_raised` on Django's ``got_request_exception``.
RAISED_REQUEST: Final = "idemkey.raised_request"
#: Where :func:`mark_raised` leaves, on a claimed request, why Django answered 500.
_RAISED_ATTRIBUTE: Final = "_idemkey_raised"

#: The stream of this context's request, until Django finishes the request.
_unsent: contextvars.ContextVar[StreamedBody | _SettlingAsync | None] = contextvars.ContextVar(
    "idemkey_django_stream", default=None
)

Head = tuple[int, list[tuple[str, str]], str]

_RAISED: Final = "the view's stream raised before the server sent its head"


def lease_lost_answer(
    middleware: Any, request: HttpRequest, exception: Exception
) -> HttpResponseBase | None:
    """The middleware's ``process_exception``: a claimed view that raised ``LeaseLostError``
    (its claim lapsed; ``fenced()`` refused) is answered a typed 409 ``lease_lost`` problem,
    not Django's 500, its key released as for any raise (a retry gets the outcome). Anything
    else, or a view not claimed, goes on to Django's handling (None)."""
    if not isinstance(exception, LeaseLostError):
        return None
    exchange = request.__dict__.pop("_idemkey", None)
    if exchange is None:
        return None
    driver: Driver = middleware.driver
    driver.fail(exchange, "the view raised")
    return respond(lease_lost(exchange.policy, exception.committed))


def respond(answer: Response) -> HttpResponse:
    """``answer`` (a replay, a problem) as Django's response, with exactly its headers."""
    response = HttpResponse(answer.body, status=answer.status, reason=answer.reason or None)
    del response["Content-Type"]  # exactly the stored headers: no default added
    for name, value in answer.headers:
        # Django keeps one value per name; join repeats as one field line (RFC 9110 5.3).
        response[name] = f"{response[name]}, {value}" if name in response else value
    return response


def settle(
    driver: Driver, exchange: Exchange, request: HttpRequest, response: HttpResponseBase
) -> None:
    """Settle the record with the view's response (now, or once a stream's head goes out),
    and add the headers the policy sends on a first answer (never stored)."""
    headers = list(response.items())
    head: Head = (response.status_code, headers, response.reason_phrase)  # "201 Charged OK"
    raised = request.__dict__.pop(_RAISED_ATTRIBUTE, None)
    if raised is not None:  # Django's 500 for an exception: released, as a raise
        driver.fail(exchange, raised)
    elif not response.streaming:
        content: bytes = response.content
        kept: bytes | None = content
        if "Content-Length" in response:  # no byte past it is sent, nor replayed
            declared = parse_content_length(response["Content-Length"])
            if declared is not None:
                kept = content = content[:declared]
                if len(content) < declared:  # the server cuts the answer: as any cut one
                    head_only = request.method == "HEAD" or head[0] in (204, 304)
                    kept = content if head_only else None
        if kept is not None and len(kept) > exchange.policy.max_response_bytes:
            kept = None
        exchange.started(*head)
        driver.finish(exchange, kept)
    elif isinstance(request, WSGIRequest) and getattr(response, "file_to_stream", None) is None:
        stream: StreamedBody | _SettlingAsync
        if response.is_async:
            stream = _SettlingAsync(response.streaming_content, driver, exchange, head)
        else:
            environ = request.environ
            stream = StreamedBody.around(
                driver, exchange, head, response.streaming_content, environ
            )
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
        stream.never_served("the response never reached the server")


def mark_raised(sender: object, request: HttpRequest | None = None, **_: object) -> None:
    """``got_request_exception``: Django is making its 500 for an exception below idemkey's
    middleware, which gets that 500 as the view's response: :func:`settle` releases it.
    Nothing for a request idemkey did not claim (its exchange is on the request until the
    middleware settles it, so an exception above the middleware finds none)."""
    if request is not None and "_idemkey" in request.__dict__:
        raised = sys.exc_info()[1]
        name = type(raised).__name__ if raised is not None else "an exception"
        request.__dict__[_RAISED_ATTRIBUTE] = f"Django answered 500 for {name}"


def forget_unsent(sender: object, **_: object) -> None:
    """``request_started``: a stream left by an earlier request of this context is not this
    one's to release. A server closes each response before its next request; Django's test
    ``Client`` hands a stream to the test, which may read it after another request (until
    then its key stays claimed)."""
    _unsent.set(None)


class _SettlingAsync:
    """An asynchronous stream's content: Django's WSGI handler reads it whole
    (``async_to_sync``) before the server gets its first block, so it completes at its end,
    and is released if it raises before."""

    __slots__ = ("_content", "driver", "exchange", "head", "settled", "taken")

    def __init__(self, content: Any, driver: Driver, exchange: Exchange, head: Head) -> None:
        self._content: AsyncIterator[bytes] = aiter(content)
        self.driver, self.exchange, self.head = driver, exchange, head
        self.settled = False
        self.taken = False  # the server pulled it or closed it: it is the server's

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        self.taken = True
        try:
            return await anext(self._content)
        except StopAsyncIteration:
            self._end()
            raise
        except BaseException:
            self._end(_RAISED)
            raise

    def close(self) -> None:
        self.taken = True
        self._end()

    def never_served(self, reason: str) -> None:
        if not self.taken:
            self._end(reason)

    def _end(self, failure: str | None = None) -> None:
        if self.settled:
            return
        self.settled = True
        if failure is not None:
            self.driver.fail(self.exchange, failure)  # not started: released
        else:
            self.exchange.started(*self.head)
            self.driver.finish(self.exchange, None)
