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
* a streamed answer (a generator) as the WSGI middleware's
  :class:`~._wsgi_response.StreamedBody` decides (Django's streams too): released on a
  failure before its first byte, completed (without its body, never kept) at its first
  non-empty chunk or when exhausted;
* a file the server sends itself (``send_file``'s body is the server's ``wsgi.file_wrapper``
  object): completed without its body at once, and the object handed to the server as it is,
  since gunicorn sends only that with ``sendfile`` and waitress only that from its buffer (as
  the Django adapter completes a ``FileResponse``).

The outermost guarded view reserves the slot (a None in it) before it runs, so a guarded view
it calls finds it taken. On the outer view's record (a route delegating to another guarded
view, a view calling itself) that view is the same work, run under the outer view's claim;
on records of its own it settles in that view (:func:`settle_nested`): the outer view's
answer is the one the client is sent. A nested stream settles as it is sent (a
:class:`StreamedBody` in the response's place), or is released when the request ends if it
never was (the outer view discarded it): :func:`served`, :func:`release_unsent`. A view
dispatched with no BodyCapture around it (a request context of its own) finds no slot, and
settles in the view as the extension did before. Nothing may leave a claim open: the
heartbeat would renew it, and every retry get a 409, for as long as the process runs.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Final, cast

import msgspec
from flask import has_request_context, request

from ._wsgi_response import ClosingBody, StreamedBody

if TYPE_CHECKING:
    from collections.abc import Iterable

    from _typeshed.wsgi import WSGIEnvironment
    from flask import Response as FlaskResponse

    from ..http import Exchange
    from ._sync_driver import Driver

__all__ = [
    "NESTED_KEY",
    "SETTLE_KEY",
    "Pending",
    "complete",
    "release",
    "release_unsent",
    "released_by_flask",
    "sent_by_server",
    "served",
    "settle_nested",
]

#: Where BodyCapture's slot (a list) waits for the guarded view's :class:`Pending` answer
#: (None while the outermost guarded view runs).
SETTLE_KEY: Final = "idemkey.settle"

#: Why a nested stream the server never pulled is released.
NEVER_SERVED: Final = "the response never reached the server"

#: The streams of the guarded views called from inside another (a list of
#: :class:`StreamedBody`), set only when there is one: each holds its claim until it is sent.
NESTED_KEY: Final = "idemkey.nested"


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
    if not has_request_context():
        return
    environ = request.environ
    reason = f"Flask answered 500 after the view: {type(exception).__name__}"
    slot = environ.get(SETTLE_KEY)
    try:
        if slot and slot[-1] is not None:  # None: the view still runs, and releases if it raises
            release(slot.pop(), reason)
    finally:
        release_unsent(environ, reason)  # the 500 goes out in place of any nested stream


def sent_by_server(body: Iterable[bytes], environ: WSGIEnvironment) -> bool:
    """Whether ``body`` is the server's own ``wsgi.file_wrapper`` object (``send_file``)."""
    wrapper = environ.get("wsgi.file_wrapper")
    return isinstance(wrapper, type) and isinstance(body, wrapper)


def settle_nested(pending: Pending, response: FlaskResponse, environ: WSGIEnvironment) -> None:
    """Settle the answer of a guarded view called from inside another (on records of its own),
    whose response the outer view may send or discard: a stream (not the server's file) is
    completed once it is sent, as the outermost one's is (:class:`StreamedBody` takes the
    response's place, and werkzeug closes it with the response), and is released at the
    request's end if it never was; any other answer is stored now."""
    # Chunks of text too: werkzeug encodes what the stream yields as it sends it.
    body = cast("Iterable[bytes]", response.response)
    if not pending.streamed or sent_by_server(body, environ):
        complete(pending)
        return
    head = (pending.status, pending.headers, pending.reason)
    stream = StreamedBody.around(pending.driver, pending.exchange, head, body, environ)
    response.response = stream
    environ.setdefault(NESTED_KEY, []).append(stream)


def release_unsent(environ: WSGIEnvironment, reason: str) -> None:
    """Release every nested stream the server never pulled (:meth:`StreamedBody.never_served`):
    the client never got its head."""
    streams: list[StreamedBody] = environ.pop(NESTED_KEY, None) or []
    failures: list[BaseException] = []
    for stream in streams:
        try:
            stream.never_served(reason)
        except BaseException as exc:  # one release failing must not leave the others open
            failures.append(exc)
    if failures:
        raise failures[0]


def served(pending: Pending, body: Iterable[bytes], environ: WSGIEnvironment) -> Iterable[bytes]:
    """BodyCapture's settling of the outer view's answer when guarded views it called answered
    with streams: as BodyCapture settles it, and the body handed to the server in a
    a :class:`ClosingBody`, whose close releases the nested streams never sent."""
    try:
        if pending.streamed and not sent_by_server(body, environ):
            head = (pending.status, pending.headers, pending.reason)
            body = StreamedBody.around(pending.driver, pending.exchange, head, body, environ)
        else:
            complete(pending, body)
            if sent_by_server(body, environ):  # the server's file: no nested stream is in it
                release_unsent(environ, NEVER_SERVED)
                return body  # as it is: the server sends only its own object with sendfile
    except BaseException:
        release_unsent(environ, NEVER_SERVED)
        raise
    return ClosingBody(body, functools.partial(release_unsent, environ, NEVER_SERVED))
