"""Policy: every knob idemkey has, with its default, in one frozen object.

A Policy is shared by a store, the guards and the HTTP adapters. It is immutable, so one
object can serve many apps and threads without any of them changing another's behaviour;
derive a variant with ``policy.replace(wait=2.0)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from . import _options
from ._codec import HOP_BY_HOP
from .errors import ConfigurationError
from .http._scope import credential_scope

if TYPE_CHECKING:
    from .events import Event
    from .http._messages import Request
    from .http._problems import Problem

__all__ = [
    "DEFAULT_COMPRESS_AT",
    "DEFAULT_HEADER_DENYLIST",
    "NEVER_BEGAN_STATUSES",
    "Policy",
    "Replicas",
    "credential_scope",
]

#: 4xx answers that mean "the request never began": nothing happened, so the key is released
#: and the client may fix the request and retry with the same key. Every other 4xx (402 Payment
#: Required, say) is a real outcome and is stored and replayed.
NEVER_BEGAN_STATUSES: frozenset[int] = frozenset(
    {400, 401, 403, 404, 405, 406, 407, 408, 409, 411, 412, 413, 414, 415, 417, 421, 422, 425,
     426, 428, 429, 431}
)  # fmt: skip

#: Response headers never stored: hop-by-hop headers (``_codec.HOP_BY_HOP``, the ones a replay
#: refuses: RFC 9110 section 7.6.1's and ``Trailers``, which waitress and wsgiref refuse), ``Date``
#: (a replay gets a fresh one from the server) and ``Set-Cookie`` (a replay must not hand out a
#: session).
DEFAULT_HEADER_DENYLIST: frozenset[str] = HOP_BY_HOP | {"date", "set-cookie"}

#: What ``Policy(compress=True)`` means: records of 1 KiB or more. Below it zlib saves few
#: bytes, and Redis's allocator rounds a small string up anyway.
DEFAULT_COMPRESS_AT = 1024


@dataclass(frozen=True, slots=True)
class Replicas:
    """Durability: after a claim or a completion writes, wait until ``count`` replicas have it.

    The store sends Redis ``WAIT count timeout`` on the connection that ran the script, in the
    same round trip. If fewer replicas confirm within ``timeout`` seconds, the write is treated
    as failed: a claim is released and raises :class:`~idemkey.errors.StoreError` (the HTTP
    adapters answer 503 and the handler does not run); a completion raises ``StoreError`` (the
    response already went out; the adapters report ``store_error``).

    What it buys: an acknowledged claim or completion is on ``count`` replicas, so a failover
    that promotes one of them keeps it. What it does not: WAIT is not consensus. A write that
    timed out may still be on the master and reach the replicas later, and a failover may
    promote a replica that did not confirm. It narrows the window for losing acknowledged
    writes; it does not close it. Every write waits for a replica round trip, and while
    replicas are missing every claim that writes waits ``timeout`` and fails; a replay (or an
    in-flight or mismatch answer, which write nothing) is still answered, after waiting up to
    ``timeout``: its claim script is sent with the same WAIT.
    """

    count: int = 1
    timeout: float = 0.1

    def __post_init__(self) -> None:
        count = self.count
        # Redis reads WAIT's count as a C long: 10**30 failed every claim, after it wrote.
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count < 2**31:
            raise ConfigurationError(
                f"Replicas.count must be an int >= 1 and < 2**31, got {count!r:.60}"
            )
        # WAIT with a timeout of 0 blocks forever: never let a missing replica hang a request.
        # At most 10 years, as every duration (_options.MAX_SECONDS).
        timeout = _options.seconds(self.timeout, "Replicas(timeout=...)")  # finite, > 0
        object.__setattr__(self, "timeout", timeout)

    @property
    def timeout_ms(self) -> int:
        return max(1, int(self.timeout * 1000))


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """How idemkey treats a keyed request. Times are in seconds, sizes in bytes."""

    #: How long a completed record is kept and replayed (retention window). Stripe keeps 24 h.
    ttl: float = 86_400.0
    #: How long a claim holds the key without a heartbeat; a crashed executor frees it after this.
    lease: float = 30.0
    #: How long a duplicate waits for the first request to finish before it gets 409 (0: no wait).
    wait: float = 0.0
    #: HTTP methods that are guarded; a key on any other method is ignored.
    methods: frozenset[str] = frozenset({"POST", "PATCH"})
    #: Whether a guarded route answers 400 when the key is missing (else it runs unprotected).
    require_key: bool = True
    #: Require the RFC 8941 sf-string form (``"abc"``); by default the bare form is accepted too.
    strict_header: bool = False
    #: The request header that carries the key.
    header: str = "Idempotency-Key"
    #: Keyed requests with a larger body get 413 (never a silent bypass).
    max_request_bytes: int = 1 << 20
    #: Larger or streamed response bodies pass through unbuffered and are not stored.
    max_response_bytes: int = 1 << 20
    #: When Redis fails: "closed" answers 503 and does not run the handler; "open" runs it
    #: unprotected and emits an ``unprotected`` event.
    on_store_error: Literal["closed", "open"] = "closed"
    #: Seconds a client is told to wait (Retry-After) after a 503 from a store error.
    store_error_retry_after: float = 1.0
    #: Redis key prefix; records are ``{prefix}:{<digest>}``.
    prefix: str = "idemkey"
    #: The tenant a request belongs to; same key in two scopes = two independent records.
    scope: Callable[[Request], str] = credential_scope
    #: How a retry's body is compared with the first one's. ``"bytes"``: as sent, except a
    #: ``multipart/form-data`` body, compared by its parts (names, filenames, part content types
    #: and contents; not the boundary, which clients pick anew per call). ``"json"``: as
    #: canonical JSON (key order and insignificant whitespace ignored); a body that is not JSON
    #: is compared as bytes. A callable ``(request, body) -> bytes | str``: its result is
    #: compared (leave out a timestamp or a nonce). Method, path, sorted query, Content-Type
    #: and Content-Encoding are compared in every mode; an encoded body is never decoded.
    fingerprint: Literal["bytes", "json"] | Callable[[Request, bytes], bytes | str] = "bytes"
    #: Status for a key reused with another body: 422 (IETF draft) or 400 (Stripe).
    mismatch_status: int = 422
    #: Store and replay 5xx answers too, instead of releasing the key so a retry runs again.
    store_server_errors: bool = False
    #: 4xx answers that mean the request never began: released, not stored.
    release_statuses: frozenset[int] = NEVER_BEGAN_STATUSES
    #: Response headers (lower case) never stored.
    header_denylist: frozenset[str] = DEFAULT_HEADER_DENYLIST
    #: If set, only these response headers (lower case) are stored.
    header_allowlist: frozenset[str] | None = None
    #: Wait for replicas to confirm each claim and completion (see :class:`Replicas`); read
    #: from the store's policy. None (default): acknowledge once the master has the write.
    durability: Replicas | None = None
    #: Compress stored records (HTTP responses and guard results) of at least this many bytes
    #: with zlib, when it saves bytes; ``True``: :data:`DEFAULT_COMPRESS_AT` (1 KiB). ``None``
    #: or ``False`` (default): never. Records are read whatever this says, so it can be
    #: changed at any time; a release older than the one that added it cannot read them.
    compress: bool | int | None = field(default=None, compare=False)  # compared as compress_at
    #: Called with every :class:`idemkey.events.Event`; exceptions in it are logged, not raised.
    on_event: Callable[[Event], None] | None = field(default=None, compare=False)
    #: Renders idemkey's own answers (400, 409, 413, 422, 503) in your API's error format:
    #: called with an :class:`idemkey.http.Problem`, returns ``(content_type, body)``. The status
    #: and ``Retry-After`` stay idemkey's. None (default): RFC 9457 ``application/problem+json``.
    render_problem: Callable[[Problem], tuple[str, bytes]] | None = field(
        default=None, compare=False
    )
    #: Send how long a key is honoured (``ttl`` in whole seconds) in this response header on
    #: every keyed response: first answers, replays and idemkey's problems. None (default):
    #: not sent. No standard names it yet (IETF httpapi issues #35, #49): pick your own, such
    #: as ``"Idempotency-Retention"``. Every problem carries it as ``retention`` regardless.
    retention_header: str | None = None
    #: Send ``Idempotent-Replayed: false`` on first keyed responses (replays always say
    #: ``true``), so a client can tell "first answer" from "a server that never marks".
    mark_first_responses: bool = False
    #: Seconds a tombstone of a completed record outlives it (fingerprint and completion time,
    #: no body): a retry inside the grace is answered 410 ``key_expired`` instead of running
    #: again. 0 (default): no tombstone, no extra key or write. HTTP adapters only.
    expired_grace: float = 0.0
    #: Keep the key a client sent, escaped, in the records that are not complete (in progress,
    #: lapsed, released), beside the route, scope and claim time, so ``idemkey list``,
    #: ``idemkey inspect`` and the console name them. False: records keep only their digest
    #: (and the route, scope and time), never the key (docs/operators.md#what-records-keep).
    keep_keys: bool = True
    #: Keep that origin (the key, unless ``keep_keys=False``) in completed records too, for
    #: the retention ``ttl``. Costs a completed record 80 bytes or more (a 100 B answer: 464 B
    #: with a short key, 384 B without), past its 400 B goal, so it is off by default.
    keep_key_after_completion: bool = False
    #: Send ``x-should-retry: true`` on idemkey's retryable problems (409 ``in_flight``, 503
    #: ``store_unavailable``): clients generated by Stainless (and others that read it) then
    #: retry a 409 they would otherwise raise as a conflict. HTTP adapters only.
    mark_retryable: bool = False
    #: ``lease`` and ``ttl`` in whole milliseconds, as the scripts take them (derived, computed
    #: once here rather than on every call).
    lease_ms: int = field(init=False, repr=False, compare=False)
    ttl_ms: int = field(init=False, repr=False, compare=False)
    #: ``expired_grace`` in whole milliseconds, 0 when off.
    grace_ms: int = field(init=False, repr=False, compare=False)
    #: ``compress`` as the codec takes it: the smallest record size compressed, None for never.
    #: Policies compare by it, so ``compress=True`` equals ``compress=1024``.
    compress_at: int | None = field(init=False, repr=False)

    def __new__(cls, *args: Any, **fields: Any) -> Policy:
        # An unknown field is a ConfigurationError naming it, as on every other path, not
        # the TypeError of the generated __init__ (``replace`` comes through here too).
        if args:
            raise ConfigurationError(
                f"Policy takes keyword arguments only (Policy(ttl=..., lease=...)), got "
                f"{len(args)} positional"
            )
        _options.policy_fields(fields, _options.keyword("Policy"), aliases=False)
        return object.__new__(cls)

    def __post_init__(self) -> None:
        # Every field typed, checked and frozen by the converter every other path uses too
        # (idemkey._options): methods upper case, header names lower case, durations floats.
        _options.freeze(self)
        if not self.lease < self.ttl:
            raise ConfigurationError(
                f"Policy: need lease < ttl, got lease={self.lease:g} ttl={self.ttl:g}"
            )
        object.__setattr__(self, "compress_at", _compress_at(self.compress))
        object.__setattr__(self, "lease_ms", max(1, int(self.lease * 1000)))
        object.__setattr__(self, "ttl_ms", max(1, int(self.ttl * 1000)))
        object.__setattr__(self, "grace_ms", int(self.expired_grace * 1000))

    def replace(self, **changes: Any) -> Policy:
        """A copy with ``changes`` applied (and validated)."""
        # A derived field (lease_ms) is named as unknown here, not dataclasses' ValueError.
        _options.policy_fields(changes, _options.keyword("Policy"), aliases=False)
        return dataclasses.replace(self, **changes)


def _compress_at(compress: object) -> int | None:
    if compress is None or compress is False:
        return None
    if compress is True:
        return DEFAULT_COMPRESS_AT
    if not isinstance(compress, int) or compress < 0:
        raise ConfigurationError(
            f"compress must be True, False, None or a size in bytes (an int >= 0), got {compress!r}"
        )
    return compress
