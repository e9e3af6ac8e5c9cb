"""The I/O-free part of guard() / aguard(): the Call they yield (its saved result, its steps,
its ties to fenced transactions) and the current call of a context. What each decision means,
:class:`GuardState`, lives in ``_state``; both guards (``_async_guard``, and ``_sync_guard``
generated from it) build on it, and only the store calls differ.
"""

from __future__ import annotations

import contextvars
import enum
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from .._codec import RESULT_NOT_KEPT, encode_value
from .._core import Record
from ..errors import ConfigurationError, NoResultError, ResultNotStorableError, UsageError
from ._failures import rules_for
from ._retry import StepRetry

if TYPE_CHECKING:
    from ._async_steps import AsyncSteps
    from ._sync_steps import Steps

__all__ = [
    "GUARD_METHOD",
    "Call",
    "Tie",
    "TieState",
    "current_call",
    "leave_current",
    "run_as_current",
]

T = TypeVar("T")
GUARD_METHOD = "GUARD"  # the record's "method" for guards: never equal to an HTTP method's record

_UNSET: Any = object()
_BUILDING: Final = threading.Lock()  # Call._runner's, for every call: a first step takes it


class Call(Generic[T]):
    """What a guard yields: either a replay of the stored result, or a claim to do the work."""

    __slots__ = (
        "__weakref__",
        "_compress_at",
        "_exited",
        "_fingerprint",
        "_kept",
        "_key",
        "_make_steps",
        "_result",
        "_rows",
        "_saved",
        "_steps",
        "_store_effects",
        "_ties",
        "fence",
        "record",
        "replayed",
        "takeover",
        "ttl_ms",
    )

    #: True once the guard's block has exited (set by ``GuardState.leave``); unset until then,
    #: so that building a call (an HTTP handler's, on every first request) costs nothing more.
    _exited: bool
    #: The rows this call's fenced transactions committed (``contrib.sqlalchemy``): step name
    #: (None: the call's own row) to the fence and the result the commit wrote into it, None
    #: when it wrote none (the result is recorded there before Redis completes). Unset until
    #: one committed, so a call costs nothing more.
    _rows: dict[str | None, tuple[int, bytes | None]]
    #: The ``effects=`` of the store an HTTP handler's call was claimed in (a call without
    #: steps cannot name its store): set by the driver of a store that has one, so fenced()
    #: writes the table its lookups read. Unset otherwise, so a call costs nothing more.
    _store_effects: Any

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
        fingerprint: bytes | None = None,
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
        # The request fingerprint the claim was for (None: not claimed): a fenced row keeps
        # it, so after Redis forgot the record another request with the key is key reuse.
        self._fingerprint = fingerprint
        self._result: T = result
        self._saved: bytes | None = None
        # The transactions the saved result depends on (``contrib.sqlalchemy.fenced`` ties
        # them), still open or committing; None for a call never tied (the usual one).
        self._ties: list[Tie] | None = None
        # The saved value went through a tied transaction's commit: a later rollback of
        # another tied transaction does not take it back.
        self._kept = False
        # How to build this call's steps: set by guard / aguard on a call that runs; None for
        # a call without steps (a replay, an HTTP handler's). Built on first use into
        # ``_steps`` (most calls run no step, and building costs two Python calls).
        self._make_steps: Callable[[], Steps | AsyncSteps] | None = None
        self._steps: Steps | AsyncSteps | None = None

    def unrecorded_fence(self, step: str | None = None) -> int | None:
        """The fence of a fenced transaction of this call that committed with no result for
        ``step`` (None: the call's own result), whose row gets that result before Redis does
        (``contrib.sqlalchemy``); None when there is none."""
        rows = getattr(self, "_rows", None)
        row = rows.get(step) if rows else None
        return row[0] if row is not None and row[1] is None else None

    def outdated_fence(self, saved: bytes) -> int | None:
        """The fence of the call's own fenced row when it lacks ``saved``, the result the
        record completes with: it committed with none, or with a value saved over since (the
        last save is the answer, in the row as in Redis). None: it holds it, or there is none.
        """
        rows = getattr(self, "_rows", None)
        row = rows.get(None) if rows else None
        return row[0] if row is not None and row[1] != saved else None

    def _effects(self) -> Any:
        """The ``effects=`` of the store this call was claimed in (its steps are built with
        that store; an HTTP handler's call has none, its driver sets it), or None: none, or not
        known (a replay, a call built by hand)."""
        steps = self._steps if getattr(self, "_exited", False) else self._runner()
        if steps is None:
            return getattr(self, "_store_effects", None)
        return getattr(getattr(steps, "store", None), "effects", None)

    def committed_row(self) -> tuple[int, bool] | None:
        """The call's own fenced row, if one committed: its fence, and whether it holds a
        result (a retry replays it) or not yet (a retry gets ``EffectCommittedError``)."""
        rows = getattr(self, "_rows", None)
        row = rows.get(None) if rows else None
        return None if row is None else (row[0], row[1] is not None)

    def _row_committed(self, step: str | None, fence: int, result: bytes | None) -> None:
        """The fenced row of ``step`` (None: the call's own) commits with ``result`` in it
        (None: none yet; the guard, the step runner or the HTTP driver records it there)."""
        rows = getattr(self, "_rows", None)
        if rows is None:
            self._rows = {step: (fence, result)}
        else:
            rows[step] = (fence, result)

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
        """This call's steps, built now if they were not yet; None: it has none."""
        if self._steps is None and self._make_steps is not None:
            with _BUILDING:  # once: a block's threads must share one book, or a step runs twice
                if self._steps is None and self._make_steps is not None:
                    self._steps = self._make_steps()
        return self._steps

    def save(self, value: T) -> None:
        """Record the result; the record completes with it when the block exits (unless a
        fenced SQL transaction it was saved in did not commit: see ``contrib.sqlalchemy``).

        A value msgspec cannot encode raises :class:`ResultNotStorableError`, and the record
        then completes as "result not kept": the work has run, so it must not run again.
        After the guard's block has exited (the record was completed or released as it did)
        ``save()`` raises :class:`UsageError`: the value could no longer be stored.
        """
        self._saving()
        try:
            self._saved = encode_value(value, self._compress_at)
        except ConfigurationError as exc:
            self._saved, self._result = RESULT_NOT_KEPT, _UNSET
            raise ResultNotStorableError(self._key, str(exc.__cause__ or exc)) from exc
        self._result = value

    def save_not_kept(self) -> None:
        """Record that the work ran but its result is not kept: the record completes as
        "result not kept" when the block exits, and every retry raises
        :class:`ResultNotStorableError` without running the work again. What :meth:`save`
        does with a value msgspec cannot encode, without raising: for a result refused by
        rules of its own (a tool result outside its output schema, a task result the result
        backend would not give back equal). The same :class:`UsageError` as :meth:`save`.
        """
        self._saving()
        self._saved, self._result = RESULT_NOT_KEPT, _UNSET

    def _saving(self) -> None:
        """A result is being saved: refused on a replay and after the block; COMMITs of tied
        transactions that returned count as committed, and the new value is kept by none."""
        if self.replayed:
            raise UsageError("cannot save() on a replayed call")
        if getattr(self, "_exited", False):
            raise UsageError(
                "call.save() after the guard's block has exited: the record was settled as it "
                "exited, and nothing saved now would be stored; save() inside the block"
            )
        if self._ties:
            self._resolve()
        self._kept = False

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
        if tie.state is TieState.ENDED:
            return  # reported twice (a failed COMMIT, then its connection's rollback)
        tie.state = TieState.ENDED
        if self._ties is not None and tie in self._ties:
            self._ties.remove(tie)
        if committed:
            self._kept = self._saved is not None
        elif not self._kept:
            self._saved, self._result = None, _UNSET

    def _resolve(self) -> None:
        """COMMITs that were sent and did not fail have returned by now: they committed."""
        assert self._ties is not None
        for tie in [tie for tie in self._ties if tie.state is TieState.COMMITTING]:
            self._ended(tie, True)

    def _final(self) -> bytes | None:
        """The result to complete the record with, or None to release it: nothing saved, or
        a tied transaction rolled back (the value went with it) or is still open (its commit
        writes the value into the row, where the next claim recovers it)."""
        if self._ties is None:
            return self._saved
        self._resolve()
        return None if self._ties else self._saved


class TieState(enum.Enum):
    """Where a tied transaction is (members compare by identity)."""

    OPEN = "open"
    #: Its COMMIT was sent: committed from the call's next step on, unless it fails first.
    COMMITTING = "committing"
    #: Committed or rolled back, and reported: the call no longer waits for it.
    ENDED = "ended"


class Tie:
    """One database transaction a call's saved result depends on, until it ends.

    ``committing`` is for a connection whose COMMIT was sent: a failure reports it rolled
    back at once; otherwise it counts as committed from the call's next step on.
    """

    __slots__ = ("call", "state")

    def __init__(self, call: Call[Any]) -> None:
        self.call = call
        self.state = TieState.OPEN

    def committing(self) -> None:
        if self.state is TieState.OPEN:
            self.state = TieState.COMMITTING

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
    claimed block (a replay, a request idemkey does not guard). A block that runs unprotected
    (Redis down under ``Policy(on_store_error="open")``) has a call with no fence:
    ``fenced()`` refuses it with :class:`UnprotectedCallError`.
    """
    call = _CURRENT.get()
    if call is None:
        raise LookupError("no claimed idemkey call is running in this context")
    return call
