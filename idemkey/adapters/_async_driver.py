"""The driver: the store I/O around one :class:`~._lifecycle.Lifecycle`, for every adapter.

The blocking driver is generated from the asyncio one by unasync: edit the asyncio source and
regenerate, never the generated twin. An adapter moves bytes and calls, in order::

    lifecycle = Lifecycle(exchange)                  # exchange = idemkey.http.begin(...)
    lifecycle.announced(), lifecycle.received(body)  # a Response: send it, stop
    answer = await driver.claim(lifecycle)           # a Response: send it, stop
    run the app (if lifecycle.unprotected: as it is, nothing more to do)
    lifecycle.started(status, headers)               # once the head went out
    await driver.finish(lifecycle, body)             # or: await driver.fail(lifecycle, reason)

Completion and release outlive a cancellation (sent again in a task of their own, as the guards
do; the shield module does it for an interrupted claim), and a store failure
after the app ran is reported as an event, never raised: the client already has its answer.
"""

# unasync: generates _sync_driver.py
from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING

from ..errors import StoreError
from ..http import Complete
from ..store._concurrency._async_runtime import Cancelled, detach
from ..store._concurrency._async_shield import settle_later

if TYPE_CHECKING:
    from ..http import Release, Response
    from ..store import AsyncRedisStore
    from ._lifecycle import Lifecycle

__all__ = ["AsyncDriver"]


class AsyncDriver:
    """Claims and settles records in ``store`` for the adapters; one per middleware."""

    __slots__ = ("store",)

    def __init__(self, store: AsyncRedisStore) -> None:
        self.store = store

    async def claim(self, lifecycle: Lifecycle) -> Response | None:
        """Claim the record: None to run the app, or the Response to send instead (a replay,
        409, 422, 503). None with ``lifecycle.unprotected``: the store failed open."""
        fingerprint = lifecycle.claiming()
        exchange = lifecycle.exchange
        policy = exchange.policy
        started = perf_counter()
        try:
            decision = await self.store.claim(
                exchange.record,
                fingerprint,
                owner=lifecycle.owner,
                lease_ms=policy.lease_ms,
                ttl_ms=policy.ttl_ms,
                wait=policy.wait,
            )
        except StoreError as exc:
            return lifecycle.store_failed(exc)
        except BaseException:
            # Cut off (cancelled, interrupted) after the claim may have reached Redis: free it.
            plan = lifecycle.interrupted()
            settle_later(lambda: self._settle(lifecycle, plan))
            raise
        return lifecycle.decide(decision, perf_counter() - started)

    async def finish(self, lifecycle: Lifecycle, body: bytes | None) -> None:
        """The response is complete (``body`` None: not kept): store it or release the key."""
        plan = lifecycle.finish(body)
        try:
            await self._settle(lifecycle, plan)
        except Cancelled:
            # The caller went away (a cancelled task) while the write was on its way: send
            # it again in a task of its own (both scripts answer the same when sent twice).
            detach(self._settle(lifecycle, plan))
            raise

    async def fail(self, lifecycle: Lifecycle, reason: str) -> None:
        """The app failed or stopped early: release, or complete without the body once the
        response had started (see :meth:`Lifecycle.fail`)."""
        plan = lifecycle.fail(reason)
        try:
            await self._settle(lifecycle, plan)
        except Cancelled:
            detach(self._settle(lifecycle, plan))  # as in finish
            raise

    async def _settle(self, lifecycle: Lifecycle, plan: Complete | Release) -> bool:
        """Send the plan's script; whether the store took it (False: failed, or not ours)."""
        exchange = lifecycle.exchange
        started = perf_counter()
        try:
            if isinstance(plan, Complete):
                ok = await self.store.complete(
                    exchange.record, lifecycle.owner, plan.stored, ttl_ms=exchange.policy.ttl_ms
                )
            else:
                ok = await self.store.release(exchange.record, lifecycle.owner)
        except StoreError as exc:
            lifecycle.settle_failed(exc)
            return False
        # Refused: the record lost under the claim (evicted), or taken over?
        lost = not ok and self.store._record_lost(exchange.record, lifecycle.owner)
        lifecycle.settled(ok, perf_counter() - started, lost)
        return ok
