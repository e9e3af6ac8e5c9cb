"""The I/O-free part of guard() / aguard(): the Call they yield and what each decision means.

Both guards (``_async_guard``, and ``_sync_guard`` generated from it) build on
:class:`GuardState`; only the store calls differ.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast

from .._codec import decode_value, encode_payload, encode_value
from .._core import (
    Claimed,
    Decision,
    InFlight,
    Mismatch,
    Record,
    Replay,
    payload_fingerprint,
    record_for,
)
from ..errors import (
    InvalidKeyError,
    KeyReuseError,
    LeaseLostError,
    RequestInFlightError,
    StoreError,
)
from ..events import EventKind, report
from ..policy import Policy

__all__ = ["GUARD_METHOD", "Call", "GuardState"]

T = TypeVar("T")
GUARD_METHOD = "GUARD"  # the record's "method" for guards: never equal to an HTTP method's record

_UNSET: Any = object()


class Call(Generic[T]):
    """What a guard yields: either a replay of the stored result, or a claim to do the work."""

    __slots__ = ("_result", "_saved", "fence", "replayed", "takeover")

    def __init__(
        self,
        *,
        replayed: bool,
        result: Any = _UNSET,
        fence: int | None = None,
        takeover: bool = False,
    ) -> None:
        self.replayed = replayed
        #: Fencing token: grows with every takeover; pass it to downstream writes.
        self.fence = fence
        #: True when this claim took over from an executor whose lease lapsed.
        self.takeover = takeover
        self._result: Any = result
        self._saved: bytes | None = None

    @property
    def result(self) -> T:
        """The stored result of the first run (only when ``replayed``), or what was saved."""
        if self._result is _UNSET:
            raise AttributeError("no result: this call was not replayed and nothing was saved")
        return cast(T, self._result)

    def save(self, value: T) -> None:
        """Record the result; the record completes with it when the block exits."""
        if self.replayed:
            raise RuntimeError("cannot save() on a replayed call")
        self._saved = encode_value(value)
        self._result = value


class GuardState(Generic[T]):
    """The I/O-free part of a guard: which record, which fingerprint, what a decision means."""

    def __init__(
        self,
        key: str,
        payload: object,
        scope: str,
        policy: Policy | None,
        result_type: Any,
        store_policy: Policy,
    ) -> None:
        if not isinstance(key, str) or not key:
            raise InvalidKeyError("a guard key must be a non-empty string")
        self.policy = policy if policy is not None else store_policy
        self.scope = scope
        self.record: Record = record_for(self.policy.prefix, scope, GUARD_METHOD, "", key)
        self.fingerprint = payload_fingerprint(encode_payload(payload))
        self.result_type = result_type
        self.claim: Claimed | None = None
        self.call: Call[T] | None = None

    def enter(self, decision: Decision, seconds: float) -> Call[T]:
        """The Call for a claim or a replay; raises for a mismatch or a request in flight."""
        kind = type(decision)
        if kind is Claimed:
            claim = cast(Claimed, decision)
            self.claim = claim
            self.notify("takeover" if claim.takeover else "claimed", claim.fence, seconds=seconds)
            self.call = Call(replayed=False, fence=claim.fence, takeover=claim.takeover)
            return self.call
        if kind is Replay:
            self.notify("replayed", seconds=seconds)
            value = decode_value(cast(Replay, decision).response, self.result_type)
            return Call(replayed=True, result=value)
        if kind is Mismatch:
            self.notify("mismatch", seconds=seconds)
            raise KeyReuseError()
        self.notify("in_flight", seconds=seconds)
        raise RequestInFlightError(cast(InFlight, decision).retry_after)

    @property
    def ttl_ms(self) -> int:
        return self.policy.ttl_ms

    def saved(self) -> bytes | None:
        return self.call._saved if self.call is not None else None

    def exited(
        self, done: bool, completing: bool, exc: BaseException | None, seconds: float
    ) -> None:
        """Report how leaving the block went; a lost lease raises unless the block raised."""
        fence = self.claim.fence if self.claim else None
        if not completing:
            if done:
                self.notify("released", fence, seconds=seconds)
            else:
                self.notify("lease_lost", fence, "another executor took the record over")
        elif done:
            self.notify("completed", fence, seconds=seconds)
        else:
            self.notify("lease_lost", fence, "another executor took the record over")
            if exc is None:
                raise LeaseLostError(fence)

    def store_failed(self, error: StoreError, exc: BaseException | None) -> None:
        """Redis failed while leaving the block: raise it, unless the block's own exception
        is already on its way out (that one is what the caller must see; ours is logged)."""
        self.notify("store_error", self.claim.fence if self.claim else None, str(error))
        if exc is None:
            raise error

    def notify(
        self,
        kind: EventKind,
        fence: int | None = None,
        detail: str = "",
        seconds: float | None = None,
    ) -> None:
        hook = self.policy.on_event
        report(hook, kind, self.record, self.scope, GUARD_METHOD, "", fence, detail, seconds)
