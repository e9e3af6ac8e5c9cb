"""The sans-IO HTTP exchange that the Flask, WSGI and ASGI adapters share.

Every HTTP decision of docs/design.md#http-decisions is made here, without I/O: an adapter builds a
:class:`Request`, asks :func:`begin` what to do, reads the body, fingerprints it, sends the claim
through its store, asks the :class:`Exchange` what the decision means, runs the app, and asks
what to do with its answer. The order of these questions is not left to each adapter:
``idemkey.adapters._lifecycle.Lifecycle`` owns it (a state machine that raises ProtocolError on
a step out of order) and the drivers (``_async_driver``, ``_sync_driver``) call the store.

::

    step = begin(policy, request)                 # None: pass through; Response: answer it
    if step is a Response: send it
    body = read at most policy.max_request_bytes + 1 bytes
    if step.too_large(len(body)): send step.too_large_response()
    decision = store.claim(step.record, step.fingerprint(body), ...)
    (on StoreError: step.store_failed(exc) gives a 503, or None to run unprotected)
    answer = step.decide(decision)                # Response (replay, 409, 422) or Claimed
    run the app; capture status, headers, body (None when streamed or too large)
    plan = step.finish(status, headers, body)     # Complete(bytes) or Release

The request view and the answers (``_http_messages``), the problem documents (``_problems``) and
the response body copy (``_body_copy``) have modules of their own; this one re-exports the names
users import from it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from .._codec import StoredResponse, decode_response, encode_response
from .._core import (
    Claimed,
    Decision,
    InFlight,
    Mismatch,
    Record,
    Replay,
    fingerprint,
    parse_key,
    record_for,
    retry_after_seconds,
)
from ..errors import ConfigurationError, InvalidKeyError, RecordFormatError, StoreError
from ..events import (
    ALWAYS_LOGGED,
    DEBUG,
    RECORD_LOST_DETAIL,
    TAKEN_OVER_DETAIL,
    EventKind,
    enabled_memo,
    report,
)
from ._body_copy import BodyCopy
from ._canonical import canonical_json, multipart_form
from ._messages import (
    Complete,
    Headers,
    Release,
    Request,
    Response,
)
from ._messages import content_length as content_length
from ._messages import parse_content_length as parse_content_length
from ._problems import PROBLEM_TYPE as PROBLEM_TYPE
from ._problems import Problem, problem, render
from ._scope import credential_scope, default_scope
from ._switch import switch
from .routes import ROUTE_UNKNOWN

if TYPE_CHECKING:
    from ..policy import Policy

__all__ = [
    "BODY_NOT_KEPT_HEADER",
    "BodyCopy",
    "REPLAYED_HEADER",
    "Complete",
    "Exchange",
    "Headers",
    "Problem",
    "Release",
    "Request",
    "Response",
    "begin",
    "problem",
    "render",
]

REPLAYED_HEADER: Final = "Idempotent-Replayed"
#: On a replay whose body was too large or streamed to keep: the body is empty on purpose.
BODY_NOT_KEPT_HEADER: Final = "Idempotent-Body-Not-Kept"


_RELEASE_SERVER_ERROR: Final = Release("server error")
_RELEASE_NEVER_BEGAN: Final = Release("the request never began")
_RELEASE_INVALID_STATUS: Final = Release("the app answered a status outside 100-599")

# A content type starting otherwise is not multipart: one cheap test on the default path.
_MULTIPART_INITIALS: Final = frozenset("mM")
# The content type compared for a multipart body reduced to its parts: no header can carry it
# (a line break), so it never equals a body compared as bytes.
_MULTIPART_PARTS: Final = "multipart/form-data\nparts"


def _custom_form(value: object) -> bytes:
    """What a ``Policy(fingerprint=callable)`` returned, as bytes."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    raise ConfigurationError(
        f"Policy.fingerprint must return bytes or str, got {type(value).__name__}"
    )


def begin(policy: Policy, request: Request) -> Exchange | Response | None:
    """First look at a request: ``None`` passes it through, a ``Response`` rejects it.

    Otherwise the :class:`Exchange` that guards it. Cheap: no body, no I/O. While
    :func:`idemkey.testing.disabled` is active, always ``None``.
    """
    if request.method not in policy.methods or switch.disabled:
        return None
    values = request.headers.get_all(policy.header)
    if not values:
        if not policy.require_key:
            return None
        return render(policy, 400, "missing_key", f"{policy.header} is required for this request")
    if len(values) > 1:
        return render(policy, 400, "invalid_key", f"send exactly one {policy.header} field line")
    try:
        key = parse_key(values[0], strict=policy.strict_header)
    except InvalidKeyError as exc:
        return render(policy, 400, "invalid_key", exc.reason)
    scope_of = policy.scope
    if scope_of is credential_scope:  # the default: it must leave the key header out
        scope = default_scope(request, policy.header)
    else:
        scope = scope_of(request)
        if not isinstance(scope, str):
            raise ConfigurationError(f"Policy.scope must return a str, got {type(scope).__name__}")
    return Exchange(policy, request, key, scope)


class Exchange:
    """One keyed request from claim to completion. No I/O: the adapter does that."""

    __slots__ = ("_scope", "claim", "policy", "record", "request")

    def __init__(self, policy: Policy, request: Request, key: str, scope: str) -> None:
        self.policy = policy
        self.request = request
        self._scope = scope
        self.record: Record = record_for(
            policy.prefix, scope, request.method, request.route or request.path, key
        )
        self.claim: Claimed | None = None

    # Before the claim.

    def too_large(self, size: int) -> bool:
        """Whether a body of ``size`` bytes (or a declared Content-Length) is over the limit."""
        return size > self.policy.max_request_bytes

    def too_large_response(self) -> Response:
        self.notify("too_large", detail="request body over max_request_bytes")
        limit = self.policy.max_request_bytes
        detail = f"keyed requests may carry at most {limit} bytes"
        return render(self.policy, 413, "request_too_large", detail)

    def fingerprint(self, body: bytes) -> bytes:
        """The request's fingerprint, its body compared as ``Policy.fingerprint`` says."""
        request = self.request
        lookup = request.headers.get_all  # hot path: what .get would call, one call less
        types, encodings = lookup("content-type"), lookup("content-encoding")
        content_type = types[0] if types else ""
        encoding = encodings[0] if encodings else ""
        how = self.policy.fingerprint
        if how == "bytes" and content_type[:1] not in _MULTIPART_INITIALS:
            pass  # the default, and the fast path: the bytes as sent
        elif callable(how):
            body = _custom_form(how(request, body))
        elif not encoding:  # a canonical form reads the body, so only an unencoded one
            if content_type[:19].lower() == "multipart/form-data":
                parts = multipart_form(content_type, body)
                if parts is not None:
                    content_type, body = _MULTIPART_PARTS, parts
            elif how == "json":
                body = canonical_json(body) or body
        return fingerprint(
            request.method, request.path, request.query, content_type, body, encoding
        )

    def store_failed(self, exc: StoreError) -> Response | None:
        """Redis failed before the handler ran: 503 (fail closed) or ``None`` to run it open."""
        if self.policy.on_store_error == "open":
            self.notify("unprotected", detail=str(exc))
            return None
        self.notify("store_error", detail=str(exc))
        retry = str(retry_after_seconds(self.policy.store_error_retry_after))
        return render(
            self.policy,
            503,
            "store_unavailable",
            "the idempotency store is unavailable; retry with the same key",
            [("Retry-After", retry)],
        )

    # The claim's answer.

    def decide(self, decision: Decision, seconds: float | None = None) -> Response | Claimed:
        """What the claim means: run the handler (``Claimed``) or answer with a Response.

        ``seconds``: how long the claim took in Redis, for the events.
        """
        kind = type(decision)
        if kind is Claimed:
            assert isinstance(decision, Claimed)
            self.claim = decision
            if decision.takeover:
                self.notify("takeover", decision.fence, seconds=seconds)
            else:
                self.notify("claimed", decision.fence, seconds=seconds)
            return decision
        if kind is Replay:
            assert isinstance(decision, Replay)
            return self._replay(decision.response, seconds)
        if kind is Mismatch:
            self.notify("mismatch", seconds=seconds)
            status = self.policy.mismatch_status
            return render(
                self.policy,
                status,
                "key_reused",
                "this key was already used with a different request: resend the identical "
                "request for a retry; use a new key only for a new operation",
            )
        assert isinstance(decision, InFlight)
        self.notify("in_flight", seconds=seconds)
        # decision.retry_after, as a guard's RequestInFlightError says it (whole seconds here).
        retry = str(retry_after_seconds(decision.retry_after))
        return render(
            self.policy,
            409,
            "in_flight",
            "a request with this key is still being processed; retry later",
            [("Retry-After", retry)],
        )

    def _replay(self, stored: bytes, seconds: float | None) -> Response:
        try:
            response = decode_response(stored)
        except RecordFormatError as exc:
            self.notify("store_error", detail=str(exc))
            return render(self.policy, 503, "record_unreadable", str(exc), [("Retry-After", "1")])
        self.notify("replayed", seconds=seconds)
        # The headers as the first client got them, in order. A Content-Length is set to the
        # body sent now (the stored body may have been left out on purpose), where it stood;
        # none is added where the first answer had none (a 204 must not carry one).
        headers = list(response.headers)
        for index, (name, _) in enumerate(headers):
            if len(name) == 14 and name.lower() == "content-length":
                headers[index] = (name, str(len(response.body)))
        headers.append((REPLAYED_HEADER, "true"))
        if not response.body_kept:
            headers.append((BODY_NOT_KEPT_HEADER, "true"))
        return Response(response.status, headers, response.body, response.reason)

    # After the handler.

    def finish(
        self,
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
        policy = self.policy
        if not 100 <= status <= 599:  # not HTTP: a stored copy could never be replayed
            return _RELEASE_INVALID_STATUS
        if status >= 500 and not policy.store_server_errors:
            return _RELEASE_SERVER_ERROR
        if status in policy.release_statuses:
            return _RELEASE_NEVER_BEGAN
        deny, allow = policy.header_denylist, policy.header_allowlist
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
        return Complete(encode_response(stored, policy.compress_at))

    def completed(
        self, stored: bool, seconds: float | None = None, record_lost: bool = False
    ) -> None:
        """Report what the complete script said (``False``: the lease was lost meanwhile;
        ``record_lost``: the record vanished under the claim, evicted, rather than taken)."""
        fence = self.claim.fence if self.claim else None
        if stored:
            self.notify("completed", fence, seconds=seconds)
        else:
            why = RECORD_LOST_DETAIL if record_lost else TAKEN_OVER_DETAIL
            self.notify("lease_lost", fence, why)

    def released(
        self,
        reason: str,
        ours: bool = True,
        seconds: float | None = None,
        record_lost: bool = False,
    ) -> None:
        """Report what the release script said (``False``: the record was no longer ours)."""
        fence = self.claim.fence if self.claim else None
        if ours:
            self.notify("released", fence, reason, seconds)
        else:
            why = RECORD_LOST_DETAIL if record_lost else TAKEN_OVER_DETAIL
            self.notify("lease_lost", fence, why)

    def notify(
        self,
        kind: EventKind,
        fence: int | None = None,
        detail: str = "",
        seconds: float | None = None,
    ) -> None:
        hook = self.policy.on_event
        if hook is None and kind not in ALWAYS_LOGGED and enabled_memo.get(DEBUG) is False:
            return  # nobody listens: this one check is all an event costs
        request = self.request
        # The template, never the concrete path: a metric label must stay bounded.
        route = request.route or ROUTE_UNKNOWN
        report(hook, kind, self.record, self._scope, request.method, route, fence, detail, seconds)
