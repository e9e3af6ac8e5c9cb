"""The I/O-free part of guard() / aguard(): the Call they yield and what each decision means.

Both guards (``_async_guard``, and ``_sync_guard`` generated from it) build on
:class:`GuardState`; only the store calls differ.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Final, Generic, TypeVar

from .._codec import RESULT_NOT_KEPT, decode_value, encode_payload, encode_value
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
    NoResultError,
    RequestInFlightError,
    ResultNotStorableError,
    StoreError,
    UsageError,
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
from ._failures import FailureRules, is_failure, raise_failure, rules_for
from ._retry import StepRetry

if TYPE_CHECKING:
    from ..policy import Policy
    from ..store.uncertain import UncertainKind
    from ._async_steps import AsyncSteps
    from ._sync_steps import Steps

__all__ = [
    "GUARD_METHOD",
    "Call",
    "GuardState",
    "Tie",
    "current_call",
    "leave_current",
    "run_as_current",
]

T = TypeVar("T")
GUARD_METHOD = "GUARD"  # the record's "method" for guards: never equal to an HTTP method's record

_UNSET: Any = object()


class Call(Generic[T]):
    """What a guard yields: either a replay of the stored result, or a claim to do the work."""

    __slots__ = (
        "_compress_at",
        "_kept",
        "_key",
        "_result",
        "_saved",
        "_steps",
        "_ties",
        "_unrecorded",
        "fence",
        "record",
        "replayed",
        "takeover",
        "ttl_ms",
    )

    def __init__(
        self,
        *,
        replayed: bool,
        result: Any = _UNSET,
        fence: int | None = None,
        takeover: bool = False,
        key: str = "",
        record: Record | None = None,
        ttl_ms: int | None = None,
        compress_at: int | None = None,
    ) -> None:
        self._key = key
        self._compress_at = compress_at
        self.replayed = replayed
        #: The claimed record's names; its ``digest`` names it in SQL (``contrib.sqlalchemy``).
        self.record = record
        #: The record's retention, milliseconds.
        self.ttl_ms = ttl_ms
        #: Fencing token: grows with every takeover; pass it to downstream writes.
        self.fence = fence
        #: True when this claim took over from an executor whose lease lapsed.
        self.takeover = takeover
        self._result: T = result
        self._saved: bytes | None = None
        # The transactions the saved result depends on (``contrib.sqlalchemy.fenced`` ties
        # them), still open or committing; None for a call never tied (the usual one).
        self._ties: list[Tie] | None = None
        # The saved value went through a tied transaction's commit: a later rollback of
        # another tied transaction does not take it back.
        self._kept = False
        # Fenced rows (step name, None for the call's) that committed with no result in them,
        # and their fence: the result is recorded there before Redis completes (None: none).
        self._unrecorded: dict[str | None, int] | None = None
        # Set by guard / aguard on a call that runs: runs its steps against the store.
        # Built on first use (most calls run no step): a factory until then.
        self._steps: Steps | AsyncSteps | Callable[[], Steps | AsyncSteps] | None = None

    @property
    def result(self) -> T:
        """The stored result of the first run (only when ``replayed``), or what was saved."""
        result = self._result
        if result is _UNSET:
            raise NoResultError("no result: this call was not replayed and nothing was saved")
        return result

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        retry: StepRetry | None = None,
        cache_exceptions: object = (),
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` once for this record as the step ``name`` (a recovery
        point), and return its result.

        ``retry=StepRetry(...)`` retries a failing ``fn`` in place (attempts counted in the
        record, across takeovers); ``cache_exceptions=(CardDeclined, ...)`` stores such a
        failure as the step's outcome, raised again by every later executor without running
        ``fn``. Both are keyword-only and not passed to ``fn``.

        The result is stored in the record before this returns. An executor that takes the
        key over after a crash, or retries it after a release, gets the stored result of a
        finished step without running ``fn`` again, and runs the steps that did not finish.
        The value returned is the stored one (msgspec built-ins: a dataclass comes back as a
        dict), the same on a first run and on a resume. Under :func:`aguard` this returns an
        awaitable (``await call.step(...)``) and ``fn`` may be a coroutine function.

        Raises :class:`LeaseLostError` when another executor took the record over (nothing
        stored; no later step runs), :class:`StepNotStorableError` for a result msgspec cannot
        encode (the step then does not count as finished), :class:`ConfigurationError` for a
        bad name. See docs/steps.md.
        """
        steps = self._runner()
        if steps is None:
            raise UsageError(self._no_steps("call.step()"))
        if retry is not None and not isinstance(retry, StepRetry):
            raise ConfigurationError(f"retry= takes a StepRetry, got {type(retry).__name__}")
        if retry is None and not cache_exceptions:  # the usual step: nothing more to check
            return steps.run(name, fn, args, kwargs)
        return steps.run(name, fn, args, kwargs, retry, rules_for(cache_exceptions))

    def step_key(self, name: str) -> str:
        """A key for the downstream call inside step ``name`` (e.g. a PSP's idempotency key):
        the same for every executor of this record, so a step that ran but crashed before its
        checkpoint is deduplicated downstream. Pass ``call.fence`` along where it is accepted.
        """
        steps = self._runner()
        if steps is None:
            raise UsageError(self._no_steps("call.step_key()"))
        return steps.step_key(name)

    @property
    def resumed_steps(self) -> tuple[str, ...]:
        """Names of the steps an earlier executor finished (returned, not run, by step())."""
        steps = self._runner()
        return steps.book.resumed if steps is not None else ()

    def _no_steps(self, what: str) -> str:
        """Why ``what`` cannot run here: a replay runs nothing; an HTTP handler's call has
        no steps (its record is the response's)."""
        if self.replayed:
            return f"{what} needs a call that runs: this one was replayed"
        return f"{what} needs a guard() or @idempotent call: this call has no steps"

    def _runner(self) -> Steps | AsyncSteps | None:
        steps = self._steps
        if callable(steps):
            steps = self._steps = steps()
        return steps

    def save(self, value: T) -> None:
        """Record the result; the record completes with it when the block exits (unless a
        fenced SQL transaction it was saved in did not commit: see ``contrib.sqlalchemy``).

        A value msgspec cannot encode raises :class:`ResultNotStorableError`, and the record
        then completes as "result not kept": the work has run, so it must not run again.
        """
        if self.replayed:
            raise UsageError("cannot save() on a replayed call")
        if self._ties:
            self._resolve()
        self._kept = False
        try:
            self._saved = encode_value(value, self._compress_at)
        except ConfigurationError as exc:
            self._saved, self._result = RESULT_NOT_KEPT, _UNSET
            raise ResultNotStorableError(self._key, str(exc.__cause__ or exc)) from exc
        self._result = value

    # The transaction a result is saved in: a value saved in a transaction that rolls back did
    # not happen, so it must never complete the record. ``contrib.sqlalchemy`` reports each
    # fenced transaction's end here; the guard completes only with a value no open or
    # rolled-back transaction holds (:meth:`_final`). Calls never tied keep the plain rule: a
    # saved value completes, even when the block raises afterwards.

    def _tie(self) -> Tie:
        """A transaction this call's saved result now depends on, open until reported."""
        if self._ties:
            self._resolve()
        tie = Tie(self)
        if self._ties is None:
            self._ties = [tie]
        else:
            self._ties.append(tie)
        return tie

    def _refused(self) -> None:
        """The record's fence refused this call's transaction: what it saved for it is void."""
        if self._ties:
            self._resolve()
        if not self._kept:
            self._saved, self._result = None, _UNSET

    def _ended(self, tie: Tie, committed: bool) -> None:
        if tie.state is _ENDED:
            return  # reported twice (a failed COMMIT, then its connection's rollback)
        tie.state = _ENDED
        if self._ties is not None and tie in self._ties:
            self._ties.remove(tie)
        if committed:
            self._kept = self._saved is not None
        elif not self._kept:
            self._saved, self._result = None, _UNSET

    def _resolve(self) -> None:
        """COMMITs that were sent and did not fail have returned by now: they committed."""
        assert self._ties is not None
        for tie in [tie for tie in self._ties if tie.state is _COMMITTING]:
            self._ended(tie, True)

    def _final(self) -> bytes | None:
        """The result to complete the record with, or None to release it: nothing saved, or
        a tied transaction rolled back (the value went with it) or is still open (its commit
        writes the value into the row, where the next claim recovers it)."""
        if self._ties is None:
            return self._saved
        self._resolve()
        return None if self._ties else self._saved


_OPEN: Final = "open"
_COMMITTING: Final = "committing"
_ENDED: Final = "ended"


class Tie:
    """One database transaction a call's saved result depends on, until it ends.

    ``committing`` is for a connection whose COMMIT was sent: a failure reports it rolled
    back at once; otherwise it counts as committed from the call's next step on.
    """

    __slots__ = ("call", "state")

    def __init__(self, call: Call[Any]) -> None:
        self.call = call
        self.state: str = _OPEN

    def committing(self) -> None:
        if self.state is _OPEN:
            self.state = _COMMITTING

    def committed(self) -> None:
        self.call._ended(self, True)

    def rolled_back(self) -> None:
        self.call._ended(self, False)


_CURRENT: contextvars.ContextVar[Call[Any] | None] = contextvars.ContextVar(
    "idemkey_current_call", default=None
)


#: ``run_as_current(call)``: make ``call`` the current call of this context (None: no call),
#: for the HTTP integrations, whose app runs between two steps of theirs rather than in a
#: ``with`` block. The context variable's own (C) method: no Python call per request.
run_as_current: Final = _CURRENT.set


def leave_current(call: Call[Any]) -> None:
    """``call`` is over: no longer the current call, if it still is (a nested guard's block
    restores its outer call itself)."""
    if _CURRENT.get() is call:
        _CURRENT.set(None)


def current_call() -> Call[Any]:
    """The claimed call whose block, ``@idempotent`` function or HTTP handler runs in this context.

    The one way to reach the record's fence (``current_call().fence``) from code that is not
    handed the call: a function under ``@idempotent``, or a handler behind an idemkey
    middleware, that fences its transaction (``idemkey.contrib.sqlalchemy.fenced(session,
    current_call())``) or passes the fence downstream. Raises ``LookupError`` outside a
    claimed block (a replay, a request idemkey does not guard).
    """
    call = _CURRENT.get()
    if call is None:
        raise LookupError("no claimed idemkey call is running in this context")
    return call


def _closed(make: Callable[[], Steps | AsyncSteps]) -> Steps | AsyncSteps:
    """Build the steps of a block that has exited, closed: no step may start."""
    steps = make()
    steps.book.close()
    return steps


class GuardState(Generic[T]):
    """The I/O-free part of a guard: which record, which fingerprint, what a decision means.

    A guard class names its store type and function (``store_type``, ``function``) and adds
    the store calls; it needs no ``__init__`` of its own (one Python call less per guard).
    """

    __slots__ = (
        "_current",
        "call",
        "claim",
        "fingerprint",
        "key",
        "name",
        "policy",
        "record",
        "remember",
        "result_type",
        "scope",
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
        # payload_fingerprint(encode_payload(payload)), without their calls for bytes
        self.fingerprint = PAYLOAD_DIGEST(
            payload if type(payload) is bytes else encode_payload(payload)
        )
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
            self.claim = decision
            self.notify(
                "takeover" if decision.takeover else "claimed", decision.fence, seconds=seconds
            )
            if decision.takeover:
                # The steps the previous executor finished, as its lease_lost entry lists them:
                # what an operator checks for this incident.
                resumed = tuple(name for name, _ in decision.steps)
                self.uncertain("takeover", decision.fence, steps=resumed)
            call = self.call = Call(
                replayed=False,
                fence=decision.fence,
                takeover=decision.takeover,
                key=self.key,
                record=self.record,
                ttl_ms=self.policy.ttl_ms,
                compress_at=self.policy.compress_at,
            )
            self._current = _CURRENT.set(call)
            return call
        if type(decision) is Mismatch:
            self.notify("mismatch", seconds=seconds)
            raise KeyReuseError()
        assert isinstance(decision, InFlight)
        self.notify("in_flight", seconds=seconds)
        raise RequestInFlightError(decision.retry_after, decision.lease_remaining)

    def claim_failed(self, error: StoreError) -> Call[T]:
        """Redis failed before the work ran: raise it (``on_store_error="closed"``), or run
        the work unprotected (``"open"``: nothing is claimed or stored, a retry runs again)."""
        if self.policy.on_store_error == "open":
            self.notify("unprotected", detail=str(error))
            self.uncertain("unprotected", detail=str(error))
            self.call = Call(replayed=False, key=self.key)
            return self.call
        self.notify("store_error", detail=str(error))
        raise error

    def job_deadline(self) -> tuple[float, float] | None:
        """(``time.monotonic()`` the deadline passes at, its length), from now: the claim."""
        seconds = self.seconds
        return None if seconds is None else (time.monotonic() + seconds, seconds)

    @property
    def ttl_ms(self) -> int:
        return self.policy.ttl_ms

    def close_steps(self) -> None:
        """The block has exited: no step may start any more."""
        call = self.call
        if call is None or call._steps is None:
            return
        steps = call._steps
        if callable(steps):  # never used: stays unbuilt, and is closed once built
            call._steps = partial(_closed, steps)
        else:
            steps.book.close()

    def saved(self) -> bytes | None:
        """The saved result, if any; the block is left, so it is no longer the current call."""
        if self._current is not None:
            _CURRENT.reset(self._current)
            self._current = None
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
        why = TAKEN_OVER_DETAIL
        if (
            not done
            and self.claim is not None
            and self.store._record_lost(self.record, self.claim.owner)
        ):
            why = RECORD_LOST_DETAIL  # evicted or deleted under the claim, not taken over
        if not completing:
            if done:
                self.notify("released", fence, seconds=seconds)
                if steps := self.finished_steps():
                    self.uncertain("released_with_steps", fence, str(exc or ""), steps)
            else:
                self.notify("lease_lost", fence, why)
                self.uncertain("lease_lost", fence, why, self.finished_steps())
        elif done:
            self.notify("completed", fence, seconds=seconds)
        else:
            self.notify("lease_lost", fence, why)
            self.uncertain("lease_lost", fence, why, self.finished_steps())
            if exc is None:
                raise LeaseLostError(fence)

    def cancelled(self) -> None:
        """The block was cancelled by its caller before saving a result (asyncio): the claim
        is kept, unrenewed, until its lease lapses; an ``uncertain`` entry says so."""
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
        self.notify("store_error", fence, str(error))
        if completing:
            self.uncertain("completion_failed", fence, str(error), self.finished_steps())
        if exc is None:
            raise error

    def finished_steps(self) -> tuple[str, ...]:
        """The finished steps the record keeps: those this call saw finish or resumed."""
        call = self.call
        steps = call._steps if call is not None else None
        if steps is None or callable(steps):  # never built: only what the claim resumed
            return tuple(name for name, _ in self.claim.steps) if self.claim else ()
        return steps.book.finished

    def uncertain(
        self,
        kind: UncertainKind,
        fence: int | None = None,
        detail: str = "",
        steps: tuple[str, ...] = (),
    ) -> None:
        """Keep an outcome an operator must check in the store's stream (never raises)."""
        keep = getattr(self.store, "keep_uncertain", None)
        if keep is not None:
            keep(kind, self.record, self.scope, GUARD_METHOD, self.name, fence, detail, steps)

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
        # Events name a decorated function where an HTTP event names its route.
        report(hook, kind, self.record, self.scope, GUARD_METHOD, self.name, fence, detail, seconds)
