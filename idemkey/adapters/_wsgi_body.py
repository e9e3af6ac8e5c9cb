"""The body of a keyed WSGI request: read once, as the client sent it, for the fingerprint.

Shared by the WSGI middleware and the Flask extension, so both answer a short, broken or
oversized body the same way. The body is read from ``wsgi.input`` up to ``CONTENT_LENGTH``
(never past it: on werkzeug's server a read past it hangs), or for a chunked request
(``wsgi.input_terminated``) up to the limit plus one byte, and put back as a ``BytesIO`` with
its ``CONTENT_LENGTH``, so the app reads the same bytes.

The Flask extension reads it in a WSGI layer around ``app.wsgi_app`` (:class:`BodyCapture`),
before Flask runs any ``before_request`` hook: a hook that parses ``request.form`` (CSRF
protection does) consumes the stream, and a fingerprint taken after it would cover ``b""``, so
two different operations would share one. The bytes wait in ``environ["idemkey.body"]``.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ..http import Exchange, Response, parse_content_length, problem

if TYPE_CHECKING:
    from collections.abc import Iterable

    from _typeshed import WriteableBuffer
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = ["BODY_KEY", "BodyCapture", "BodyError", "capture", "read_body"]

#: Where a captured body (bytes, or the :class:`BodyError` met reading it) waits for the guard.
BODY_KEY: Final = "idemkey.body"


@dataclass(frozen=True, slots=True)
class BodyError:
    """Why the body cannot be fingerprinted: ``request_too_large``, ``incomplete_body`` (the
    client stopped before its Content-Length) or ``invalid_body`` (the server's chunk parser
    failed: a malformed or aborted chunked upload)."""

    code: str
    detail: str


def capture(environ: WSGIEnvironment, limit: int) -> bytes | BodyError:
    """Read the body (at most ``limit`` bytes count) and put it back for the app to read."""
    stream = environ["wsgi.input"]
    length = parse_content_length(environ.get("CONTENT_LENGTH"))
    if length is not None:
        if length > limit:
            return BodyError("request_too_large", f"Content-Length {length} is over {limit}")
        want = length
    elif environ.get("wsgi.input_terminated"):  # chunked: the server marks the end with EOF
        want = limit + 1
    else:
        want = 0  # PEP 3333: no Content-Length means no body we may read
    parts: list[bytes] = []
    got = 0
    try:
        while got < want and (part := stream.read(want - got)):
            parts.append(part)
            got += len(part)
    except Exception as exc:  # each server raises its own type (gunicorn's
        # InvalidChunkSize, NoMoreData; werkzeug's OSError): all mean the body is unreadable.
        environ["wsgi.input"] = io.BytesIO(b"".join(parts))
        return BodyError("invalid_body", f"the body could not be read ({type(exc).__name__})")
    body = b"".join(parts)
    if got > limit:  # chunked and over: the rest stays readable for an unguarded view
        environ["wsgi.input"] = io.BufferedReader(_Rejoined(body, stream))
        return BodyError("request_too_large", f"the chunked body is over {limit} bytes")
    environ["wsgi.input"] = io.BytesIO(body)
    if length is not None and got < length:  # the client went away mid-body: never run on half
        return BodyError("incomplete_body", f"the body ended after {got} of {length} bytes")
    environ["CONTENT_LENGTH"] = str(got)
    return body


def read_body(environ: WSGIEnvironment, exchange: Exchange) -> bytes | Response:
    """The body the client sent (captured earlier, or now), or the problem to answer."""
    limit = exchange.policy.max_request_bytes
    captured: bytes | BodyError | None = environ.pop(BODY_KEY, None)
    if captured is None:
        captured = capture(environ, limit)
    if isinstance(captured, BodyError):
        if captured.code == "request_too_large":
            return exchange.too_large_response()
        return problem(400, captured.code, captured.detail)
    if exchange.too_large(len(captured)):  # captured under a larger limit than this view's
        return exchange.too_large_response()
    return captured


class BodyCapture:
    """A WSGI layer that captures a keyed request's body before the framework sees it.

    ``limit_for(environ)`` says whether the request is keyed (None: pass it through untouched)
    and with which byte limit.
    """

    def __init__(
        self, app: WSGIApplication, limit_for: Callable[[WSGIEnvironment], int | None]
    ) -> None:
        self.app = app
        self.limit_for = limit_for

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        limit = self.limit_for(environ)
        if limit is not None:
            environ[BODY_KEY] = capture(environ, limit)
        return self.app(environ, start_response)


class _Rejoined(io.RawIOBase):
    """The bytes already read, then the rest of the original stream."""

    def __init__(self, head: bytes, rest: io.IOBase) -> None:
        self.head, self.rest = memoryview(head), rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        if self.head:
            n = min(len(view), len(self.head))
            view[:n], self.head = self.head[:n], self.head[n:]
            return n
        data = self.rest.read(len(view))
        view[: len(data)] = data
        return len(data)
