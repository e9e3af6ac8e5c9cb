"""The request body of a keyed Django request: read once, bounded, for the fingerprint, and
left for the view (Django keeps ``request.body`` and parses ``request.POST`` from it).

The middleware's ``__call__`` reads it (:func:`take_body`) before any ``process_view`` runs
(CSRF's reads ``request.POST``, consuming a multipart stream); ``process_view`` hands it to the
exchange (:func:`read_body`).
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from django.core.exceptions import RequestDataTooBig
from django.http import RawPostDataException, UnreadablePostError

from ..http import parse_content_length
from ._environ import BodyError, capture

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer
    from django.http import HttpRequest

    from ..http import Exchange, Response

__all__ = ["UNREADABLE_ATTRIBUTE", "read_body", "take_body"]

#: Where ``__call__`` leaves the failure of a body it could not read, for ``process_view``.
UNREADABLE_ATTRIBUTE = "_idemkey_unreadable"


def read_body(request: HttpRequest, exchange: Exchange) -> bytes | Response:
    """The body (Django keeps it for the view), or the 413 / 400 to answer instead."""
    rejected = exchange.announced()
    if rejected is not None:
        return rejected
    body = request.__dict__.pop(UNREADABLE_ATTRIBUTE, None) or take_body(
        request, exchange.policy.max_request_bytes
    )
    if isinstance(body, BodyError):
        if body.code == "request_too_large":
            return exchange.reject_too_large()
        # invalid_body: the client's upload broke (400, same_key); body_unavailable: something
        # read the stream before idemkey's __call__ (500: the app's order, not the client).
        status = 500 if body.code == "body_unavailable" else 400
        return exchange.unreadable(status, body.code, body.detail)
    rejected = exchange.received(body)
    return rejected if rejected is not None else body


def take_body(request: HttpRequest, limit: int) -> bytes | BodyError:
    """The body as ``request.body`` (Django keeps it for the view and parses ``request.POST``
    from it), at most ``limit`` bytes, or why it cannot be fingerprinted.

    A body over ``limit`` or over Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is left unread (a
    chunked one readable again), so a view that is not guarded, or guarded with a larger
    limit, still gets it. A stream that fails keeps failing: a view that is not guarded meets
    the error Django would have raised without idemkey.
    """
    meta = request.META
    length = parse_content_length(meta.get("CONTENT_LENGTH"))
    if length is not None and length > limit:
        return BodyError("request_too_large", f"Content-Length {length} is over {limit}")
    if length is None and meta.get("wsgi.input_terminated"):
        # A chunked body under WSGI: Django reads no body without a Content-Length, so read it
        # here, as the WSGI middleware does (bounded, every part, a failing read refused), and
        # hand it to Django as the request's stream, its length in CONTENT_LENGTH.
        chunked = capture(meta, limit, None)
        if isinstance(chunked, BodyError):
            return chunked
        request._stream = io.BytesIO(chunked)
        request._read_started = False
    try:
        body: bytes = request.body
    except RequestDataTooBig:  # over Django's own DATA_UPLOAD_MAX_MEMORY_SIZE, checked unread
        return BodyError("request_too_large", "over DATA_UPLOAD_MAX_MEMORY_SIZE")
    except RawPostDataException:
        return BodyError(
            "body_unavailable",
            "the request body was read before idemkey saw it; list "
            "IdempotencyMiddleware before the middleware that reads request.POST",
        )
    except Exception as exc:  # UnreadablePostError (the server's OSError), or its own type
        error = exc.__cause__ if isinstance(exc, UnreadablePostError) and exc.__cause__ else exc
        if request._read_started:  # the stream failed: it fails again for whoever reads next
            request._stream = _Failing(error)
            request._read_started = False
        return BodyError("invalid_body", f"the body could not be read ({type(error).__name__})")
    return body


class _Failing(io.RawIOBase):
    """A request stream that raises what the server's stream raised, at every read."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        raise self.error
