"""What idemkey reads of a PEP 3333 environ: its headers, on demand, and its body, bounded.

Shared by the WSGI middleware and the Flask extension (a Flask request is a WSGI environ), so a
body is read and checked one way: up to ``CONTENT_LENGTH`` and never past it (a peer would
hang), or, for a chunked request (``wsgi.input_terminated``), up to ``max_request_bytes + 1``;
a body shorter than its ``CONTENT_LENGTH`` is refused, never run on.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..http import Headers, Request

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment
    from werkzeug import Request as WerkzeugRequest

    from ..http import Response
    from ._lifecycle import Lifecycle

__all__ = ["EnvironHeaders", "read_body", "read_werkzeug_body", "request_of"]


class EnvironHeaders(Headers):
    """The request headers of a WSGI environ, read on demand: a request carries a dozen headers
    and idemkey looks at a handful, so copying them all would be most of the adapter's work.
    The server has already joined repeated field lines (PEP 3333): one value per name."""

    __slots__ = ("_environ",)

    def __init__(self, environ: WSGIEnvironment) -> None:  # no super(): nothing to copy
        self._environ = environ

    def get_all(self, name: str) -> list[str]:
        key = _environ_key(name)
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


def _environ_key(name: str) -> str:
    """``Idempotency-Key`` -> ``HTTP_IDEMPOTENCY_KEY``; Content-Type/-Length have no prefix."""
    key = _ENVIRON_KEYS.get(name)
    if key is None:
        key = name.upper().replace("-", "_")
        if key not in _UNPREFIXED:
            key = "HTTP_" + key
        if len(_ENVIRON_KEYS) < 256:  # header names come from code, but stay bounded anyway
            _ENVIRON_KEYS[name] = key
    return key


def request_of(environ: WSGIEnvironment, route: str = "") -> Request:
    """What idemkey sees of a WSGI request; ``route`` is the framework's template, if any."""
    path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
    query = environ.get("QUERY_STRING", "")
    method = environ["REQUEST_METHOD"].upper()
    return Request(method, path or "/", query, EnvironHeaders(environ), route)


def read_body(environ: WSGIEnvironment, lifecycle: Lifecycle) -> bytes | Response:
    """The request body, re-supplied to the app as BytesIO; or the problem to answer instead."""
    rejected = lifecycle.announced()
    if rejected is not None:
        return rejected
    length = lifecycle.declared
    if length is not None:
        want = length
    elif environ.get("wsgi.input_terminated"):  # chunked: the server marks the end with EOF
        want = lifecycle.exchange.policy.max_request_bytes + 1
    else:
        want = 0  # PEP 3333: no Content-Length means no body we may read
    stream = environ["wsgi.input"]
    parts, got = [], 0
    while got < want and (part := stream.read(want - got)):
        parts.append(part)
        got += len(part)
    body = b"".join(parts)
    rejected = lifecycle.received(body)
    if rejected is not None:
        return rejected
    environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(got)
    return body


def read_werkzeug_body(request: WerkzeugRequest, lifecycle: Lifecycle) -> bytes | Response:
    """:func:`read_body` for a werkzeug (Flask) request.

    Werkzeug opens its input stream on first use, from the environ, so the view then reads the
    copy ``read_body`` leaves there. When something before the view (a ``before_request`` hook)
    already opened that stream, werkzeug's cache is the only copy left.
    """
    if "stream" not in request.__dict__:
        return read_body(request.environ, lifecycle)
    rejected = lifecycle.announced()
    if rejected is not None:
        return rejected
    body = request.get_data(cache=True)
    rejected = lifecycle.received(body)
    return rejected if rejected is not None else body
