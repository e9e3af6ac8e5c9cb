"""The exceptions idemkey raises, under one root.

::

    IdemkeyError
    ├── InvalidKeyError          the Idempotency-Key (or a guard key) is malformed
    ├── KeyReuseError            the key was already used with another payload
    ├── RequestInFlightError     the first request with this key is still running
    ├── LeaseLostError           another executor took the record over, or the record was
    │                            lost from Redis (evicted); our result was not stored
    ├── EffectCommittedError     the key's fenced SQL effect committed but its result was never
    │                            recorded (the process stopped in between): not run again
    ├── ResultNotStorableError   a guard's result cannot be encoded: stored as "result not kept"
    │   └── StepNotStorableError a step's result cannot be encoded: the step is not finished
    ├── StoredFailureError       a remembered failure that is not one the reader declared
    ├── StepAttemptsExhaustedError  a step's retry attempts were all used (across takeovers)
    ├── JobDeadlineError         a guard's deadline= passed: no further step attempt started
    ├── UsageError               the API used out of order (save() on a replayed call)
    │   └── NoResultError        ``call.result`` with no result (also an AttributeError)
    ├── ConfigurationError       a Policy, client or argument that cannot work
    ├── ProtocolError            an integration asked the HTTP exchange's transitions out of order
    └── StoreError               Redis failed or answered something we cannot read
        ├── RecordFormatError    a stored record is not in a format this version reads
        └── UnprotectedCallError fenced() on a call Redis failed to claim (on_store_error="open")

Every error carries the context a caller needs to act (``reason``, ``retry_after`` with
``lease_remaining``, ``fence``), never the raw key of an HTTP request: raw keys are client
input and may be secrets. The guard key on :class:`ResultNotStorableError` is the
application's own (``f"charge:{id}"``).
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "EffectCommittedError",
    "IdemkeyError",
    "InvalidKeyError",
    "JobDeadlineError",
    "KeyReuseError",
    "LeaseLostError",
    "NoResultError",
    "ProtocolError",
    "RecordFormatError",
    "RequestInFlightError",
    "ResultNotStorableError",
    "StepAttemptsExhaustedError",
    "StepNotStorableError",
    "StoredFailureError",
    "StoreError",
    "UnprotectedCallError",
    "UsageError",
]


class IdemkeyError(Exception):
    """Root of every exception idemkey raises.

    ``type(exc)(*exc.args)`` rebuilds any of them, same type, message and attributes: a
    class whose constructor takes other arguments than a message keeps them as ``args``
    (``str()`` and ``repr()`` still show the message).
    """

    _message: str | None = None

    def __str__(self) -> str:
        return super().__str__() if self._message is None else self._message

    def __repr__(self) -> str:
        # What logs show (Celery's "Retry in 1s: RequestInFlightError('... in flight ...')").
        if self._message is None:
            return super().__repr__()
        return f"{type(self).__name__}({self._message!r})"

    def _keep_args(self, *args: object) -> None:
        # Called after __init__(message). Pickle (Celery's prefork pool) and Celery's JSON
        # results rebuild an exception as type(exc)(*exc.args): with only the message there,
        # that failed and Celery handed the caller the nearest base class that rebuilt.
        self._message = super().__str__()
        self.args = args


class InvalidKeyError(IdemkeyError, ValueError):
    """The idempotency key is missing or malformed; ``reason`` says which rule it broke."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class KeyReuseError(IdemkeyError):
    """The key was used before with a different payload; the stored record is untouched."""

    def __init__(self, message: str = "idempotency key reused with a different payload") -> None:
        super().__init__(message)


class RequestInFlightError(IdemkeyError):
    """The first call with this key still runs; try again in ``retry_after`` seconds.

    ``retry_after`` is how long to wait before the next attempt: the time left on the running
    call's lease, at most 1 s (``idemkey._core.in_flight_retry_after``), the same number an
    HTTP duplicate gets as ``Retry-After`` (rounded up to whole seconds there).
    ``lease_remaining`` is the upper bound: when the running call's lease lapses, if it is
    not renewed, and a new attempt may take the record over.
    """

    def __init__(self, retry_after: float, lease_remaining: float | None = None) -> None:
        super().__init__(
            f"a call with this idempotency key is in flight; retry in {retry_after:g} s"
        )
        self._keep_args(retry_after, lease_remaining)
        self.retry_after = retry_after
        self.lease_remaining = retry_after if lease_remaining is None else lease_remaining


class LeaseLostError(IdemkeyError):
    """Our lease lapsed and another executor took the record over, or the record was lost from
    Redis under our claim (evicted, deleted); nothing of ours was stored in Redis.

    ``committed``: the call's fenced SQL transaction committed (``idemkey.contrib.sqlalchemy``),
    so its effect happened and is not run again: ``recorded`` says whether its row holds the
    result (a retry replays it) or not (a retry gets :class:`EffectCommittedError`). Do not
    undo such an effect.
    """

    def __init__(
        self, fence: int | None = None, committed: bool = False, recorded: bool = False
    ) -> None:
        super().__init__(_lease_lost_text(committed, recorded))
        self._keep_args(fence, committed, recorded)
        self.fence = fence
        self.committed = committed
        self.recorded = recorded


def _lease_lost_text(committed: bool, recorded: bool) -> str:
    """What a lost lease leaves: nothing stored, or the call's committed SQL effect."""
    how = (
        "another executor took the record over, or it vanished from Redis (evicted, lost to a "
        "restart without persistence or a failover, or deleted by FLUSHDB, FLUSHALL or a DEL)"
    )
    if not committed:
        lost = "the lease on this idempotency record was lost"
        return f"{lost}, so nothing of this run is stored: {how}"
    then = (
        "with its result: a retry replays it"
        if recorded
        else "without its result: a retry gets EffectCommittedError"
    )
    return (
        f"the lease on this idempotency record was lost ({how}); but this run's effect "
        f"committed in the database {then}, and the work does not run again"
    )


class EffectCommittedError(IdemkeyError):
    """The key's fenced SQL transaction committed (``idemkey.contrib.sqlalchemy``), but no
    result was recorded with it: the process stopped between its COMMIT and the write of its
    result (or HTTP response), and Redis does not have it either. The work is not run again;
    look its outcome up in the database. ``step`` names the step, or is None for the call.
    Every retry of the key gets this error (HTTP: a 409 ``response_lost`` problem).
    """

    def __init__(self, step: str | None = None) -> None:
        what = "this key's effect" if step is None else f"step {step!r} of this key"
        super().__init__(
            f"{what} committed in the database, but its result was not recorded (the process "
            "stopped in between): it is not run again; look its outcome up"
        )
        self._keep_args(step)
        self.step = step


class ResultNotStorableError(IdemkeyError):
    """The guarded work ran, but its result cannot be stored (msgspec cannot encode it).

    The record is completed as "result not kept", so the work never runs again for ``key``:
    the first caller and every retry within the retention window get this error. Return
    something msgspec encodes (built-ins, Structs, dataclasses, ints within 64 bits).
    """

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(
            f"the result for guard key {key!r} could not be stored ({reason}); the work ran "
            "once and will not run again for this key"
        )
        self._keep_args(key, reason)
        self.key = key
        self.reason = reason


class StepNotStorableError(ResultNotStorableError):
    """A step's result cannot be stored (``call.step``): unlike a guard's result, the step does
    not count as finished, so a retry runs it again. ``step`` names it."""

    def __init__(self, key: str, step: str, reason: str) -> None:
        IdemkeyError.__init__(
            self,
            f"the result of step {step!r} for guard key {key!r} could not be stored ({reason}); "
            "the step does not count as finished and runs again on a retry",
        )
        self._keep_args(key, step, reason)
        self.key = key
        self.step = step
        self.reason = reason


class StoredFailureError(IdemkeyError):
    """A failure remembered with ``cache_exceptions=`` cannot be raised again: the record
    names a class that is not one of those declared where it is read (renamed, moved, no
    longer declared, or written by someone else), a field not declared for that class, or
    holds an entry that does not decode. Nothing is imported or built from it. Raised in its
    place on every retry, without running the work; ``type_path`` (``module:qualname``, empty
    when unreadable), ``stored_message`` and ``fields`` are what the record holds, as data."""

    def __init__(
        self, type_path: str, stored_message: str, fields: dict[str, object], reason: str
    ) -> None:
        what = f" {type_path}({stored_message!r})" if type_path else ""
        super().__init__(f"the remembered failure{what} cannot be raised again: {reason}")
        self._keep_args(type_path, stored_message, fields, reason)
        self.type_path = type_path
        self.stored_message = stored_message
        self.fields = fields
        self.reason = reason


class StepAttemptsExhaustedError(IdemkeyError):
    """A step with ``retry=`` found its attempts used up before it could start one: earlier
    executors of the record (crashed, taken over) started ``attempts`` of them already. The step
    does not run; the key is released like for any other exception, and a retry of the whole
    call starts the step's count afresh."""

    def __init__(self, key: str, step: str, attempts: int) -> None:
        super().__init__(
            f"step {step!r} for guard key {key!r} has used all {attempts} attempts "
            "(counted across takeovers); it was not run again"
        )
        self._keep_args(key, step, attempts)
        self.key = key
        self.step = step
        self.attempts = attempts


class JobDeadlineError(IdemkeyError, TimeoutError):
    """The guard's ``deadline=`` (seconds from the claim) passed: no step attempt starts after
    it, and under ``aguard`` a step attempt still running at it is cancelled. The key is
    released like for any other exception, finished steps kept: a retry resumes."""

    def __init__(self, key: str, seconds: float) -> None:
        # Only the message reaches OSError's __init__: two args would be its errno and strerror.
        super().__init__(f"guard key {key!r} ran past its deadline of {seconds:g} s")
        self._keep_args(key, seconds)
        self.key = key
        self.seconds = seconds


class UsageError(IdemkeyError, RuntimeError):
    """An idemkey object was used out of order, such as ``save()`` on a replayed call."""


class NoResultError(UsageError, AttributeError):
    """``call.result`` read before anything was saved on a call that was not replayed."""


class ConfigurationError(IdemkeyError, ValueError):
    """A policy value, client or argument that cannot work."""


class StoreError(IdemkeyError):
    """Redis was unreachable, timed out, or answered with an error."""


class RecordFormatError(StoreError):
    """A stored record was written in a format this version cannot read."""


class UnprotectedCallError(StoreError):
    """``fenced()``/``afenced()`` on a call that runs unprotected: Redis failed and
    ``Policy(on_store_error="open")`` ran the block without a claim, so there is no fence to
    check the transaction against. The fenced work refuses to run (its transaction rolls back);
    retry once Redis is back."""

    def __init__(self) -> None:
        super().__init__(
            "fenced work refused: this call runs unprotected (Redis failed and "
            'Policy(on_store_error="open") ran it without a claim), so it has no fence'
        )
        self._keep_args()


class ProtocolError(IdemkeyError, RuntimeError):
    """A transition of one HTTP exchange was asked out of order (an integration bug, never a
    client's).

    ``state`` is where the exchange was and ``transition`` what was asked of it, as h11's
    ``LocalProtocolError``: the exchange is unchanged, so nothing stored is lost.
    """

    def __init__(self, state: str, transition: str) -> None:
        super().__init__(f"cannot {transition} an exchange that is {state}")
        self._keep_args(state, transition)
        self.state = state
        self.transition = transition

    @property
    def step(self) -> str:
        """The 0.2 name of :attr:`transition`."""
        return self.transition
