"""AsyncGuard and aguard(): run a block once per idempotency key (see ``idemkey.guard``).

One text for both guards: the async file is the source, and scripts/unasync.py writes the sync
one from it. Cancellation shielding comes from the hand-written runtime module imported below.
"""

# unasync: generates _sync_guard.py
from __future__ import annotations

import contextlib
from functools import partial
from time import perf_counter
from types import TracebackType
from typing import Any, ClassVar, TypeVar, overload

from .._core import new_owner
from ..errors import StoreError
from ..policy import Policy
from ..store import AsyncRedisStore
from ..store._async_store import CLOSE_DRAIN
from ..store._concurrency._async_runtime import Cancelled, finish, sleep
from ..store._concurrency._async_shield import settle_later
from ._async_steps import AsyncSteps
from ._call import Call
from ._state import GuardState

__all__ = ["AsyncGuard", "aguard"]

T = TypeVar("T")

#: How a block is cut off part way, rather than left: a cancel (asyncio; never raised in a
#: thread), Ctrl-C, an exit from a signal handler. What it did is unknown, as after a crash.
_INTERRUPTED: tuple[type[BaseException], ...] = (Cancelled, KeyboardInterrupt, SystemExit)


class AsyncGuard(GuardState[T]):
    """The context manager :func:`aguard` returns."""

    __slots__ = ()
    store_type: ClassVar[type[AsyncRedisStore]] = AsyncRedisStore
    function: ClassVar[str] = "aguard"
    store: AsyncRedisStore

    async def __aenter__(self) -> Call[T]:
        policy, started, owner = self.policy, perf_counter(), new_owner()
        try:
            decision = await self.store.claim(
                self.record,
                self.fingerprint,
                owner=owner,
                lease_ms=policy.lease_ms,
                ttl_ms=policy.ttl_ms,
                wait=policy.wait,
                origin=self.origin,
            )
        except StoreError as error:
            call = self.claim_failed(error)
        except BaseException as exc:
            # Redis may have applied the claim before a cancel or an interruption (Ctrl-C) cut
            # off its reply: free it, or every retry would get RequestInFlightError until the
            # lease lapsed. Not ours (never claimed): the release script changes nothing.
            await self._release(owner, exc)
            raise
        else:
            try:
                call = self.enter(decision, perf_counter() - started)
            except BaseException as exc:
                if self.call is not None:
                    # Claimed, then its on_event hook was interrupted (Ctrl-C in a slow export,
                    # a cancel, an exit): the heartbeat would hold the key for as long as the
                    # process lives. The block never ran: freed at once, as a claim whose reply
                    # was cut off. A takeover is given up as an interrupted block is instead:
                    # the earlier executor's work is unknown, and a release would let the
                    # retry run without call.takeover.
                    self.leave()
                    if self.claim is not None and self.claim.takeover:
                        await self._abandon(owner, exc)
                    else:
                        await self._release(owner, exc)
                raise
            if call.replayed:
                return call
        # A partial (C), not a lambda: no closure cells built per call.
        steps = (self.store, self.record, self.claim, self.key)
        call._make_steps = partial(AsyncSteps, *steps, self.job_deadline(), call, self)
        return call

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.call is None:
            return  # a replay: nothing was claimed, nothing is current, nothing to settle
        self.leave()
        claim, saved, started = self.claim, self.outcome(exc), perf_counter()
        if claim is None:
            return
        owner = claim.owner
        if saved is None and isinstance(exc, _INTERRUPTED):
            await self._abandon(owner, exc)
            return
        try:
            done = await self._settle(owner, saved)
        except StoreError as error:
            self.store_failed(error, exc, saved is not None)
            return
        except Cancelled:
            # The caller went away (a cancelled task) while this was on its way: finish the
            # write all the same, or a retry would run the work again after the lease. Safe:
            # both scripts answer the same when sent twice with one owner.
            await finish(self._settle(owner, saved), self.store.completion_retry)
            raise
        except (KeyboardInterrupt, SystemExit):
            # Ctrl-C in the thread, wherever it cut the writes (a fenced row left "committed,
            # no result" would refuse every retry): sent again whole, here, then it goes on;
            # interrupted again, or failing, they are left as they are.
            with contextlib.suppress(Exception):
                await self._settle(owner, saved)
            raise
        self.exited(done, saved is not None, exc, perf_counter() - started)

    async def _abandon(self, owner: str, interruption: BaseException) -> None:
        """The block was cut off part way (a cancel, Ctrl-C: one rule for both guards), or
        before it began by its takeover's hook: what it did is unknown, and a release would
        let a retry run it again at once. Keep the key until its lease lapses (renewed no
        more), then a retry takes it over, as after a crash; an operator is told."""
        self.store._unwatch(self.record, owner)
        self.cancelled()
        # Its entry is written in a task, which asyncio.run cancels when this ended its main
        # task (Ctrl-C): wait for it as a closing store does. A cancel asked before a Ctrl-C
        # (two under asyncio.run: the first cancels the main task, the second raised here)
        # lands on the first wait: wait once more; cancelled again, or interrupted, stop
        # waiting: the Ctrl-C goes on. Brought here by a cancel, a cancel now is a new one,
        # raised (a retried wait would swallow it).
        cancel = isinstance(interruption, Cancelled)
        for _ in range(1 if cancel else 2):
            try:
                await self.store._keeper.drain(CLOSE_DRAIN)
            except Cancelled:
                if cancel:
                    raise
                continue
            except (KeyboardInterrupt, SystemExit):
                pass
            return

    async def _release(self, owner: str, interruption: BaseException) -> None:
        """Free a claim whose reply was cut off, or whose hook was interrupted before the
        block ran: a retry runs the block at once, and no entry is kept."""
        if not isinstance(interruption, (Cancelled, GeneratorExit)):
            # A cancel asked before this Ctrl-C (two under asyncio.run: the first cancels the
            # main task, the second raised in the hook or the claim's wait) would land on the
            # release's wait, and asyncio.run would cancel the release before it went out:
            # taken here first (the Ctrl-C goes on). A closed coroutine cannot wait.
            with contextlib.suppress(Cancelled):
                await sleep(0)
        await settle_later(partial(self.store.release, self.record, owner))

    async def _settle(self, owner: str, saved: bytes | None) -> bool:
        """Complete the record with the saved result, or release it when nothing was saved."""
        if saved is None:
            return await self.store.release(self.record, owner)
        call, effects, policy = self.call, self.store.effects, self.policy
        if effects is not None and call is not None:
            fence = call.outdated_fence(saved)
            if fence is not None:  # its fenced row committed before this result was saved
                try:
                    await effects.record(self.record, None, fence, saved)
                except StoreError as exc:  # Redis still gets it: only a later loss is exposed
                    # An event, as the HTTP driver's: on_event hooks see it, not only logs.
                    self.notify("store_error", fence, f"result not recorded with its effect: {exc}")
        return await self.store.complete(
            self.record,
            owner,
            saved,
            ttl_ms=policy.ttl_ms,
            keep_origin=policy.keep_key_after_completion,
        )


# Overloads so that ``result_type=Receipt`` gives a ``Call[Receipt]`` and no result_type a
# ``Call[Any]``: with ``type[T] | Any`` alone, mypy cannot solve T and asks users to annotate.
@overload
def aguard(
    store: AsyncRedisStore,
    key: str,
    *,
    payload: object = ...,
    scope: str = ...,
    policy: Policy | None = ...,
    cache_exceptions: object = ...,
    deadline: float | None = ...,
    result_type: type[T],
) -> AsyncGuard[T]: ...
@overload
def aguard(
    store: AsyncRedisStore,
    key: str,
    *,
    payload: object = ...,
    scope: str = ...,
    policy: Policy | None = ...,
    cache_exceptions: object = ...,
    deadline: float | None = ...,
    result_type: Any = ...,
) -> AsyncGuard[Any]: ...
def aguard(
    store: AsyncRedisStore,
    key: str,
    *,
    payload: object = b"",
    scope: str = "",
    policy: Policy | None = None,
    result_type: type[T] | Any = Any,
    cache_exceptions: object = (),
    deadline: float | None = None,
) -> AsyncGuard[T]:
    """Run a block once per ``key`` (within ``scope``): ``async with aguard(store, key) as call``.

    ``payload`` identifies the work (bytes, str, or anything msgspec encodes): the same key
    with another payload raises :class:`KeyReuseError`. While the first call runs, others raise
    :class:`RequestInFlightError`, or wait up to ``policy.wait`` seconds for its result.
    ``result_type`` decodes a replayed result into that type (a Struct, a dataclass, ...).
    ``cache_exceptions`` names deterministic failures (classes, or a mapping of class to the
    field names to store): one raised out of the block completes the record as that failure,
    and every retry raises it again without running the block (docs/steps.md).
    ``deadline`` (seconds from the claim) bounds the whole job: no step attempt starts after
    it (:class:`JobDeadlineError`); ``step_deadline()`` tells a step what is left, and under
    aguard a coroutine step still running at it is cancelled.
    See :mod:`idemkey.guard`.
    """
    return AsyncGuard(
        store, key, payload, scope, policy, result_type, "", cache_exceptions, deadline
    )
