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
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeVar, overload

from ._canonical import canonical_json, multipart_form
from ._codec import StoredResponse, decode_response, encode_response
from ._core import (
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
from ._switch import switch
from .errors import ConfigurationError, InvalidKeyError, RecordFormatError, StoreError
from .events import EventKind, logger, report
from .routes import ROUTE_UNKNOWN

if TYPE_CHECKING:
    from .policy import Policy

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

PROBLEM_TYPE: Final = "urn:idemkey:problem:"

T = TypeVar("T")


class Headers(Mapping[str, str]):
    """Case-insensitive, multi-valued request headers; ``headers[name]`` is the first value."""

    __slots__ = ("_values",)

    def __init__(self, items: Iterable[tuple[str, str]]) -> None:
        values: dict[str, list[str]] = {}
        for name, value in items:
            values.setdefault(name.lower(), []).append(value)
        self._values = values

    def get_all(self, name: str) -> list[str]:
        """Every field line's value for ``name``, in order; every lookup goes through here."""
        return self._values.get(name.lower(), [])

    def __getitem__(self, name: str) -> str:
        values = self.get_all(name)
        if not values:
            raise KeyError(name)
        return values[0]

    @overload
    def get(self, name: str, /) -> str | None: ...
    @overload
    def get(self, name: str, /, default: str | T) -> str | T: ...
    def get(self, name: str, /, default: object = None) -> object:
        # Mapping.get would raise and catch KeyError for every absent header (about 1 us each;
        # the default scope looks up three that are usually absent).
        values = self.get_all(name)
        return values[0] if values else default

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and bool(self.get_all(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


@dataclass(frozen=True, slots=True)
class Request:
    """What idemkey sees of a request; ``Policy.scope`` receives it.

    ``route`` is the route template when the framework or the middleware's routes know it
    (Flask's ``/charges/<id>``), else empty: the record then uses the path, and events the
    fixed label :data:`idemkey.routes.ROUTE_UNKNOWN` (a concrete path is an unbounded label).
    ``query`` is the raw query string, without ``?``.
    """

    method: str
    path: str
    query: str
    headers: Headers
    route: str = ""


@dataclass(frozen=True, slots=True)
class Response:
    """A complete answer an adapter sends as it is: status, headers (latin-1 text), body.

    ``reason``: the reason phrase to send (a replay's, as the first client got it); ``""``
    lets the adapter use the standard one.
    """

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Complete:
    """Store this encoded response and complete the record."""

    stored: bytes


@dataclass(frozen=True, slots=True)
class Release:
    """Free the key: the request never began (or failed), so a retry may run again."""

    reason: str


_RELEASE_SERVER_ERROR: Final = Release("server error")
_RELEASE_NEVER_BEGAN: Final = Release("the request never began")
_RELEASE_INVALID_STATUS: Final = Release("the app answered a status outside 100-599")

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


def render(
    policy: Policy, status: int, code: str, detail: str, headers: Iterable[tuple[str, str]] = ()
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
    scope = policy.scope(request)
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
        # The lease bounds how long the first request can hold the key, but it usually ends
        # much sooner: tell clients to come back in a second, not in a lease.
        retry = str(retry_after_seconds(min(decision.retry_after, 1.0)))
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
        kept = tuple(
            (name, value)
            for name, value in headers
            if (low := name.lower()) not in deny and (allow is None or low in allow)
        )
        if body is None:
            return Complete(
                encode_response(StoredResponse(status, kept, b"", body_kept=False, reason=reason))
            )
        return Complete(encode_response(StoredResponse(status, kept, body, reason=reason)))

    def completed(self, stored: bool, seconds: float | None = None) -> None:
        """Report what the complete script said (``False``: the lease was lost meanwhile)."""
        fence = self.claim.fence if self.claim else None
        if stored:
            self.notify("completed", fence, seconds=seconds)
        else:
            self.notify("lease_lost", fence, "another executor took the record over")

    def released(self, reason: str, ours: bool = True, seconds: float | None = None) -> None:
        """Report what the release script said (``False``: the record was no longer ours)."""
        fence = self.claim.fence if self.claim else None
        if ours:
            self.notify("released", fence, reason, seconds)
        else:
            self.notify("lease_lost", fence, "another executor took the record over")

    def notify(
        self,
        kind: EventKind,
        fence: int | None = None,
        detail: str = "",
        seconds: float | None = None,
    ) -> None:
        request = self.request
        # The template, never the concrete path: a metric label must stay bounded.
        route = request.route or ROUTE_UNKNOWN
        hook = self.policy.on_event
        report(hook, kind, self.record, self._scope, request.method, route, fence, detail, seconds)


class BodyCopy:
    """The copy of a response body kept for the record while the body streams to the client.

    Dropped (the record then completes without the body, and is never run twice) once it grows
    past ``limit``, or once the app streams: a second non-empty block with no Content-Length,
    the same rule for a WSGI iterable and for ASGI body messages.
    """

    __slots__ = ("_chunks", "_limit", "_size", "_sized")

    def __init__(self, limit: int) -> None:
        self._chunks: list[bytes] | None = []
        self._limit = limit
        self._size = 0
        self._sized = False

    def start(self, headers: Iterable[tuple[str, str]]) -> None:
        """The response's headers: whether it declared its length."""
        self._sized = any(name.lower() == "content-length" for name, _ in headers)

    def add(self, chunk: bytes) -> None:
        self._size += len(chunk)  # counted even once dropped: a drain stops on too_large
        chunks = self._chunks
        if not chunk or chunks is None:
            return
        if self._size > self._limit or (chunks and not self._sized):
            self._chunks = None
        else:
            chunks.append(chunk)

    def drop(self) -> None:
        self._chunks = None

    @property
    def dropped(self) -> bool:
        return self._chunks is None

    @property
    def too_large(self) -> bool:
        return self._size > self._limit

    def body(self) -> bytes | None:
        """What to store: the whole body, or None when it was dropped."""
        return None if self._chunks is None else b"".join(self._chunks)


def content_length(headers: Headers) -> int | None:
    """The declared Content-Length, or None when absent or malformed."""
    return parse_content_length(headers.get("content-length"))


def parse_content_length(value: str | None) -> int | None:
    """A Content-Length value as a number, or None when absent or malformed."""
    # ASCII digits inside optional spaces and tabs (RFC 9110 OWS), nothing else: isdigit()
    # accepts "³" (latin-1 0xB3) and strip() removes "\x1c", and int() refuses both.
    digits = value.strip(" \t") if value is not None else ""
    if not digits.isascii() or not digits.isdigit():
        return None
    return int(digits)
