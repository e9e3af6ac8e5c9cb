"""What idemkey reads of a PEP 3333 environ: its headers, on demand, and its body, bounded.

Shared by the WSGI middleware and the Flask extension (a Flask request is a WSGI environ), so a
body is read and checked one way (:func:`capture`, then :func:`read_body`): up to
``CONTENT_LENGTH`` and never past it (on werkzeug's server a read past it hangs), or, for a
chunked request (``wsgi.input_terminated``), up to the limit plus one byte; then put back as a
``BytesIO``, so the app reads the same bytes. A body shorter than its ``CONTENT_LENGTH`` is
refused (400 ``incomplete_body``), one the server could not read (a malformed or aborted
chunked upload) too (400 ``invalid_body``): never run on, never a 500.

The Flask extension captures the body in a WSGI layer around ``app.wsgi_app``
(``_flask_config.BodyCapture``), before Flask runs any ``before_request`` hook: a hook that parses
``request.form`` (CSRF protection does) consumes the stream, and a fingerprint taken after it
would cover ``b""``, so two different operations would share one. The bytes wait in
``environ["idemkey.body"]`` for :func:`read_body`.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Final

from ..http import Headers, Request, parse_content_length

if TYPE_CHECKING:
    from collections.abc import Iterable

    from _typeshed import WriteableBuffer
    from _typeshed.wsgi import WSGIEnvironment
    from werkzeug import Request as WerkzeugRequest

    from ..http import Exchange, Response

__all__ = [
    "BODY_KEY",
    "BodyError",
    "EnvironHeaders",
    "capture",
    "environ_key",
    "path_text",
    "read_body",
    "read_werkzeug_body",
    "request_of",
]

#: Where a captured body (bytes, or the :class:`BodyError` met reading it) waits for the guard.
BODY_KEY: Final = "idemkey.body"


class EnvironHeaders(Headers):
    """The request headers of a WSGI environ, read on demand: a request carries a dozen headers
    and idemkey looks at a handful, so copying them all would be most of the adapter's work.
    The server has already joined repeated field lines (PEP 3333): one value per name."""

    __slots__ = ("_environ",)

    environ_keys: ClassVar[bool] = True

    def __init__(self, environ: WSGIEnvironment) -> None:  # no super(): nothing to copy
        self._environ = environ

    def raw_names(self) -> Iterable[str]:
        """The environ's keys (``HTTP_X_TENANT``, ``CONTENT_TYPE``, ...)."""
        return self._environ

    def get_all(self, name: str) -> list[str]:
        """Every value of the header ``name`` (any case), as the server joined them."""
        key = _ENVIRON_KEYS.get(name) or environ_key(name)  # a known name: no call
        value = self._environ.get(key)
        # Servers set CONTENT_TYPE/CONTENT_LENGTH to "" when the request had none; an empty
        # HTTP_* value is a header sent empty (an empty Idempotency-Key is invalid, not missing).
        if value is None or (not value and key in _UNPREFIXED):
            return []
        return [value]

    def __iter__(self) -> Iterator[str]:
        for key, value in self._environ.items():
            if key.startswith("HTTP_"):
                yield key[5:].replace("_", "-").lower()
            elif key in _UNPREFIXED and value:
                yield key.replace("_", "-").lower()

    def __len__(self) -> int:
        return sum(1 for _ in self)


_UNPREFIXED = frozenset({"CONTENT_TYPE", "CONTENT_LENGTH"})
_ENVIRON_KEYS: dict[str, str] = {}


def environ_key(name: str) -> str:
    """``Idempotency-Key`` -> ``HTTP_IDEMPOTENCY_KEY``; Content-Type/-Length have no prefix."""
    key = _ENVIRON_KEYS.get(name)
    if key is None:
        key = name.upper().replace("-", "_")
        if key not in _UNPREFIXED:
            key = "HTTP_" + key
        if len(_ENVIRON_KEYS) < 256:  # header names come from code, but stay bounded anyway
            _ENVIRON_KEYS[name] = key
    return key


_new_object = object.__new__


def path_text(path: str) -> str:
    """A WSGI path (``SCRIPT_NAME + PATH_INFO``) that is not ASCII, as the text an ASGI server
    gives for the same request.

    PEP 3333 hands the path over as its bytes (percent-decoded) in latin-1 text: ``/cafés``
    arrives as ``/cafÃ©s``. Read as it came, it matched no route declared ``/cafés`` (the
    request ran unguarded), and named another record and fingerprinted another way than the
    same request behind an ASGI server (a retry that crossed deployments ran again, or was a
    422 under Flask, which names the record by its rule). Its bytes are decoded as UTF-8 with
    U+FFFD for what is not UTF-8: uvicorn, hypercorn, daphne, granian and werkzeug's server
    read a path so (werkzeug's PATH_INFO already carries the U+FFFD, gunicorn's, waitress's
    and granian's the byte), so one request is one path behind every server. A path with a
    character past latin-1 (a hand-built environ, not PEP 3333's) is kept as it is. Django's
    ``WSGIRequest`` replaces PATH_INFO with its own reading, ``%E9`` for a byte that is not
    UTF-8 (its ``ASGIRequest`` gives the server's U+FFFD): the Django middleware keeps the
    server's PATH_INFO (``request_started`` comes first) and reads such a path through this
    function, so Django under WSGI gives the path every other deployment gives.
    """
    try:
        raw = path.encode("latin-1")
    except UnicodeEncodeError:
        return path
    return raw.decode("utf-8", "replace")


def request_of(environ: WSGIEnvironment, route: str = "") -> Request:
    """What idemkey sees of a WSGI request; ``route`` is the framework's template, if any."""
    path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
    if not path.isascii():  # one C call for the usual path, which is its own text
        path = path_text(path)
    query = environ.get("QUERY_STRING", "")
    method = environ["REQUEST_METHOD"].upper()
    # EnvironHeaders(environ) without its __init__ frame (hot path: every keyed request).
    headers = _new_object(EnvironHeaders)
    headers._environ = environ
    return Request(method, path or "/", query, headers, route)


@dataclass(frozen=True, slots=True)
class BodyError:
    """Why the body was not read whole: ``request_too_large`` (over the limit) or
    ``invalid_body`` (the server's chunk parser failed: a malformed or aborted upload)."""

    code: str
    detail: str


def capture(environ: WSGIEnvironment, limit: int, length: int | None = -1) -> bytes | BodyError:
    """Read the body (at most ``limit`` bytes count) and put it back for the app to read.

    ``length``: the ``CONTENT_LENGTH`` already parsed (an Exchange's ``declared``, read from
    this environ), or -1 to parse it here. A body shorter than it is returned as it is, with
    that length left in place: :meth:`Exchange.received <idemkey.http.Exchange.received>`
    refuses it.
    """
    stream = environ["wsgi.input"]
    if length == -1:
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
    if length is None or got == length:  # a short body keeps its length: it is refused
        environ["CONTENT_LENGTH"] = str(got)
    return body


def read_body(environ: WSGIEnvironment, exchange: Exchange) -> bytes | Response:
    """The body the client sent (captured earlier by the Flask extension's ``BodyCapture``, or
    now), or the problem to answer instead."""
    captured: bytes | BodyError | None = environ.pop(BODY_KEY, None)
    if captured is None:
        # declared: the environ's CONTENT_LENGTH, parsed by begin() (request_of's headers).
        # capture refuses a declared length over the limit before it reads, as announced()
        # would (one call less on every keyed request).
        captured = capture(environ, exchange.policy.max_request_bytes, exchange.declared)
    else:
        rejected = exchange.announced()
        if rejected is not None:
            return rejected
    if isinstance(captured, BodyError):
        if captured.code == "request_too_large":
            return exchange.reject_too_large()
        return exchange.unreadable(400, captured.code, captured.detail)
    # Over this view's limit (captured under a larger one), or short: refused there.
    rejected = exchange.received(captured)
    return rejected if rejected is not None else captured


def read_werkzeug_body(request: WerkzeugRequest, exchange: Exchange) -> bytes | Response:
    """:func:`read_body` for a werkzeug (Flask) request.

    Without the ``BodyCapture`` layer (``app.wsgi_app`` replaced after ``init_app``), a
    stream something already consumed (``get_data``, ``form``, ``stream``) cannot be
    fingerprinted: what is left would make different operations one, so it is refused.
    """
    touched = "stream" in request.__dict__ or "form" in request.__dict__
    if BODY_KEY not in request.environ and (touched or hasattr(request, "_cached_data")):
        return exchange.unreadable(
            500,
            "body_unavailable",
            "the request body was read before idemkey saw it; keep the layer Idemkey.init_app "
            "puts around app.wsgi_app",
        )
    return read_body(request.environ, exchange)


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
