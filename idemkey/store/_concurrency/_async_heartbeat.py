"""The asyncio heartbeat: one task per store renews every live claim; hand-written, twin of
``_sync_heartbeat``.

The task ends when no claim is left for a while (``_IDLE_SECONDS``), so no task outlives its
event loop's work; the next claim starts another (also on another event loop).

What it reports (a lost record to the ``on_event`` hook, a failing renewal to the logger) is
called soon on the event loop, never inside this task: a hook that raises past ``emit``'s
catch cannot end the renewals. A hook that blocks the loop stalls them all the same, as it
stalls every request: hooks on an asyncio store hand slow work to a task or a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from ..._core import Record
from ...errors import StoreError
from ...policy import Policy
from .._backend import is_glide
from .._base import _IDLE_SECONDS, StoreBase
from .._leases import Lease

__all__ = ["AsyncHeartbeat"]


class AsyncHeartbeat(StoreBase):
    """The heartbeat part of AsyncRedisStore: ``_watch``, ``_unwatch`` and ``aclose``."""

    awaits_client = True

    def __init__(self, client: object, policy: Policy | None) -> None:
        if is_glide(client):
            # Imported only here: glide is an optional extra (idemkey[glide]).
            from .._glide import facade_for

            client = facade_for(client, policy)
        super().__init__(client, policy)
        self._heartbeat: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        # While the heartbeat task waits: the monotonic time it wakes at by itself; else 0.0.
        self._sleeping_until = 0.0

    async def _renew(self, record: Record, owner: str, lease_ms: int, fence: int | None) -> int:
        raise NotImplementedError  # the store's

    async def aclose(self) -> None:
        """Stop renewing every claim (an open guard's too: its lease then lapses while its
        block runs, so close a store after its work), and stop the heartbeat task. The store
        stays usable: a later claim starts a task again, as on a new event loop. The Redis
        client stays open: it belongs to the caller."""
        self._leases.clear()
        task, self._heartbeat = self._heartbeat, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _watch(self, record: Record, owner: str, lease_ms: int, fence: int) -> None:
        due = self._leases.add(record, owner, lease_ms, time.monotonic(), fence)
        task = self._heartbeat
        if task is None or task.done() or task.get_loop() is not asyncio.get_running_loop():
            self._sleeping_until = 0.0
            self._wakeup = asyncio.Event()
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat(self._wakeup))
        elif self._wakeup is not None and due < self._sleeping_until:
            # Only when due before the task wakes by itself: waking it on every claim costs
            # a task switch per request.
            self._wakeup.set()

    def _unwatch(self, record: Record, owner: str) -> Lease | None:
        # One event loop thread: the table needs no lock.
        return self._leases.remove(record, owner)

    async def _beat(self, wakeup: asyncio.Event) -> None:
        while True:
            next_due = self._leases.next_due()
            now = time.monotonic()
            if next_due is None or next_due > now:
                wakeup.clear()
                timeout = _IDLE_SECONDS if next_due is None else next_due - now
                self._sleeping_until = now + timeout
                try:
                    await asyncio.wait_for(wakeup.wait(), timeout)
                except asyncio.TimeoutError:
                    if not self._leases:
                        return
                finally:
                    self._sleeping_until = 0.0
                continue
            due = self._leases.due(now)
            failures = [self._leases.failures(lease) for lease in due]
            replies = await asyncio.gather(*(self._renew_or_error(lease) for lease in due))
            loop = asyncio.get_running_loop()
            for lease, reply, failed in zip(due, replies, failures, strict=True):
                ours = None if isinstance(reply, StoreError) else reply == 1
                lost = self._leases.answered(lease, ours, time.monotonic())
                news = self._renewal_news(lease, reply, failed, lost)
                if news is not None:
                    loop.call_soon(news)

    async def _renew_or_error(self, lease: Lease) -> int | StoreError:
        """renew.lua's reply for ``lease`` (1, 0 or RECORD_LOST), or how Redis failed."""
        try:
            return await self._renew(lease.record, lease.owner, lease.lease_ms, lease.fence)
        except StoreError as exc:
            return exc
