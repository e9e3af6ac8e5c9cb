"""Idemkey's own answers (400, 409, 410, 413, 422, 500, 503) as RFC 9457 problem documents.

:func:`problem` builds the ``application/problem+json`` response, :func:`render` the one in the
policy's format (``Policy.render_problem``, handed a :class:`Problem`). :mod:`idemkey.http`
re-exports them. Every problem carries ``retention`` (how long a key is honoured) and ``retry``
(what the client should do next), the latter from :data:`RETRY`, the one table of it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from ..events import logger
from ._messages import Response

__all__ = [
    "PROBLEM_TYPE",
    "RETRY",
    "Problem",
    "RetryAdvice",
    "problem",
    "render",
    "retention_seconds",
]

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
    "invalid_scope": "The server could not tell whose Idempotency-Key this is",
    "store_unavailable": "Idempotency store unavailable",
    "record_unreadable": "Stored response unreadable",
    "key_expired": "Idempotency-Key expired",
    "response_lost": "Request processed, its response was not recorded",
    "lease_lost": "This request lost its claim on the Idempotency-Key",
}

#: What a client should do after a problem: send the request again with the same key (nothing
#: ran, or it is still running: the key will answer), with a new key (this key can never
#: serve this request), or not at all (resending cannot help, and a new key would run the
#: operation a second time).
RetryAdvice = Literal["same_key", "new_key", "never"]

#: The one table of the ``retry`` member, by problem code (docs/reference: "Problems").
RETRY: Final[dict[str, RetryAdvice]] = {
    "missing_key": "new_key",  # send a key: a fresh one, nothing was recorded under any
    "invalid_key": "new_key",  # this value can never be a key: send a valid one
    "key_reused": "new_key",  # the key is bound to another request for its retention
    "in_flight": "same_key",  # the first call is running: after Retry-After, it answers
    "request_too_large": "never",  # the same request is refused again, whatever the key
    "incomplete_body": "same_key",  # cut off on the way: nothing was claimed
    "invalid_body": "same_key",  # the server could not read it: nothing was claimed
    "body_unavailable": "never",  # the app read the body first: a server bug, not the client's
    "invalid_scope": "never",  # the app's scope function returned no str: the server's bug
    "store_unavailable": "same_key",  # nothing ran; the store answers after Retry-After
    "record_unreadable": "same_key",  # stored, but unreadable by this release (a rolling deploy)
    "key_expired": "never",  # it ran once, its record is gone: a new key would run it again
    "response_lost": "never",  # its effect committed, its response is lost: look it up
    "lease_lost": "same_key",  # its claim lapsed mid-run: the key answers with the outcome
}


#: The problems ``Policy.mark_retryable`` marks with :data:`SHOULD_RETRY`: the ones a retry
#: with the same key resolves by itself (the first call finishes; the store comes back).
MARKED_RETRYABLE: Final = frozenset({"in_flight", "store_unavailable", "lease_lost"})
#: The header Stainless-generated clients obey before their own status rules (which retry
#: 408, 429 and 5xx, never a 409): ``true`` makes them retry after ``Retry-After``, with the
#: same key.
SHOULD_RETRY: Final = ("x-should-retry", "true")


def retention_seconds(ttl: float) -> int:
    """``Policy.ttl`` as the ``retention`` member and header say it: whole seconds, rounded
    down, so a client never counts on a key longer than it is honoured."""
    return int(ttl)


def problem(
    status: int,
    code: str,
    detail: str,
    headers: Iterable[tuple[str, str]] = (),
    retention: int | None = None,
) -> Response:
    """An RFC 9457 ``application/problem+json`` response with a stable ``code`` member, and
    the ``retention`` (seconds; left out when None) and ``retry`` (:data:`RETRY`) members."""
    document: dict[str, object] = {
        "type": PROBLEM_TYPE + code,
        "title": _TITLES.get(code, code),
        "status": status,
        "detail": detail,
        "code": code,
    }
    if retention is not None:
        document["retention"] = retention
    document["retry"] = RETRY.get(code, "never")
    body = json.dumps(
        document,
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
    """An answer idemkey gives on its own (400, 409, 410, 413, 422, 500, 503), before it is
    rendered.

    ``Policy.render_problem`` receives it and returns ``(content_type, body)``; the status and
    the headers (``Retry-After`` on 409 and 503) stay idemkey's, so clients keep their retry
    logic whatever the body looks like. ``code`` is stable (``missing_key``, ``invalid_key``,
    ``key_reused``, ``in_flight``, ``request_too_large``, ``incomplete_body``,
    ``invalid_body``, ``body_unavailable``, ``invalid_scope``, ``store_unavailable``,
    ``record_unreadable``, ``key_expired``, ``response_lost``, ``lease_lost``); ``retry_after``
    is in whole seconds; ``retention`` is how long a key is honoured, in whole seconds
    (``Policy.ttl``); ``retry`` is what the client should do next (:data:`RETRY`:
    ``"same_key"``, ``"new_key"`` or ``"never"``).
    """

    status: int
    code: str
    title: str
    detail: str
    retry_after: int | None = None
    retention: int | None = None
    retry: RetryAdvice = "never"


class Renders(Protocol):
    """What :func:`render` reads of a :class:`~idemkey.Policy`; a protocol, so no import cycle."""

    @property
    def render_problem(self) -> Callable[[Problem], tuple[str, bytes]] | None: ...

    @property
    def ttl(self) -> float: ...

    @property
    def retention_header(self) -> str | None: ...

    @property
    def mark_retryable(self) -> bool: ...


def render(
    policy: Renders, status: int, code: str, detail: str, headers: Iterable[tuple[str, str]] = ()
) -> Response:
    """The problem response in ``policy``'s format: RFC 9457 unless ``render_problem`` is set.

    A renderer that raises or returns something else than ``(str, bytes)`` is logged and the
    RFC 9457 body is sent instead: a bad hook never turns a 409 into a 500.
    """
    renderer = policy.render_problem
    retention = retention_seconds(policy.ttl)
    if policy.mark_retryable and code in MARKED_RETRYABLE:
        headers = [*headers, SHOULD_RETRY]
    if policy.retention_header is not None:
        headers = [*headers, (policy.retention_header, str(retention))]
    if renderer is None:
        return problem(status, code, detail, headers, retention)
    extra = list(headers)
    retry = next((v for n, v in extra if n.lower() == "retry-after"), None)
    described = Problem(
        status,
        code,
        _TITLES.get(code, code),
        detail,
        int(retry) if retry else None,
        retention,
        RETRY.get(code, "never"),
    )
    try:
        content_type, body = renderer(described)
        if not isinstance(content_type, str) or not isinstance(body, bytes):
            raise TypeError(f"expected (str, bytes), got ({content_type!r}, {type(body)!r})")
        content_type.encode("latin-1")  # a header value: refuse what no server can send
        if not content_type.isprintable():  # CR, LF, NUL: a split head, a 500, a drop
            raise ValueError(f"not a header value: {content_type!r:.60}")
    except Exception:
        logger.exception("idemkey Policy.render_problem failed; answering RFC 9457 instead")
        return problem(status, code, detail, extra, retention)
    fields = [("Content-Type", content_type), ("Content-Length", str(len(body))), *extra]
    return Response(status, fields, body)
