"""The sans-IO HTTP exchange that every HTTP adapter shares: one object per request.

Every HTTP decision of docs/design.md#http-decisions is made here, without I/O, and in one
order: :func:`begin` looks at the :class:`Request` and gives an :class:`Exchange` (or a
Response to send, or None to pass through); the exchange is then asked one transition at a
time, as an h11 connection is, and one asked out of order raises ProtocolError (the table is
in ``_transitions``). The drivers (``adapters/_async_driver``, ``_sync_driver``) do the store
I/O around it and adapters only move bytes::

    exchange = begin(policy, request)             # None: pass through; Response: answer it
    exchange.announced(), exchange.received(body) # a Response: send it, stop
    fingerprint = exchange.claiming()             # then store.claim(exchange.record, ...)
    answer = exchange.decide(decision)            # a Response (replay, 409, 422): send it
    (on StoreError: exchange.store_failed(exc) gives a 503, or None to run unprotected)
    run the app; exchange.started(status, headers) once its head went out
    plan = exchange.finish(body)                  # Complete(bytes) or Release; or fail(reason)
    exchange.settled(ok) once the store answered  # or settle_failed(exc)

The request view and the answers (``_messages``), the problem documents (``_problems``) and
the response body copy (``_body_copy``) have modules of their own; this one re-exports the names
users import from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, NoReturn

from .._codec import StoredResponse, decode_response, encode_response
from .._core import (
    Claimed,
    Expired,
    ExpiringDecision,
    InFlight,
    Mismatch,
    Record,
    Replay,
    fingerprint,
    new_owner,
    parse_key,
    record_for,
    record_origin,
    retry_after_seconds,
)
from ..errors import (
    ConfigurationError,
    InvalidKeyError,
    ProtocolError,
    RecordFormatError,
    StoreError,
)
from ..events import (
    ALWAYS_LOGGED,
    DEBUG,
    RECORD_LOST_DETAIL,
    TAKEN_OVER_DETAIL,
    EventKind,
    enabled_memo,
    report,
)
from ..guard._call import Call, leave_current, run_as_current
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
from ._problems import RETRY as RETRY
from ._problems import Problem, RetryAdvice, problem, render, retention_seconds
from ._scope import credential_scope, default_scope
from ._switch import switch
from ._transitions import TRANSITIONS, State
from .routes import ROUTE_UNKNOWN

if TYPE_CHECKING:
    from ..policy import Policy
    from ..store.uncertain import UncertainKind

__all__ = [
    "BODY_NOT_KEPT_HEADER",
    "BodyCopy",
    "REPLAYED_HEADER",
    "RETRY",
    "Complete",
    "Exchange",
    "Headers",
    "Problem",
    "Release",
    "Request",
    "Response",
    "RetryAdvice",
    "begin",
    "exposed_headers",
    "problem",
    "render",
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
_RELEASE_INVALID_STATUS: Final = Release("the app answered a status outside 100-599")
_UNREADABLE_HEAD: Final = Release("the app's status or headers are not valid: nothing to replay")

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
    """One keyed request, from its body to its settled record. No I/O: the driver does that.

    One object in h11's shape: it makes every decision and owns their order. Each public
    method is a transition of :data:`~._transitions.TRANSITIONS`; one asked in the wrong state
    raises :class:`~idemkey.errors.ProtocolError` and changes nothing. ``state`` is where the
    request is, ``owner`` the claim's owner token (set by :meth:`claiming`), ``declared`` the
    request's Content-Length, ``call`` the claimed call while the app runs (what
    ``idemkey.current_call()`` returns), ``unprotected`` whether the store failed and the
    policy said run anyway, ``plan`` what the record is settled with.
    """

    __slots__ = (
        "_fingerprint",
        "_head",
        "_key",
        "_limit",
        "_scope",
        "call",
        "claim",
        "declared",
        "keep",
        "owner",
        "plan",
        "policy",
        "record",
        "request",
        "state",
        "unprotected",
    )

    def __init__(self, policy: Policy, request: Request, key: str, scope: str) -> None:
        self.policy = policy
        self.request = request
        self._scope = scope
        self._key = key
        self.record: Record = record_for(
            policy.prefix, scope, request.method, request.route or request.path, key
        )
        self.claim: Claimed | None = None
        self.state = State.READING
        # content_length(headers), without its call
        values = request.headers.get_all("content-length")
        self.declared = parse_content_length(values[0]) if values else None
        self.unprotected = False
        #: Where uncertain outcomes go (the driver's ``store.keep_uncertain``), or None.
        self.keep: Callable[..., None] | None = None
        # The limit, read once: the body is checked against it twice.
        self._limit = policy.max_request_bytes
        self.owner = ""
        self.plan: Complete | Release | None = None
        self.call: Call[Any] | None = None
        self._fingerprint = b""
        self._head: tuple[int, list[tuple[str, str]], str] | None = None

    @property
    def origin(self) -> str:
        """Where the record comes from, kept in it for ``store.records()`` (record_origin)."""
        request = self.request
        key = self._key if self.policy.keep_keys else None
        return record_origin(self._scope, request.method, request.route or request.path, key)

    # Each transition looks up its (state, transition) pair once: ``TRANSITIONS.get(...) or
    # self._refuse(transition)`` gives the next state or raises, and the state moves only once
    # the transition's work succeeded.

    def _refuse(self, transition: str) -> NoReturn:
        raise ProtocolError(self.state.value, transition)

    def _move(self, transition: str) -> None:
        self.state = TRANSITIONS.get((self.state, transition)) or self._refuse(transition)

    # READING: the request body.

    def announced(self) -> Response | None:
        """Before reading: the 413 to send when the declared length is over the limit."""
        if self.state is not State.READING:
            self._refuse("reject")
        if self.declared is not None and self.declared > self._limit:
            return self.reject_too_large()
        return None

    def received(self, body: bytes) -> Response | None:
        """The body as read (at most ``max_request_bytes + 1`` bytes): None to claim next, or
        the 413 (over the limit) or 400 (shorter than its Content-Length) to send instead.
        Never run on half a body: its fingerprint would match no honest retry."""
        ready = TRANSITIONS.get((self.state, "receive")) or self._refuse("receive")
        if len(body) > self._limit:
            return self.reject_too_large()
        declared = self.declared
        if declared is not None and len(body) < declared:
            self._move("reject")
            detail = f"the body ended after {len(body)} of {declared} bytes"
            return render(self.policy, 400, "incomplete_body", detail)
        self._fingerprint = self.fingerprint(body)
        self.state = ready
        return None

    def reject_too_large(self) -> Response:
        """The 413 for a body over ``max_request_bytes`` (however the adapter found out)."""
        self._move("reject")
        return self._too_large()

    def _too_large(self) -> Response:
        self.notify("too_large", detail="request body over max_request_bytes")
        detail = f"keyed requests may carry at most {self._limit} bytes"
        return render(self.policy, 413, "request_too_large", detail)

    def unreadable(self, status: int, code: str, detail: str) -> Response:
        """The body cannot be fingerprinted (the server could not read it, or something read
        it before idemkey could): the problem to send; nothing is claimed."""
        self._move("reject")
        return render(self.policy, status, code, detail)

    def client_left(self) -> None:
        """The client went away before its body was complete: nothing was claimed."""
        self._move("client_left")

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

    # READY, CLAIMING: the claim and what it means.

    def claiming(self) -> bytes:
        """The claim goes out now: returns the request's fingerprint; sets :attr:`owner`."""
        self.state = TRANSITIONS.get((self.state, "claim")) or self._refuse("claim")
        self.owner = new_owner()
        return self._fingerprint

    def decide(self, decision: ExpiringDecision, seconds: float | None = None) -> Response | None:
        """The claim's answer: None to run the app (RUNNING), or the Response to send.

        ``seconds``: how long the claim took in Redis, for the events.
        """
        transition = "claimed" if type(decision) is Claimed else "answer"
        target = TRANSITIONS.get((self.state, transition)) or self._refuse(transition)
        answer = self._answer(decision, seconds)
        self.state = target
        if type(answer) is Claimed:
            # The handler reaches its fence through idemkey.current_call() (a fenced SQL
            # transaction, a downstream write); no longer current once the response settles.
            self.call = Call(
                replayed=False,
                fence=answer.fence,
                takeover=answer.takeover,
                record=self.record,
                ttl_ms=self.policy.ttl_ms,
            )
            run_as_current(self.call)
            return None
        assert not isinstance(answer, Claimed)
        return answer

    def store_failed(self, exc: StoreError) -> Response | None:
        """The claim failed in Redis: the 503 to send, or None to run the app unprotected."""
        if self.state is not State.CLAIMING:
            self._refuse("answer")
        answer = self._failed(exc)
        self._move("answer" if answer is not None else "run_unprotected")
        self.unprotected = answer is None
        return answer

    def response_lost(self) -> Response:
        """The key's fenced transaction committed, but its response was never recorded (the
        process stopped between the COMMIT and the write): the handler does not run again, and
        every retry gets this 409 (no Retry-After: retrying cannot help)."""
        if self.state is not State.CLAIMING:
            self._refuse("answer")
        self._move("answer")
        self.notify("store_error", detail=RESPONSE_LOST)
        return render(self.policy, 409, "response_lost", RESPONSE_LOST)

    def interrupted(self) -> Release:
        """The claim was cut off (a cancellation) after it may have reached Redis: release it,
        or retries get 409 until the lease lapses (a release that is not ours changes nothing)."""
        self._move("interrupted")
        plan = self.plan = Release("cancelled while claiming")
        return plan

    def _failed(self, exc: StoreError) -> Response | None:
        """Redis failed before the handler ran: 503 (fail closed) or ``None`` to run it open."""
        if self.policy.on_store_error == "open":
            self.notify("unprotected", detail=str(exc))
            self.uncertain("unprotected", None, str(exc))
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

    def _answer(
        self, decision: ExpiringDecision, seconds: float | None = None
    ) -> Response | Claimed:
        """What the claim means: run the handler (``Claimed``) or answer with a Response."""
        kind = type(decision)
        if kind is Claimed:
            assert isinstance(decision, Claimed)
            self.claim = decision
            if decision.takeover:
                self.notify("takeover", decision.fence, seconds=seconds)
                self.uncertain("takeover", decision.fence)
            else:
                self.notify("claimed", decision.fence, seconds=seconds)
            return decision
        if kind is Replay:
            assert isinstance(decision, Replay)
            return self._replay(decision.response, seconds)
        if kind is Expired:
            assert isinstance(decision, Expired)
            return self._expired(decision)
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

    def _expired(self, decision: Expired) -> Response:
        self.notify("expired")
        ttl = retention_seconds(self.policy.ttl)
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(decision.completed_at))
        return render(
            self.policy,
            410,
            "key_expired",
            f"this key's request completed at {when} and its record expired {ttl} s later; "
            "it is not run again: look its outcome up, and use a new key only for a new "
            "operation",
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
        cors = False  # the first answer was to a CORS request: expose what is added here
        for index, (name, _) in enumerate(headers):
            if len(name) == 14 and name.lower() == "content-length":
                headers[index] = (name, str(len(response.body)))
            elif len(name) == 27 and name.lower() == "access-control-allow-origin":
                cors = True
        headers.append((REPLAYED_HEADER, "true"))
        if not response.body_kept:
            headers.append((BODY_NOT_KEPT_HEADER, "true"))
        retention = self.policy.retention_header
        if retention is not None:
            headers.append((retention, str(retention_seconds(self.policy.ttl))))
        if cors:
            added = [REPLAYED_HEADER]
            if not response.body_kept:
                added.append(BODY_NOT_KEPT_HEADER)
            if retention is not None:
                added.append(retention)
            _exposing(headers, added)
        return Response(response.status, headers, response.body, response.reason)

    def first_headers(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]] | None:
        """The headers to send on the app's own answer instead of ``headers``, when the policy
        adds some (``mark_first_responses``, ``retention_header``); None: send them as they
        are. ``headers`` is not changed: what is stored and replayed is the app's answer."""
        policy = self.policy
        mark, retention = policy.mark_first_responses, policy.retention_header
        if not mark and retention is None:
            return None
        sent, added = list(headers), []
        if mark:
            sent.append((REPLAYED_HEADER, "false"))
            added.append(REPLAYED_HEADER)
        if retention is not None:
            sent.append((retention, str(retention_seconds(policy.ttl))))
            added.append(retention)
        _exposing(sent, added)
        return sent

    # RUNNING, SENDING: the app's answer.

    def started(self, status: int, headers: list[tuple[str, str]] | None, reason: str = "") -> None:
        """The response's status and headers went out; ``headers`` None: they were not valid
        (not latin-1 text), so the record is never completed with them. ``reason``: the status
        line's reason phrase (WSGI, Flask), stored to be replayed as it was sent."""
        self.state = TRANSITIONS.get((self.state, "start")) or self._refuse("start")
        self._head = (status, headers, reason) if headers is not None else None

    def finish(self, body: bytes | None) -> Complete | Release:
        """The response is complete: store it (``body`` None: without its body) or release."""
        settling = TRANSITIONS.get((self.state, "finish")) or self._refuse("finish")
        if self.call is not None:
            leave_current(self.call)
        head = self._head
        plan = self.plan = (
            self._plan(head[0], head[1], body, head[2]) if head is not None else _UNREADABLE_HEAD
        )
        self.state = settling
        return plan

    def fail(self, reason: str) -> Complete | Release:
        """The app raised, was cancelled, or stopped before its response was complete.

        Before ``started``: release, so a retry runs again. After: the client may have the
        answer, and the work is done; complete without the body (or release, when the status
        is one the policy never stores).
        """
        settling = TRANSITIONS.get((self.state, "fail")) or self._refuse("fail")
        if self.call is not None:
            leave_current(self.call)
        head = self._head
        if self.state is not State.SENDING:
            plan: Complete | Release = Release(reason)
        elif head is None:
            plan = _UNREADABLE_HEAD
        else:
            plan = self._plan(head[0], head[1], None, head[2])
        self.plan = plan
        self.state = settling
        return plan

    def cancelled(self) -> None:
        """The app was cancelled before its response started (a server that cancels the
        request when its client leaves): what it did is unknown, so the key is not released.
        The driver stops renewing the claim, which holds retries off (409 or a wait) until its
        lease lapses; the retry after it takes it over. An ``uncertain`` entry says so."""
        self._move("cancelled")
        if self.call is not None:
            leave_current(self.call)
        fence = self.claim.fence if self.claim else None
        detail = f"the key is held until its lease lapses ({self.policy.lease_ms} ms)"
        self.uncertain("cancelled", fence, detail)

    def _plan(
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

    # SETTLING: what the store said.

    def settled(self, ok: bool, seconds: float | None = None, record_lost: bool = False) -> None:
        """The complete or release script answered (``ok`` False: the record was not ours;
        ``record_lost``: it vanished under the claim, evicted, rather than taken over)."""
        plan = self.plan
        self.state = TRANSITIONS.get((self.state, "settle")) or self._refuse("settle")
        fence = self.claim.fence if self.claim else None
        if not ok:
            why = RECORD_LOST_DETAIL if record_lost else TAKEN_OVER_DETAIL
            self.notify("lease_lost", fence, why)
            self.uncertain("lease_lost", fence, why)
        elif isinstance(plan, Complete):
            self.notify("completed", fence, seconds=seconds)
        else:
            assert plan is not None
            self.notify("released", fence, plan.reason, seconds)

    def settle_failed(self, exc: StoreError) -> None:
        """Redis failed while settling: reported, never raised (the client has its answer)."""
        self._move("settle")
        fence = self.claim.fence if self.claim else None
        if isinstance(self.plan, Complete):
            detail = f"response not stored: {exc}"
        else:
            detail = f"key not released (its lease will lapse): {exc}"
        self.notify("store_error", fence, detail)
        if isinstance(self.plan, Complete):
            self.uncertain("completion_failed", fence, detail)

    def uncertain(self, kind: UncertainKind, fence: int | None, detail: str = "") -> None:
        """Keep an outcome an operator must check in the store's stream (never raises)."""
        if self.keep is not None:
            request = self.request
            route = request.route or request.path
            self.keep(kind, self.record, self._scope, request.method, route, fence, detail)

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
