"""The I/O-free part of a guard: :class:`GuardState`, which record and fingerprint a guard
names and what each decision means (a claim, a replay, a mismatch, a failed store call), and
what leaving the block reports. Both guards (``_async_guard``, and ``_sync_guard`` generated
from it) build on it; the :class:`~idemkey.guard._call.Call` it yields lives in ``_call``.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import msgspec

from .._codec import RESULT_NOT_KEPT, decode_value, encode_payload
from .._core import (
    PAYLOAD_DIGEST,
    Claimed,
    Decision,
    InFlight,
    Mismatch,
    Record,
    Replay,
    record_for,
    record_origin,
)
from .._options import seconds as duration
from ..errors import (
    ConfigurationError,
    InvalidKeyError,
    KeyReuseError,
    LeaseLostError,
    RecordFormatError,
    RequestInFlightError,
    ResultNotStorableError,
    StoreError,
)
from ..events import Reporter, lease_lost_detail
from ._call import _CURRENT, GUARD_METHOD, Call
from ._failures import FailureRules, is_failure, raise_failure, rules_for
from ._steps import worked

if TYPE_CHECKING:
    from ..policy import Policy
    from ._async_steps import AsyncSteps
    from ._sync_steps import Steps

__all__ = ["GuardState"]

T = TypeVar("T")


def _closed(make: Callable[[], Steps | AsyncSteps]) -> Steps | AsyncSteps:
    """Build the steps of a block that has exited, closed: no step may start."""
    steps = make()
    steps.book.close()
    return steps


@lru_cache(maxsize=256)
def _decodable(result_type: Any) -> None:
    try:
        msgspec.msgpack.Decoder(result_type)
    except TypeError as exc:
        raise ConfigurationError(
            f"result_type={result_type!r:.60}: msgspec cannot decode a result into it ({exc}); "
            "pass a type such as int, a dataclass or a msgspec.Struct"
        ) from None


def decodable(result_type: Any) -> None:
    """Raise ConfigurationError unless a stored result can be decoded as ``result_type``
    (checked once per type)."""
    try:
        _decodable(result_type)
    except TypeError:  # unhashable: checked every time
        _decodable.__wrapped__(result_type)


class GuardState(Reporter, Generic[T]):
    """The I/O-free part of a guard: which record, which fingerprint, what a decision means.

    A guard class names its store type and function (``store_type``, ``function``) and adds
    the store calls; it needs no ``__init__`` of its own (one Python call less per guard). As
    a :class:`~idemkey.events.Reporter`, it reports its events and uncertain outcomes.
    """

    __slots__ = (
        "_current",
        "call",
        "claim",
        "fingerprint",
        "key",
        "name",
        "policy",
        "remember",
        "result_type",
        "seconds",
        "store",
    )
    store_type: ClassVar[type[Any]]
    function: ClassVar[str]

    def __init__(
        self,
        store: Any,
        key: str,
        payload: object,
        scope: str,
        policy: Policy | None,
        result_type: Any,
        name: str = "",
        cache_exceptions: object = (),
        deadline: float | None = None,
    ) -> None:
        if not isinstance(store, self.store_type):
            raise ConfigurationError(
                f"{self.function}() takes a store of type {self.store_type.__name__}, "
                f"got {type(store).__name__}"
            )
        self.store = store
        store_policy: Policy = store.policy
        if not isinstance(key, str) or not key:
            raise InvalidKeyError("a guard key must be a non-empty string")
        if not isinstance(scope, str):
            raise ConfigurationError(f"a guard scope must be a str, got {type(scope).__name__}")
        if policy is None or policy is store_policy:
            self.policy = store_policy
        else:
            # Imported here: the HTTP exchange imports this module while policy loads (its
            # default scope is idemkey.http's), so this module needs no policy at import.
            from ..policy import Policy
            from ._policy_check import check_guard_policy

            if not isinstance(policy, Policy):
                raise ConfigurationError(f"policy must be a Policy, got {type(policy).__name__}")
            check_guard_policy(policy, store_policy)
            self.policy = policy
        self.key = key
        self.scope = scope
        self.name = name
        # ``name`` (a decorated function's qualified name) takes the route's place: two
        # functions never share a record, whatever their keys.
        self.record: Record = record_for(self.policy.prefix, scope, GUARD_METHOD, name, key)
        # The Reporter's attributes, set here: its __init__ would be one more call. Events and
        # entries name a decorated function where an HTTP exchange names its route.
        self.hook = self.policy.on_event
        self.method = GUARD_METHOD
        self.route = self.label = name
        self.keep = store.keep_uncertain
        # payload_fingerprint(encode_payload(payload)), without their calls for bytes
        self.fingerprint = PAYLOAD_DIGEST(
            payload if type(payload) is bytes else encode_payload(payload)
        )
        if result_type is not Any:
            decodable(result_type)  # not at the first replay, after the work ran and was stored
        self.result_type = result_type
        #: The exceptions remembered as the outcome (``cache_exceptions=``), None: none.
        self.remember: FailureRules | None = rules_for(cache_exceptions)
        #: The whole job's deadline, seconds from the claim (``deadline=``), or None.
        self.seconds = None if deadline is None else duration(deadline, "deadline=")
        self.claim: Claimed | None = None
        self.call: Call[T] | None = None
        self._current: contextvars.Token[Call[Any] | None] | None = None

    @property
    def origin(self) -> str:
        """Where the record comes from, kept in it for ``store.records()`` (record_origin)."""
        key = self.key if self.policy.keep_keys else None
        return record_origin(self.scope, GUARD_METHOD, self.name, key)

    def enter(self, decision: Decision, seconds: float) -> Call[T]:
        """The Call for a claim or a replay; raises for a mismatch or a request in flight."""
        if type(decision) is Replay:
            response = decision.response
            if response == RESULT_NOT_KEPT:
                self.notify("replayed", detail="result not kept", seconds=seconds)
                raise ResultNotStorableError(self.key, "it could not be encoded on the first run")
            if is_failure(response):
                self.notify("replayed", detail="remembered failure", seconds=seconds)
                raise raise_failure(response, self.remember)
            self.notify("replayed", seconds=seconds)
            return Call(replayed=True, result=decode_value(response, self.result_type))
        if type(decision) is Claimed:
            # The claim first, reported last: a hook interrupted (Ctrl-C in a slow export)
            # leaves a claimed guard, which frees its claim (the block never ran), or gives a
            # takeover up as an interrupted block does (the earlier executor's work is unknown).
            self.claim = decision
            call = self.call = Call(
                replayed=False,
                fence=decision.fence,
                takeover=decision.takeover,
                key=self.key,
                record=self.record,
                ttl_ms=self.policy.ttl_ms,
                compress_at=self.policy.compress_at,
                fingerprint=self.fingerprint,
            )
            self._current = _CURRENT.set(call)
            if decision.takeover:
                # The steps the previous executor finished, as its lease_lost entry lists them:
                # what an operator checks for this incident.
                self.uncertain("takeover", decision.fence, steps=worked(decision.steps))
            self.notify(
                "takeover" if decision.takeover else "claimed", decision.fence, seconds=seconds
            )
            return call
        if type(decision) is Mismatch:
            self.notify("mismatch", seconds=seconds)
            raise KeyReuseError()
        assert isinstance(decision, InFlight)
        self.notify("in_flight", seconds=seconds)
        raise RequestInFlightError(decision.retry_after, decision.lease_remaining)

    def claim_failed(self, error: StoreError) -> Call[T]:
        """Redis failed before the work ran: raise it (``on_store_error="closed"``), or run
        the work unprotected (``"open"``: nothing is claimed or stored, a retry runs again).
        A record the claim cannot read is raised whatever the policy, as HTTP answers it."""
        # Redis answered, so this is no store failure to run beside: under "open" every retry
        # would run the work again (Exchange._failed answers 503 record_unreadable alike).
        if self.policy.on_store_error == "open" and not isinstance(error, RecordFormatError):
            # Kept before the hook hears of it: an interrupted hook must not lose the entry.
            self.uncertain("unprotected", detail=str(error))
            self.notify("unprotected", detail=str(error))
            call = self.call = Call(replayed=False, key=self.key)
            # Current as a claimed call is: current_call() is the block's call, whose fenced
            # work refuses to run (UnprotectedCallError: it has no fence), not "no call".
            self._current = _CURRENT.set(call)
            return call
        self.notify("store_error", detail=str(error))
        raise error

    def job_deadline(self) -> tuple[float, float] | None:
        """(``time.monotonic()`` the deadline passes at, its length), from now: the claim."""
        seconds = self.seconds
        return None if seconds is None else (time.monotonic() + seconds, seconds)

    @property
    def ttl_ms(self) -> int:
        return self.policy.ttl_ms

    def leave(self) -> None:
        """The block has exited: its call is no longer the current one, and nothing of it may
        be saved nor any step of it start any more."""
        if self._current is not None:
            _CURRENT.reset(self._current)
            self._current = None
        call = self.call
        if call is None:
            return
        call._exited = True
        steps = call._steps
        if steps is not None:
            steps.book.close()
        elif call._make_steps is not None:  # never used: stays unbuilt, and is closed once built
            call._make_steps = partial(_closed, call._make_steps)

    def saved(self) -> bytes | None:
        """The result saved in the block, if any (a query: changes nothing)."""
        call = self.call
        if call is None:
            return None
        # Untied (no fenced transaction): the saved value, without a call on the hot path.
        return call._saved if call._ties is None else call._final()

    def outcome(self, exc: BaseException | None) -> bytes | None:
        """What the record completes with: the saved result, else a remembered failure (the
        block raised a declared ``cache_exceptions`` exception), else None: release it."""
        saved = self.saved()
        if saved is None and exc is not None and self.remember is not None:
            return self.remember.encode(exc)
        return saved

    def exited(
        self, done: bool, completing: bool, exc: BaseException | None, seconds: float
    ) -> None:
        """Report how leaving the block went; a lost lease raises unless the block raised."""
        fence = self.claim.fence if self.claim else None
        if not done:  # (``why`` and ``committed`` are read only then)
            # Evicted or deleted under the claim, not taken over; a committed fenced row holds
            # the effect all the same (a retry does not run it again: no one may undo it).
            lost = self.claim is not None and self.store._record_lost(self.record, self.claim.owner)
            committed = self.call.committed_row() if self.call is not None else None
            why = lease_lost_detail(lost, committed)
        # Each uncertain entry is kept before its event: an interrupted hook must not lose it.
        if not completing:
            if done:
                if steps := self.finished_steps():
                    self.uncertain("released_with_steps", fence, str(exc or ""), steps)
                self.notify("released", fence, seconds=seconds)
            else:
                self.uncertain("lease_lost", fence, why, self.finished_steps())
                self.notify("lease_lost", fence, why)
        elif done:
            self.notify("completed", fence, seconds=seconds)
        else:
            self.uncertain("lease_lost", fence, why, self.finished_steps())
            self.notify("lease_lost", fence, why)
            if exc is None:
                raise LeaseLostError(fence, committed is not None, bool(committed and committed[1]))

    def cancelled(self) -> None:
        """The block was cut off before saving a result (a cancel, Ctrl-C), or its takeover's
        hook was: the claim is kept, unrenewed, until its lease lapses; an ``uncertain`` entry
        says so."""
        fence = self.claim.fence if self.claim else None
        lapses = f"the key is held until its lease lapses ({self.policy.lease_ms} ms)"
        self.uncertain("cancelled", fence, lapses, self.finished_steps())

    def store_failed(
        self, error: StoreError, exc: BaseException | None, completing: bool = False
    ) -> None:
        """Redis failed while leaving the block: raise it, unless the block's own exception
        is already on its way out (that one is what the caller must see; ours is logged).
        ``completing``: the block's result was being stored (an uncertain outcome)."""
        fence = self.claim.fence if self.claim else None
        if completing:  # kept before the hook hears of it
            self.uncertain("completion_failed", fence, str(error), self.finished_steps())
        self.notify("store_error", fence, str(error))
        if exc is None:
            raise error

    def finished_steps(self) -> tuple[str, ...]:
        """The finished steps whose work the record keeps done: those this call saw finish or
        resumed, but a remembered failure (it did no work an operator must check)."""
        call = self.call
        steps = call._steps if call is not None else None
        if steps is None:  # never built: only what the claim resumed
            return worked(self.claim.steps) if self.claim else ()
        return steps.book.worked
