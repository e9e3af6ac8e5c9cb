"""When the Flask extension settles a claimed request: once the response leaves Flask.

The view's answer is not yet the client's when the view returns: Flask then runs the
``after_request`` hooks (a unit of work committed there), saves the session and tears the
request down, and when one of them fails the client gets Flask's 500 instead. So ``_guard``
leaves the answer it would store, a :class:`Pending`, in the slot that ``BodyCapture`` (the
WSGI layer around ``app.wsgi_app``) puts in each keyed request's environ, and settles nothing;
BodyCapture settles it once Flask returned the response:

* completed with the view's answer (:func:`complete`), as before: replays still go through
  the hooks, so a hook that changes the body or adds an ETag sends the same bytes again;
* released when Flask handled an exception after the view (:func:`released_by_flask`, on its
  ``got_request_exception`` signal: the client gets Flask's 500), or let one out (a teardown
  error, ``PROPAGATE_EXCEPTIONS``): the answer stored must be one the client was sent;
* a streamed answer (a generator, ``send_file``) as the WSGI middleware's
  :class:`~._wsgi_response.TeeIterable` decides (:class:`StreamedAnswer`): released on a
  failure before its first byte, completed (without its body, never kept) at its first
  non-empty chunk or when exhausted.

A view dispatched with no BodyCapture around it (a request context of its own) finds no slot,
and settles in the view as the extension did before. Nothing may leave a claim open: the
heartbeat would renew it, and every retry get a 409, for as long as the process runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import msgspec
from flask import has_request_context, request

from ._wsgi_response import TeeIterable

if TYPE_CHECKING:
    from collections.abc import Iterable

    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from ..http import Exchange
    from ._sync_driver import Driver

__all__ = ["SETTLE_KEY", "Pending", "StreamedAnswer", "complete", "release", "released_by_flask"]

#: Where BodyCapture's slot (a list) waits for the guarded view's :class:`Pending` answer.
SETTLE_KEY: Final = "idemkey.settle"


class Pending(msgspec.Struct):
    """A guarded view's answer, as it is stored once Flask has sent it (built in C: no
    ``__init__`` frame on every first request)."""

    driver: Driver
    exchange: Exchange
    status: int
    headers: list[tuple[str, str]]
    reason: str
    #: What to store: None when not kept (streamed, or over ``max_response_bytes``).
    body: bytes | None
    streamed: bool


def complete(pending: Pending, body: Iterable[bytes] = ()) -> None:
    """Store the view's answer; a step that fails before the plan is made releases the key.

    ``body``: what Flask returned for the server, closed if this raises (the server never
    gets it to close).
    """
    exchange, driver = pending.exchange, pending.driver
    try:
        exchange.started(pending.status, pending.headers, pending.reason)
        driver.finish(exchange, pending.body)
    except BaseException:
        try:
            if exchange.plan is None:
                driver.fail(exchange, "the response could not be stored")
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
        raise


def release(pending: Pending, reason: str) -> None:
    """The client was not sent the view's answer: a retry runs the view again."""
    pending.driver.fail(pending.exchange, reason)


def released_by_flask(sender: Any, exception: BaseException, **_: Any) -> None:
    """``got_request_exception``: Flask handled an exception after the view answered (an
    ``after_request`` hook, the session's save) and sends its 500 in place of the answer (or
    lets the exception out): release, before the client can retry."""
    slot = request.environ.get(SETTLE_KEY) if has_request_context() else None
    if slot:
        release(slot.pop(), f"Flask answered 500 after the view: {type(exception).__name__}")


class StreamedAnswer(TeeIterable):
    """A streamed answer's body on its way to the server (Flask already called
    ``start_response``). Settled by :meth:`TeeIterable.finish`: a failure before the first
    byte releases the key (the client got no answer, or the server's 500); a failure after it
    completes without the body. The body is never kept, so the record is the same whenever it
    completes: it completes at the first non-empty chunk, before that chunk goes out, and a
    retry is replayed from then on rather than answered 409 for as long as the stream lasts."""

    __slots__ = ()

    @classmethod
    def around(
        cls,
        pending: Pending,
        body: Iterable[bytes],
        environ: WSGIEnvironment,
        start_response: StartResponse,
    ) -> StreamedAnswer:
        tee = cls(pending.driver, pending.exchange, start_response, environ)
        # The view's head, as the record stores it: the hooks run again on every replay.
        tee.status, tee.headers, tee.reason = pending.status, pending.headers, pending.reason
        tee.copy.drop()
        tee.iterable = body
        return tee

    def _count(self, chunk: bytes) -> None:
        if chunk and not self.settled:
            self.finish()
