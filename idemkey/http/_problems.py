"""Idemkey's own answers (400, 409, 413, 422, 503) as RFC 9457 problem documents.

:func:`problem` builds the ``application/problem+json`` response, :func:`render` the one in the
policy's format (``Policy.render_problem``, handed a :class:`Problem`). :mod:`idemkey.http`
re-exports them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Protocol

from ..events import logger
from ._messages import Response

__all__ = ["PROBLEM_TYPE", "Problem", "problem", "render"]

PROBLEM_TYPE: Final = "urn:idemkey:problem:"

_TITLES: Final = {
    "missing_key": "Idempotency-Key header is missing",
    "invalid_key": "Idempotency-Key header is invalid",
    "key_reused": "Idempotency-Key reused with a different request",
    "in_flight": "A request with this Idempotency-Key is still being processed",
    "request_too_large": "Request body too large for an idempotent request",
    "incomplete_body": "Request body shorter than its Content-Length",
    "invalid_body": "Request body could not be read",
    "body_unavailable": "Request body was read before idemkey could fingerprint it",
    "store_unavailable": "Idempotency store unavailable",
    "record_unreadable": "Stored response unreadable",
}


def problem(
    status: int, code: str, detail: str, headers: Iterable[tuple[str, str]] = ()
) -> Response:
    """An RFC 9457 ``application/problem+json`` response with a stable ``code`` member."""
    body = json.dumps(
        {
            "type": PROBLEM_TYPE + code,
            "title": _TITLES.get(code, code),
            "status": status,
            "detail": detail,
            "code": code,
        },
        separators=(",", ":"),
    ).encode()
    return Response(
        status,
        [
            ("Content-Type", "application/problem+json"),
            ("Content-Length", str(len(body))),
            *headers,
        ],
        body,
    )


@dataclass(frozen=True, slots=True)
class Problem:
    """An answer idemkey gives on its own (400, 409, 413, 422, 503), before it is rendered.

    ``Policy.render_problem`` receives it and returns ``(content_type, body)``; the status and
    the headers (``Retry-After`` on 409 and 503) stay idemkey's, so clients keep their retry
    logic whatever the body looks like. ``code`` is stable (``missing_key``, ``invalid_key``,
    ``key_reused``, ``in_flight``, ``request_too_large``, ``incomplete_body``,
    ``invalid_body``, ``body_unavailable``, ``store_unavailable``, ``record_unreadable``);
    ``retry_after`` is in whole seconds.
    """

    status: int
    code: str
    title: str
    detail: str
    retry_after: int | None = None


class Renders(Protocol):
    """What :func:`render` reads of a :class:`~idemkey.Policy`; a protocol, so no import cycle."""

    @property
    def render_problem(self) -> Callable[[Problem], tuple[str, bytes]] | None: ...


def render(
    policy: Renders, status: int, code: str, detail: str, headers: Iterable[tuple[str, str]] = ()
) -> Response:
    """The problem response in ``policy``'s format: RFC 9457 unless ``render_problem`` is set.

    A renderer that raises or returns something else than ``(str, bytes)`` is logged and the
    RFC 9457 body is sent instead: a bad hook never turns a 409 into a 500.
    """
    renderer = policy.render_problem
    if renderer is None:
        return problem(status, code, detail, headers)
    extra = list(headers)
    retry = next((v for n, v in extra if n.lower() == "retry-after"), None)
    described = Problem(
        status, code, _TITLES.get(code, code), detail, int(retry) if retry else None
    )
    try:
        content_type, body = renderer(described)
        if not isinstance(content_type, str) or not isinstance(body, bytes):
            raise TypeError(f"expected (str, bytes), got ({content_type!r}, {type(body)!r})")
        content_type.encode("latin-1")  # a header value: refuse what no server can send
    except Exception:
        logger.exception("idemkey Policy.render_problem failed; answering RFC 9457 instead")
        return problem(status, code, detail, extra)
    fields = [("Content-Type", content_type), ("Content-Length", str(len(body))), *extra]
    return Response(status, fields, body)
