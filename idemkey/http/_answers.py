"""The answers an :class:`~idemkey.http.Exchange` renders (no I/O, no events).

The replay of a stored response, the headers idemkey adds to a first answer (and the CORS
exposure of them, :func:`exposed_headers`), idemkey's own 409, 410, 413, 422 and 503 problems,
and the stored form of the app's answer (:func:`plan_for`: complete with it or release). The
exchange decides which one applies and reports it; each function here only builds it from the
policy. :mod:`idemkey.http` re-exports the public names.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from .._codec import StoredResponse, _sendable, encode_response
from .._core import retry_after_seconds
from ._messages import Complete, Release, Response
from ._problems import render, retention_seconds

if TYPE_CHECKING:
    from ..policy import Policy

__all__ = [
    "BODY_NOT_KEPT_HEADER",
    "EXPOSE_HEADER",
    "REPLAYED_HEADER",
    "RESPONSE_LOST",
    "UNREADABLE_HEAD",
    "exposed_headers",
    "first_headers",
    "in_flight",
    "key_expired",
    "key_reused",
    "lease_lost",
    "plan_for",
    "record_unreadable",
    "replayed",
    "response_lost",
    "store_unavailable",
    "too_large",
]

REPLAYED_HEADER: Final = "Idempotent-Replayed"
#: On a replay whose body was too large or streamed to keep: the body is empty on purpose.
BODY_NOT_KEPT_HEADER: Final = "Idempotent-Body-Not-Kept"


#: Where a browser's script may read the headers idemkey sets (CORS, the Fetch standard).
EXPOSE_HEADER: Final = "Access-Control-Expose-Headers"


#: The detail of the 409 ``response_lost`` problem (:meth:`Exchange.response_lost`).
RESPONSE_LOST: Final = (
    "this key's request was processed and its effect committed, but its response was not "
    "recorded (the server stopped in between); it is not run again: look its outcome up, and "
    "use a new key only for a new operation"
)


def exposed_headers(policy: Policy) -> tuple[str, ...]:
    """Every response header idemkey may set under ``policy``: what a CORS layer placed
    outside idemkey should list in ``Access-Control-Expose-Headers`` (``expose_headers=``
    of Starlette's CORSMiddleware, ``CORS_EXPOSE_HEADERS`` of django-cors-headers), so that
    a browser's script can read them. Inside idemkey, a response that carries
    ``Access-Control-Allow-Origin`` gets its list extended with the ones it sets."""
    names = [REPLAYED_HEADER, BODY_NOT_KEPT_HEADER, "Retry-After"]
    if policy.retention_header is not None:
        names.append(policy.retention_header)
    return tuple(names)


def _exposing(headers: list[tuple[str, str]], names: Iterable[str]) -> None:
    """When ``headers`` answer a CORS request (they carry Access-Control-Allow-Origin), list
    ``names`` in their Access-Control-Expose-Headers, in place; a ``*`` already exposes all."""
    if not any(n.lower() == "access-control-allow-origin" for n, _ in headers):
        return
    for index, (name, value) in enumerate(headers):
        if name.lower() == "access-control-expose-headers":
            listed = {v.strip().lower() for v in value.split(",")}
            if "*" in listed:
                return
            missing = [n for n in names if n.lower() not in listed]
            if missing:
                headers[index] = (
                    name,
                    ", ".join([value, *missing]) if value.strip() else ", ".join(missing),
                )
            return
    headers.append((EXPOSE_HEADER, ", ".join(names)))


_RELEASE_SERVER_ERROR: Final = Release("server error")
_RELEASE_NEVER_BEGAN: Final = Release("the request never began")
_RELEASE_INVALID_STATUS: Final = Release("the app answered a status outside 200-599")
UNREADABLE_HEAD: Final = Release("the app's status or headers are not valid: nothing to replay")


def replayed(policy: Policy, response: StoredResponse) -> Response:
    """The replay of a stored response, marked ``Idempotent-Replayed``."""
    # The headers as the first client got them, in order. A Content-Length is set to the
    # body sent now (the stored body may have been left out on purpose), where it stood;
    # none is added where the first answer had none (a 204 must not carry one).
    headers = list(response.headers)
    cors = False  # the first answer was to a CORS request: expose what is added here
    for index, (name, _) in enumerate(headers):
        if len(name) == 14 and name.lower() == "content-length":
            headers[index] = (name, str(len(response.body)))
        elif len(name) == 27 and name.lower() == "access-control-allow-origin":
            cors = True
    headers.append((REPLAYED_HEADER, "true"))
    if not response.body_kept:
        headers.append((BODY_NOT_KEPT_HEADER, "true"))
    retention = policy.retention_header
    if retention is not None:
        headers.append((retention, str(retention_seconds(policy.ttl))))
    if cors:
        added = [REPLAYED_HEADER]
        if not response.body_kept:
            added.append(BODY_NOT_KEPT_HEADER)
        if retention is not None:
            added.append(retention)
        _exposing(headers, added)
    return Response(response.status, headers, response.body, response.reason)


def first_headers(policy: Policy, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``headers`` with what the policy adds to the app's own answer (``mark_first_responses``,
    ``retention_header``), as a new list: what is stored and replayed is the app's answer."""
    mark, retention = policy.mark_first_responses, policy.retention_header
    sent, added = list(headers), []
    if mark:
        sent.append((REPLAYED_HEADER, "false"))
        added.append(REPLAYED_HEADER)
    if retention is not None:
        sent.append((retention, str(retention_seconds(policy.ttl))))
        added.append(retention)
    _exposing(sent, added)
    return sent


def too_large(policy: Policy) -> Response:
    """The 413 for a body over ``max_request_bytes``."""
    detail = f"keyed requests may carry at most {policy.max_request_bytes} bytes"
    return render(policy, 413, "request_too_large", detail)


def key_reused(policy: Policy) -> Response:
    """The answer (422 by default, ``mismatch_status``) to a key sent with another request."""
    status = policy.mismatch_status
    return render(
        policy,
        status,
        "key_reused",
        "this key was already used with a different request: resend the identical "
        "request for a retry; use a new key only for a new operation",
    )


def in_flight(policy: Policy, retry_after: float) -> Response:
    """The 409 to a retry while the first request runs: retry after ``retry_after`` s."""
    # As a guard's RequestInFlightError says it (whole seconds here).
    retry = str(retry_after_seconds(retry_after))
    return render(
        policy,
        409,
        "in_flight",
        "a request with this key is still being processed; retry later",
        [("Retry-After", retry)],
    )


def key_expired(policy: Policy, completed_at: float) -> Response:
    """The 410 to a key whose record completed at ``completed_at`` (Unix s) and expired."""
    ttl = retention_seconds(policy.ttl)
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(completed_at))
    return render(
        policy,
        410,
        "key_expired",
        f"this key's request completed at {when} and its record expired {ttl} s later; "
        "it is not run again: look its outcome up, and use a new key only for a new "
        "operation",
    )


def response_lost(policy: Policy) -> Response:
    """The 409 to a key whose effect committed without its response (no Retry-After:
    retrying cannot help)."""
    return render(policy, 409, "response_lost", RESPONSE_LOST)


def lease_lost(policy: Policy, committed: bool) -> Response:
    """The 409 to a handler that raised ``LeaseLostError`` before its response started (its
    claim lapsed, or ``fenced()`` refused): the key is released, and the retry with the same
    key gets the outcome (a replay, ``in_flight``, or a run), never a second effect."""
    if committed:
        done = "its effect committed in the database and does not run again"
    else:
        done = "no fenced write of this run is in the database"
    detail = (
        "this request lost its claim on the Idempotency-Key (its lease lapsed and another run "
        f"took the key over, or the record vanished from the store); {done}: send it again "
        "with the same key for the outcome"
    )
    return render(policy, 409, "lease_lost", detail, [("Retry-After", "1")])


def store_unavailable(policy: Policy) -> Response:
    """The 503 when Redis failed before the app ran (``on_store_error="closed"``)."""
    retry = str(retry_after_seconds(policy.store_error_retry_after))
    return render(
        policy,
        503,
        "store_unavailable",
        "the idempotency store is unavailable; retry with the same key",
        [("Retry-After", retry)],
    )


def record_unreadable(policy: Policy, detail: str) -> Response:
    """The 503 for a stored response this release cannot read (a rolling deploy)."""
    return render(policy, 503, "record_unreadable", detail, [("Retry-After", "1")])


def plan_for(
    policy: Policy,
    status: int,
    headers: Iterable[tuple[str, str]],
    body: bytes | None,
    reason: str = "",
) -> Complete | Release:
    """Store the handler's answer or release the key, from its status.

    ``body`` is None when the response was streamed or over ``max_response_bytes``: the
    record then completes without it, so the handler still never runs twice. ``reason``
    is the status line's reason phrase (WSGI), replayed as it was sent.
    """
    # A 1xx is no answer (an interim one: 103 Early Hints), and a status outside 100-599 not
    # HTTP: a stored copy could never be replayed.
    if not 200 <= status <= 599:
        return _RELEASE_INVALID_STATUS
    if status >= 500 and not policy.store_server_errors:
        return _RELEASE_SERVER_ERROR
    if status in policy.release_statuses:
        return _RELEASE_NEVER_BEGAN
    if status in (204, 304):  # no server sends a body with them, whatever the app gave
        body = b""
    deny, allow = policy.header_denylist, policy.header_allowlist
    try:
        # A list comprehension, not a generator: one call, not one resume per header.
        kept = tuple(
            [
                (name, value)
                for name, value in headers
                if (low := name.lower()) not in deny and (allow is None or low in allow)
            ]
        )
        if body is None:
            stored = StoredResponse(status, kept, b"", body_kept=False, reason=reason)
        else:
            stored = StoredResponse(status, kept, body, reason=reason)
        if _sendable(stored):  # as a replay checks it: what it refuses is never stored
            return Complete(encode_response(stored, policy.compress_at))
    except (TypeError, ValueError, AttributeError):  # a line that is no pair of str
        pass
    lines, reason = _sendable_lines(headers, deny, allow, reason)
    if body is None:
        stored = StoredResponse(status, lines, b"", body_kept=False, reason=reason)
    else:
        stored = StoredResponse(status, lines, body, reason=reason)
    return Complete(encode_response(stored, policy.compress_at))


def _sendable_lines(
    headers: Iterable[object], deny: frozenset[str], allow: frozenset[str] | None, reason: object
) -> tuple[tuple[tuple[str, str], ...], str]:
    """The header lines and reason phrase a replay can send, of a head some part of which it
    would refuse (a CR LF, a name that is no token or is hop-by-hop, a value that is no text or
    that h11 refuses): a server such as werkzeug's sent it, and the record completes without
    that part (releasing would run the handler again) rather than be refused for its whole
    retention. An int value is kept as its digits, as werkzeug sends it (gunicorn, waitress and
    wsgiref refuse it); any other value that is not text is left out. A value's leading and
    trailing SP and HTAB are no part of it (RFC 9110 5.5: the first client's parser dropped
    them, gunicorn strips them before sending): kept without them, the line replays as that
    client read it, where h11 (uvicorn, hypercorn) refuses it as sent."""
    lines: list[tuple[str, str]] = []
    name: object
    value: object
    for line in headers:
        try:
            name, value = line  # type: ignore[misc]
        except (TypeError, ValueError):
            continue
        if type(value) is int:
            value = str(value)
        if not isinstance(name, str) or not isinstance(value, str):
            continue
        value = value.strip(" \t")
        low = name.lower()
        if low in deny or (allow is not None and low not in allow):
            continue
        if _sendable(StoredResponse(200, ((name, value),), b"")):
            lines.append((name, value))
    if isinstance(reason, str) and _sendable(StoredResponse(200, (), b"", reason=reason)):
        return tuple(lines), reason
    return tuple(lines), ""  # a replay sends the standard phrase
