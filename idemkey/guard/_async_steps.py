"""AsyncSteps: the I/O shell of recovery points (``call.step``) under aguard.

One text for both guards: the async file is the source, and scripts/unasync.py writes the sync
one (``Steps``, for guard) from it. Every rule is in :class:`idemkey.guard._steps.StepBook`;
this moves bytes between it, the step function and the store. One attempt of a step function
runs in the hand-written ``_async_attempt`` (the generated file imports ``_sync_attempt``).
"""

# unasync: generates _sync_steps.py
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Final

from .._codec import encode_value
from .._core import Claimed, Record
from ..errors import (
    ConfigurationError,
    EffectCommittedError,
    JobDeadlineError,
    KeyReuseError,
    StepAttemptsExhaustedError,
    StepNotStorableError,
    StoreError,
)
from ..events import Reporting, logger
from ..store import AsyncRedisStore
from ..store._base import COMMITTED_ONLY
from ..store._concurrency._async_runtime import Cancelled, finish, sleep
from ._async_attempt import run_attempt
from ._failures import FailureRules
from ._retry import StepRetry
from ._steps import StepBook, attempt_field, step_field, step_key, stored_step

__all__ = ["AsyncSteps"]

#: How a thread is cut off part way, at any bytecode, a store write's too: Ctrl-C, an exit from
#: a signal handler. (asyncio delivers Ctrl-C to a task as a cancel: ``Cancelled``.)
_INTERRUPTED: Final = (KeyboardInterrupt, SystemExit)


class AsyncSteps:
    """Runs the steps of one call: claimed (checkpointed), or unprotected (``claim`` None:
    Redis failed and ``on_store_error="open"`` runs the block anyway, storing nothing)."""

    __slots__ = ("book", "call", "deadline", "key", "owner", "record", "reporter", "store")

    def __init__(
        self,
        store: AsyncRedisStore,
        record: Record,
        claim: Claimed | None,
        key: str,
        deadline: tuple[float, float] | None = None,
        call: Any = None,
        reporter: Reporting | None = None,
    ) -> None:
        self.store = store
        #: The guard: reports what the steps could not store (None: logged only).
        self.reporter = reporter
        #: The Call whose steps these are (``_call`` imports this module: not typed here);
        #: its fenced rows say where a step's result is recorded.
        self.call = call
        self.record = record
        self.key = key
        #: The guard's deadline: (``time.monotonic()`` it passes at, its length in seconds).
        self.deadline = deadline
        self.owner = claim.owner if claim is not None else None
        self.book = StepBook(claim.fence if claim else None, claim.steps if claim else ())

    def step_key(self, name: str) -> str:
        return step_key(self.record.digest, name)

    async def run(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        retry: StepRetry | None = None,
        remember: FailureRules | None = None,
    ) -> Any:
        book = self.book
        stored = book.begin(name)
        if stored is None and self.store.effects is not None and self.owner is not None:
            stored = await self._committed(name)
        if stored is not None:
            return stored_step(stored, remember)  # a remembered failure raises, not run
        try:
            try:
                if retry is None:
                    value = await self._attempt(name, fn, args, kwargs, None)
                else:
                    value = await self._retried(name, fn, args, kwargs, retry, remember)
            except Exception as exc:
                failure = remember.encode(exc) if remember is not None else None
                if failure is None:
                    raise
                # A declared deterministic failure: stored as the step's result, so every
                # later executor raises it again instead of running the step.
                kept = await self._checkpoint(name, failure)
                if kept is None:
                    raise book.lose(name) from exc
                book.finish(name, kept)
                raise
            try:
                encoded = encode_value(value)
            except ConfigurationError as exc:
                # Refused before it counts as finished: a retry runs the step again.
                raise StepNotStorableError(self.key, name, str(exc.__cause__ or exc)) from exc
            if self.store.effects is not None:  # else no row can hold it: no call at all
                stored = await self._record(name, encoded)
            else:
                stored = await self._checkpoint(name, encoded)
        except BaseException:
            book.abandon(name)
            raise
        if stored is None:
            raise book.lose(name, ran=True)
        book.finish(name, stored)
        # What a resume would return: the same value whether the step ran now or before.
        return stored_step(stored, remember)

    async def _committed(self, name: str) -> bytes | None:
        """The step's result from its fenced row, when Redis has none (it forgot the key):
        checkpointed again and returned, so the step does not run. A row committed with no
        result recorded raises EffectCommittedError (its effect is done, its result lost).
        A row another request committed (the row keeps its fingerprint) raises KeyReuseError:
        this payload does not resume someone else's step, as Redis refuses it while it has
        the record's steps."""
        book, effects = self.book, self.store.effects
        assert effects is not None
        try:
            found = await effects.find(self.record, name)
            if found is not None and self._reused(found):
                detail = f"step {name!r} committed for another payload"
                if self.reporter is not None:
                    self.reporter.notify("mismatch", book.fence, detail)
                raise KeyReuseError(f"idempotency key reused with a different payload: {detail}")
            if found == COMMITTED_ONLY:
                raise EffectCommittedError(name)
            stored = await self._checkpoint(name, found) if found is not None else None
        except BaseException:
            book.abandon(name)
            raise
        if found is None:
            return None
        if stored is None:
            raise book.lose(name, ran=True)  # its effect committed
        book.finish(name, stored)
        return stored

    def _reused(self, found: bytes) -> bool:
        """Whether ``found`` (a step's row) was committed for another request than this call's
        claim. A row that keeps no fingerprint (written before rows kept it, or by an Effects
        of the user's own) cannot tell, and is resumed as before."""
        reused = getattr(found, "reused", None)
        request = self.call._fingerprint if self.call is not None else None  # the claim's
        return reused is not None and request is not None and bool(reused(request))

    async def _record(self, name: str, encoded: bytes) -> bytes | None:
        """Keep a finished step's result: in its fenced row when that committed without it,
        then as its checkpoint (what ``_checkpoint`` answers)."""
        call = self.call
        fence = call.unrecorded_fence(name) if call is not None else None
        if fence is None:
            return await self._checkpoint(name, encoded)
        # Row and checkpoint are one write that a cancel or Ctrl-C does not cut off: stopped
        # between them, the row says "committed, no result" and Redis has nothing, so every
        # executor (this block too, if it catches the cancel) gets EffectCommittedError for
        # a step whose result was known. Sent again whole: both writes are idempotent.
        return await self._keep(name, encoded, fence)

    async def _checkpoint(self, name: str, encoded: bytes) -> bytes | None:
        """Store a finished step's result (or remembered failure); None: the record is not
        ours any more. Unprotected (no claim), nothing is stored."""
        if self.owner is None:
            return encoded
        return await self._keep(name, encoded, None)

    async def _keep(self, name: str, encoded: bytes, fence: int | None) -> bytes | None:
        """:meth:`_write` step ``name``'s outcome ``encoded``: the step's work is done, so
        neither a cancelled caller nor an interrupted thread may keep it from Redis (a retry
        would run the step again, or find its row committed with no result)."""
        try:
            return await self._write(name, encoded, fence)
        except Cancelled:
            # The step's outcome is known: it is finished for this call too, so the guard's
            # ``cancelled`` entry lists it and a second call.step of the name (a block that
            # catches the cancel) returns it rather than running the step again. Sent again
            # whole (both writes are idempotent) and waited for, as the guard's completion is:
            # a task alone would be cancelled by ``asyncio.run`` (Ctrl-C) as the block ends.
            self.book.finish(name, encoded)
            await finish(self._write(name, encoded, fence), self.store.completion_retry)
            raise
        except _INTERRUPTED:
            # Ctrl-C in the thread, wherever it cut the write: sent again whole, here (both
            # writes are idempotent), then the interruption goes on; interrupted again, or
            # failing, it is left as it is (as a cancelled write that could not finish).
            with contextlib.suppress(Exception):
                if await self._write(name, encoded, fence) is not None:
                    self.book.finish(name, encoded)
            raise

    async def _write(self, name: str, encoded: bytes, fence: int | None) -> bytes | None:
        """Write step ``name``'s outcome into its fenced row (``fence``: the row committed
        without it; None: no such row), then checkpoint it."""
        effects, owner = self.store.effects, self.owner
        if fence is not None and effects is not None:
            try:
                await effects.record(self.record, name, fence, encoded)
            except StoreError as exc:  # Redis still gets it: only a later loss is exposed
                detail = f"step {name!r} result not recorded with its effect: {exc}"
                if self.reporter is not None:
                    self.reporter.notify("store_error", fence, detail)
                else:
                    logger.warning("idemkey: %s", detail)
        if owner is None:
            return encoded
        return await self.store.checkpoint(self.record, owner, step_field(name), encoded)

    async def _retried(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        retry: StepRetry,
        remember: FailureRules | None,
    ) -> Any:
        """Run attempts until one returns, the exception is not retried, or the attempts
        (counted in the record, across takeovers) are used up: then the last one raises."""
        cached = remember.types if remember is not None else ()
        owner, field, number = self.owner, attempt_field(name), 0
        while True:
            if owner is None:  # unprotected: nothing is stored, the count is this call's
                number += 1
            else:
                counted = await self.store.attempt(self.record, owner, field)
                if counted is None:
                    raise self.book.lose(name)
                number = counted
            if number > retry.attempts:  # earlier executors used them all up
                raise StepAttemptsExhaustedError(self.key, name, retry.attempts)
            try:
                return await self._attempt(name, fn, args, kwargs, retry.timeout)
            except Exception as exc:
                if number >= retry.attempts or not retry.retries(exc, cached):
                    raise
                delay = retry.delay(number)
                if self.deadline is not None and time.monotonic() + delay >= self.deadline[0]:
                    raise JobDeadlineError(self.key, self.deadline[1]) from exc
            await sleep(delay)

    async def _attempt(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float | None,
    ) -> Any:
        if self.deadline is None:
            return await run_attempt(name, fn, args, kwargs, timeout)
        try:
            return await run_attempt(name, fn, args, kwargs, self._time_left(timeout))
        except TimeoutError as exc:  # cut by the guard's deadline, not by its own timeout
            if time.monotonic() >= self.deadline[0]:
                raise JobDeadlineError(self.key, self.deadline[1]) from exc
            raise

    def _time_left(self, timeout: float | None) -> float | None:
        """An attempt's timeout: its own, cut to what is left of the guard's deadline; raises
        JobDeadlineError when nothing is."""
        deadline = self.deadline
        if deadline is None:
            return timeout
        left = deadline[0] - time.monotonic()
        if left <= 0:
            raise JobDeadlineError(self.key, deadline[1])
        return left if timeout is None else min(timeout, left)
