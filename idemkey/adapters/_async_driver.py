"""The driver: the store I/O around one :class:`~idemkey.http.Exchange`, for every adapter.

The blocking driver is generated from the asyncio one by unasync: edit the asyncio source and
regenerate, never the generated twin. An adapter moves bytes and calls, in order::

    exchange = idemkey.http.begin(policy, request)  # None or a Response: pass or send it
    exchange.announced(), exchange.received(body)   # a Response: send it, stop
    answer = await driver.claim(exchange)           # a Response: send it, stop
    run the app (if exchange.unprotected: as it is, then, in a finally,
                 exchange.unprotected_ended(): its fenceless call stops being current)
    exchange.started(status, headers)               # once the head went out
    await driver.finish(exchange, body)             # or: await driver.fail(exchange, reason)

Completion and release outlive a cancellation (sent again in a task of their own, which the
caller waits a moment for, as the guards do; the shield module does it for an interrupted
claim), and a store failure
after the app ran is reported as an event, never raised: the client already has its answer.
"""

# unasync: generates _sync_driver.py
from __future__ import annotations

import contextlib
from time import perf_counter
from typing import TYPE_CHECKING

from ..errors import EffectCommittedError, StoreError
from ..http import Complete
from ..http._transitions import State
from ..store._concurrency._async_runtime import Cancelled, finish, sleep
from ..store._concurrency._async_shield import settle_later

if TYPE_CHECKING:
    from ..http import Exchange, Release, Response
    from ..store import AsyncRedisStore

__all__ = ["AsyncDriver"]


class AsyncDriver:
    """Claims and settles records in ``store`` for the adapters; one per middleware (an
    :class:`AsyncEffectsDriver` for a store with ``effects=``)."""

    __slots__ = ("store",)

    def __new__(cls, store: AsyncRedisStore) -> AsyncDriver:
        # Chosen once here, not tested per request: a store without effects runs no more.
        made = AsyncEffectsDriver if cls is AsyncDriver and store.effects is not None else cls
        return object.__new__(made)

    def __init__(self, store: AsyncRedisStore) -> None:
        self.store = store

    async def claim(self, exchange: Exchange) -> Response | None:
        """Claim the record: None to run the app, or the Response to send instead (a replay,
        409, 422, 503). None with ``exchange.unprotected``: the store failed open."""
        fingerprint = exchange.claiming()
        exchange.keep = self.store.keep_uncertain
        policy = exchange.policy
        started = perf_counter()
        try:
            decision = await self.store.claim(
                exchange.record,
                fingerprint,
                owner=exchange.owner,
                lease_ms=policy.lease_ms,
                ttl_ms=policy.ttl_ms,
                wait=policy.wait,
                expired=policy.grace_ms > 0,
                origin=exchange.origin,
            )
        except StoreError as exc:
            return exchange.store_failed(exc)
        except EffectCommittedError:
            return exchange.response_lost()
        except BaseException as exc:
            # Cut off (cancelled, interrupted) after the claim may have reached Redis: free it.
            await self._release(exchange, exchange.interrupted(), exc)
            raise
        try:
            return exchange.decide(decision, perf_counter() - started)
        except BaseException as exc:
            if exchange.state is State.RUNNING:
                # Claimed, then its on_event hook was interrupted (Ctrl-C in a slow export, a
                # cancel, an exit), or the heartbeat would hold the key for as long as the
                # process lives: released as a claim cut off, or a takeover left to lapse.
                await self._hook_interrupted(exchange, exc)
            raise

    async def finish(self, exchange: Exchange, body: bytes | None) -> None:
        """The response is complete (``body`` None: not kept): store it or release the key."""
        plan = exchange.finish(body)
        try:
            await self._settle(exchange, plan)
        except Cancelled:
            # The caller went away (a cancelled task) while the write was on its way: send
            # it again in a task of its own (both scripts answer the same when sent twice),
            # and wait for it: asyncio.run, a server shutting down, cancels the tasks left.
            await finish(self._settle(exchange, plan), self.store.completion_retry)
            raise

    async def fail(self, exchange: Exchange, reason: str) -> None:
        """The app failed or stopped early: release, or complete without the body once the
        response had started (see :meth:`Exchange.fail`)."""
        plan = exchange.fail(reason)
        try:
            await self._settle(exchange, plan)
        except Cancelled:
            await finish(self._settle(exchange, plan), self.store.completion_retry)  # as in finish
            raise

    def abandon(self, exchange: Exchange) -> None:
        """The app was cancelled before its response started: keep the claim, unrenewed,
        until its lease lapses (see :meth:`Exchange.cancelled`)."""
        exchange.cancelled()
        self.store._unwatch(exchange.record, exchange.owner)

    async def _hook_interrupted(self, exchange: Exchange, interruption: BaseException) -> None:
        """See :meth:`Exchange.hook_interrupted`: release at once, or abandon a takeover."""
        plan = exchange.hook_interrupted()
        if plan is None:
            self.store._unwatch(exchange.record, exchange.owner)
            return
        await self._release(exchange, plan, interruption)

    async def _release(
        self, exchange: Exchange, plan: Release, interruption: BaseException
    ) -> None:
        """Send ``plan`` for a claim cut off or a hook interrupted, past a pending cancel."""
        if not isinstance(interruption, (Cancelled, GeneratorExit)):
            # A cancel asked before this Ctrl-C (two under asyncio.run: the second raised in
            # the claim's wait or the hook) would land on the release's wait, and asyncio.run
            # would cancel the release before it went out: taken here first (the Ctrl-C goes
            # on), as the guards do. A closed coroutine cannot wait.
            with contextlib.suppress(Cancelled):
                await sleep(0)
        await settle_later(lambda: self._settle(exchange, plan))

    async def _settle(self, exchange: Exchange, plan: Complete | Release) -> bool:
        """Send the plan's script; whether the store took it (False: failed, or not ours)."""
        started = perf_counter()
        try:
            if isinstance(plan, Complete):
                if self.store.effects is not None:  # else no row can hold the response
                    await self._record(exchange, plan.stored)
                policy = exchange.policy
                ok = await self.store.complete(
                    exchange.record,
                    exchange.owner,
                    plan.stored,
                    ttl_ms=policy.ttl_ms,
                    grace_ms=policy.grace_ms,
                    keep_origin=policy.keep_key_after_completion,
                )
            else:
                ok = await self.store.release(exchange.record, exchange.owner)
        except StoreError as exc:
            exchange.settle_failed(exc)
            return False
        # Refused: the record lost under the claim (evicted), or taken over?
        lost = not ok and self.store._record_lost(exchange.record, exchange.owner)
        exchange.settled(ok, perf_counter() - started, lost)
        return ok

    async def _record(self, exchange: Exchange, stored: bytes) -> None:
        """A handler whose fenced transaction committed: its response goes into that row
        before Redis hears of it, so a retry after Redis forgot replays it from there."""
        call, effects = exchange.call, self.store.effects
        fence = call.unrecorded_fence() if call is not None else None
        if fence is None or effects is None:
            return
        try:
            await effects.record(exchange.record, None, fence, stored)
        except StoreError as exc:  # Redis still gets it: only a later loss is exposed
            exchange.notify("store_error", fence, f"response not recorded with its effect: {exc}")


class AsyncEffectsDriver(AsyncDriver):
    """The driver of a store with ``effects=``: a claimed handler's call knows that store's
    Effects, whose table ``fenced()`` then writes without ``table=`` (the one the store's
    lookups read once Redis forgot the key), as a guard's call does."""

    __slots__ = ()

    async def claim(self, exchange: Exchange) -> Response | None:
        answer = await super().claim(exchange)
        call = exchange.call
        if answer is None and call is not None:  # claimed, or run unprotected (no fence)
            call._store_effects = self.store.effects
        return answer
