"""Recovery points, without I/O: step names, their Redis fields and keys, and the order rules.

A claimed call runs named steps (``call.step(name, fn, ...)``). Each finished step's result
is stored in the record by checkpoint.lua, written only by the record's current owner. A later
executor of the same key (a retry after a release, a takeover after a crash) receives the
finished steps with its claim and gets their results back instead of running them again.

:class:`StepBook` owns the rules for one claimed call; the shells, ``AsyncSteps`` in
``guard/_async_steps.py`` and ``Steps`` generated from it, only move bytes between it, the step
function and the store, and run one attempt of a step through the hand-written pair
``_async_attempt`` / ``_sync_attempt`` (what a task and a thread do differently):

* a name is validated before anything runs (:func:`check_step_name`);
* a finished step (ours or an earlier executor's) is never run again: its stored result is
  returned, so the code after a step sees the same value on a first run and on a resume;
* one name cannot run twice at once (two tasks of one call);
* after a checkpoint was refused (our lease was taken over) no step starts: the call is lost;
* after the guard's block has exited no step starts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any, Final

from .._codec import decode_value
from ..errors import ConfigurationError, LeaseLostError, UsageError
from ._failures import FailureRules, is_failure, raise_failure

__all__ = [
    "MAX_STEP_NAME",
    "StepBook",
    "attempt_field",
    "check_step_name",
    "step_field",
    "step_key",
    "stored_step",
    "worked",
]

#: Longest step name, in characters: names are code, not data.
MAX_STEP_NAME: Final = 100
# Step results live in the record hash under "s:<name>", and the attempt counts of retried
# steps under "a:<name>": no other record field starts so.
_FIELD_PREFIX: Final = "s:"
_ATTEMPT_PREFIX: Final = "a:"


def check_step_name(name: object) -> str:
    """Return ``name`` if it can name a step, else raise :class:`ConfigurationError`.

    A step name is a non-empty ``str`` of at most ``MAX_STEP_NAME`` printable characters: it
    is stored as part of a Redis field name and shown in logs, so it must read back exactly as
    written.
    """
    if not isinstance(name, str):
        raise ConfigurationError(f"a step name must be a str, not {type(name).__name__}")
    if not name:
        raise ConfigurationError("a step name must not be empty")
    if len(name) > MAX_STEP_NAME:
        raise ConfigurationError(f"a step name must be at most {MAX_STEP_NAME} characters")
    # isprintable() is False for control characters and for lone surrogates (which UTF-8
    # cannot encode), so a printable name always round-trips through Redis.
    if not name.isprintable():
        raise ConfigurationError("a step name must be printable (no control characters)")
    return name


def step_field(name: str) -> str:
    """The record-hash field holding the result of step ``name`` (already checked)."""
    return _FIELD_PREFIX + name


def attempt_field(name: str) -> str:
    """The record-hash field counting the attempts of retried step ``name`` (attempt.lua)."""
    return _ATTEMPT_PREFIX + name


def stored_step(stored: bytes, remember: FailureRules | None) -> Any:
    """What a finished step gives back: its stored value, decoded, or the exception it
    remembered, raised again only as one of the classes this step declares
    (``cache_exceptions=``, ``remember``), else :class:`StoredFailureError`."""
    if is_failure(stored):
        raise raise_failure(stored, remember)
    return decode_value(stored)


def worked(finished: Iterable[tuple[str, bytes]]) -> tuple[str, ...]:
    """Names of the finished steps whose work is done, from (name, stored result) pairs: a
    remembered failure (a declined card) did none, so there is nothing of it to reconcile."""
    return tuple(name for name, stored in finished if not is_failure(stored))


def step_key(record_digest: str, name: str) -> str:
    """A key for the downstream call made inside step ``name`` of the record ``record_digest``.

    The same for every executor of the record (first run, retry, takeover), so the downstream
    service (a PSP's own idempotency key) dedups a step that ran but was not checkpointed
    before a crash. Derived from the record's digest, never from the raw key (which may be a
    secret); 35 ASCII characters, within every PSP's limit.
    """
    material = f"{record_digest}\x00{check_step_name(name)}".encode()
    return "ik_" + hashlib.blake2b(material, digest_size=16).hexdigest()


class StepBook:
    """The steps of one claimed call: which are finished, which run, whether we may go on."""

    __slots__ = ("_closed", "_done", "_lost", "_running", "_unkept", "fence", "resumed")

    def __init__(self, fence: int | None, finished: Iterable[tuple[str, bytes]] = ()) -> None:
        self.fence = fence
        self._done: dict[str, bytes] = dict(finished)
        #: Names of the steps an earlier executor finished (their results came with the claim).
        self.resumed: tuple[str, ...] = tuple(self._done)
        # Each running step's token: begin claims a name with one atomic setdefault (a block's
        # threads may start steps at once; this module takes no lock, as it does no I/O).
        self._running: dict[str, object] = {}
        #: A step whose work ran but whose checkpoint the store refused (the lease was lost).
        self._unkept: tuple[str, ...] = ()
        self._lost = False
        self._closed = False

    @property
    def finished(self) -> tuple[str, ...]:
        """Names of every finished step the record keeps: resumed, and run by this call."""
        return tuple(self._done)

    @property
    def worked(self) -> tuple[str, ...]:
        """Names of the finished steps whose work is done (not a remembered failure), and of
        a step whose work ran but whose checkpoint was refused: what an uncertain outcome
        lists for an operator to check."""
        return worked(self._done.items()) + self._unkept

    def begin(self, name: object) -> bytes | None:
        """Start step ``name``: its stored result if it is finished (do not run it), else None
        (run it, then :meth:`finish` or :meth:`abandon`)."""
        name = check_step_name(name)
        if self._closed:
            raise UsageError("call.step() after the guard's block has exited")
        if self._lost:
            raise LeaseLostError(self.fence)
        if name in self._done:
            return self._done[name]
        token = object()
        if self._running.setdefault(name, token) is not token:
            raise UsageError(f"step {name!r} is already running in this call")
        # Finished by another thread since the check above (finish() stores the result before
        # it frees the name): its result, not a second run.
        if name in self._done:
            self._running.pop(name, None)
            return self._done[name]
        return None

    def finish(self, name: str, result: bytes) -> None:
        """The store took the checkpoint of ``name``: it is finished."""
        self._done[name] = result  # first: see begin
        self._running.pop(name, None)

    def abandon(self, name: str) -> None:
        """``name`` raised, or its result could not be stored: not finished, may run again.
        A step already finished stays so (its checkpoint was cut off by a cancel)."""
        self._running.pop(name, None)

    def lose(self, name: str, ran: bool = False) -> LeaseLostError:
        """The store refused the checkpoint of ``name``: another executor owns the record now.
        ``ran``: the step's work is done (its result was being kept), so the uncertain entry
        names it among the steps to check. Returns the error to raise; no later step of this
        call will start."""
        self._running.pop(name, None)
        if ran and name not in self._done:
            self._unkept += (name,)
        self._lost = True
        return LeaseLostError(self.fence)

    def close(self) -> None:
        """The guard's block has exited."""
        self._closed = True
