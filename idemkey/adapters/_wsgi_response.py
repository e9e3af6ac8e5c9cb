"""The WSGI middleware's response side: idemkey's own answers, and the app's body tee.

:func:`send` hands one of idemkey's answers (a problem, a replay) to ``start_response``.
:class:`TeeIterable` is what the middleware returns for a claimed request: the app's body,
forwarded chunk by chunk while a copy of at most ``max_response_bytes`` is kept, settled through
the driver as soon as the response is wholly in hand: when the block that reaches the declared
``Content-Length`` comes from the app, before it goes to the server (a head that ends the
response, before the middleware returns: :meth:`TeeIterable.take_empty_body`), or when the
iterable is exhausted (a response without a length: the client learns its end only from the
last chunk or the connection's close, which the server sends after that). PEP 3333 lets a
server send each block before it asks for the next, so a client holding a whole sized answer
may retry while the record would still be in progress (409) if it completed on the next ask.
When the server closes the iterable early (the client left), the record is settled after
draining the rest for at most :data:`DRAIN_SECONDS`, and only until it completes.
:class:`StreamedBody` is the tee of a stream whose head a framework sent (Django, Flask): it
keeps no body and completes at its first byte.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from time import monotonic
from typing import TYPE_CHECKING, Any, Final

from ..http import BodyCopy

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from ..http import Exchange, Response
    from ._sync_driver import Driver

__all__ = [
    "ClosingBody",
    "DRAIN_SECONDS",
    "StreamedBody",
    "TeeIterable",
    "send",
    "short_of_length",
]

#: Where the app finds the Exchange of its claimed request (``.claim.fence``) while it runs.
EXCHANGE_KEY: Final = "idemkey.exchange"

#: How long the middleware keeps pulling an app's body after the server closed it early (the
#: client left), measured between blocks: a sync worker serves nobody else meanwhile.
DRAIN_SECONDS: Final = 1.0

_logger = logging.getLogger("idemkey")

#: The standard reason phrase of each status: ``HTTPStatus(status)`` is an Enum call, dozens
#: of Python steps for every answer sent without a phrase of its own (each 409, 422, 503).
_PHRASES: Final = {status.value: status.phrase for status in HTTPStatus}


def send(start_response: StartResponse, response: Response) -> list[bytes]:
    reason = response.reason  # a replay's own phrase ("201 Charged OK"), else the standard one
    if not reason:
        reason = _PHRASES.get(response.status, "Unknown")
    start_response(f"{response.status} {reason}", response.headers)
    return [response.body]


class TeeIterable:
    """The app's body iterable, forwarded chunk by chunk while a bounded copy is kept."""

    __slots__ = (
        "body_started",
        "copy",
        "driver",
        "ends_with_head",
        "environ",
        "exchange",
        "headers",
        "iterable",
        "iterator",
        "reason",
        "remaining",
        "server_start_response",
        "server_write",
        "settled",
        "status",
    )

    def __init__(
        self, driver: Driver, exchange: Exchange, start: StartResponse, environ: WSGIEnvironment
    ) -> None:
        self.driver, self.exchange, self.server_start_response = driver, exchange, start
        self.environ = environ
        self.server_write: Callable[[bytes], object] | None = None
        self.iterable: Iterable[bytes] = ()
        self.iterator: Iterator[bytes] | None = None
        self.status: int | None = None
        self.reason = ""
        self.headers: list[tuple[str, str]] = []
        self.copy = BodyCopy(exchange.policy.max_response_bytes)
        self.settled = False
        self.body_started = False  # a non-empty chunk went out: the head is the client's
        self.remaining: int | None = None  # bytes still due of the declared Content-Length
        self.ends_with_head = False  # 204, 304 or Content-Length: 0: no body will follow

    def start_response(self, status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
        if type(headers) is not list:  # an iterator (gunicorn takes one) is read only once
            headers = list(headers)
        sent = self.exchange.first_headers(headers)  # None: as they are (the default)
        self.server_write = self.server_start_response(
            status, headers if sent is None else sent, *exc_info
        )
        self.status, self.headers, self.reason = int(status[:3]), headers, status[4:]
        copy = self.copy
        copy.start(headers)
        remaining = self.remaining = copy.declared  # the Content-Length, if any
        self.ends_with_head = remaining == 0 or self.status in (204, 304)
        return self.write  # a bound method: no closure built per request

    def write(self, data: bytes) -> None:
        """The legacy write() callable start_response returns: keeps a copy too."""
        self.copy.add(data)
        self.body_started = self.body_started or bool(data)
        self._count(data)
        assert self.server_write is not None  # start_response came first
        self.server_write(data)

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        try:
            if self.iterator is None:
                self.iterator = iter(self.iterable)
            chunk = next(self.iterator)
        except StopIteration:
            self.finish()
            raise
        except BaseException:
            self.finish(failed=True)
            raise
        self.copy.add(chunk)
        self.body_started = self.body_started or bool(chunk)
        self._count(chunk)
        return chunk

    def _count(self, chunk: bytes) -> None:
        """Complete once the declared length is in hand, before the block goes out: the
        client may have it all (and retry) before the server asks for the next block."""
        remaining = self.remaining
        if remaining is not None and not self.settled:
            remaining -= len(chunk)
            self.remaining = remaining
            if remaining <= 0:
                self.finish()

    def take_empty_body(self) -> None:
        """A head that ends the response (204, 304, ``Content-Length: 0``) is all the client
        gets, and a server may send it before it pulls the (empty) body: pull it now, and
        complete, before the middleware hands the response to the server. The middleware
        calls it only when :attr:`ends_with_head` (one call less on every other response)."""
        try:
            blocks = list(self)  # through __next__: kept, counted, settled at its end
        except BaseException:
            self.close()  # the server never gets this iterable to close
            raise
        self.iterator = iter(blocks)

    def finish(self, failed: bool = False) -> None:
        if self.settled:
            return
        self.settled = True
        # WSGI lets an app replace its status until the first body byte (exc_info): the head
        # counts as sent from then on, and a failure after it completes without the body
        # (the exchange's rule, as under ASGI); a failure before it releases the key.
        if self.status is not None and (self.body_started or not failed):
            self.exchange.started(self.status, self.headers, self.reason)
        if failed or self.status is None:
            self.driver.fail(self.exchange, "the handler raised")
            return
        if self.remaining and self.remaining > 0:  # ended short of its length: a cut answer
            short_of_length(self.copy, self.exchange)
        try:
            self.driver.finish(self.exchange, self.copy.body())
        except BaseException:
            # Settled above: a step that raised before the plan must not leave the claim
            # open (renewed, every retry a 409, until the process exits). The work is done.
            if self.exchange.plan is None:
                self.driver.fail(self.exchange, "the response could not be stored")
            raise

    def close(self) -> None:
        """The server is done with us: if it stopped early, drain the app (bounded in bytes
        and time, and only until the record completes), then complete, because the handler's
        work is done; always close the app's iterable."""
        try:
            if not self.settled:
                deadline = monotonic() + DRAIN_SECONDS
                try:
                    for _ in self:
                        if self.settled:  # in hand (its length, a stream's first byte): done
                            break
                        if self.copy.too_large or monotonic() > deadline:
                            self.copy.drop()  # stop pulling: complete without the body
                            break
                    self.finish()
                except Exception:
                    pass  # __next__ released the key; the server is gone, nobody to tell
        finally:
            # environ -> exchange -> request headers -> environ is a reference cycle: break it
            # when the request ends, so the environ and its body go with their last reference
            # instead of waiting for the cyclic garbage collector.
            self.environ.pop(EXCHANGE_KEY, None)
            close = getattr(self.iterable, "close", None)
            if close is not None:
                close()


def short_of_length(copy: BodyCopy, exchange: Exchange) -> None:
    """The body ended short of its declared ``Content-Length``, and the server stops
    mid-body: the client got a cut answer, so the record completes without its body, as any
    answer cut after its head goes out (a replay never presents the short bytes as the whole
    answer). Logged once, naming the route template or ``<unknown>`` (never the client's
    path), no body byte. Called only on that end (never on a replay): a 204, a 304 or a HEAD
    answer has no body to fall short (its Content-Length is the representation's), and a
    copy already dropped has nothing to drop."""
    head = exchange._head  # the status that went out: the Exchange keeps it for the plan
    request = exchange.request
    if copy.dropped or request.method == "HEAD" or (head is not None and head[0] in (204, 304)):
        return
    copy.drop()
    _logger.warning(
        "idemkey: %s %s answered a body short of its Content-Length; stored without its body",
        request.method,
        exchange.label,  # the template or <unknown>: never the client's path (raw, any length)
    )


def _head_already_sent(
    status: str, headers: list[tuple[str, str]], exc_info: Any = None, /
) -> Callable[[bytes], object]:
    raise AssertionError("a StreamedBody's head went to the server before it was made")


class StreamedBody(TeeIterable):
    """A streamed response whose head a framework hands to the server itself (Django's WSGI
    handler; Flask's, once its hooks ran): ``head`` is the record's (status, headers, reason).

    Its body is never kept, so the record is the same whenever it completes: at the first
    non-empty chunk (the server sends the head with it, PEP 3333), before that chunk goes out,
    or at the end; a failure before that releases the key (the client got a 500 or a closed
    connection, never this status). A retry is replayed from then on rather than answered 409
    for as long as the stream lasts. Closed unread, it is drained (:meth:`TeeIterable.close`)
    until it completes, or fails."""

    __slots__ = ()

    @classmethod
    def around(
        cls,
        driver: Driver,
        exchange: Exchange,
        head: tuple[int, list[tuple[str, str]], str],
        body: Iterable[bytes],
        environ: WSGIEnvironment,
    ) -> StreamedBody:
        stream = cls(driver, exchange, _head_already_sent, environ)
        stream.status, stream.headers, stream.reason = head
        stream.copy.drop()
        stream.iterable = body
        return stream

    def _count(self, chunk: bytes) -> None:
        if chunk and not self.settled:
            self.finish()

    def never_served(self, reason: str) -> None:
        """The framework finished the request, and the server never pulled this body nor
        closed it (a layer above answered instead): the client never got this head."""
        if self.iterator is None and not self.settled:
            self.settled = True
            self.driver.fail(self.exchange, reason)


class ClosingBody:
    """An app's body that runs ``then`` once the server closes it (after the app's own
    ``close``), as werkzeug's ``ClosingIterator`` does. The WSGI middleware's unprotected
    body (Redis down, ``on_store_error="open"``) keeps its fenceless call current until then,
    as a claimed call is while :class:`TeeIterable` is iterated, so a generator app's
    ``fenced()`` refuses it (``UnprotectedCallError``) rather than finding no call; Flask's
    releases the nested streams the server never pulled."""

    __slots__ = ("_body", "_then")

    def __init__(self, body: Iterable[bytes], then: Callable[[], object]) -> None:
        self._body = body
        self._then = then

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            self._then()
