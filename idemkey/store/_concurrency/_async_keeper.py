"""Appending uncertain outcomes off the request's path, in tasks; twin of ``_sync_keeper``.

The request that caused an entry never waits for it: each entry is written by
``_async_append`` (the retry loop both keepers share) in a task of its own, at most
:data:`~idemkey.store.uncertain.MAX_PENDING` of them not yet written (a slow or down Redis:
entries past that are dropped, never queued without bound).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ...events import logger
from ..uncertain import MAX_PENDING
from ._async_append import append
from ._async_runtime import _detached

__all__ = ["AsyncKeeper"]


class AsyncKeeper:
    """Writes stream entries for one store, each in a task."""

    __slots__ = ("_tasks", "client")

    def __init__(self, client: Any) -> None:
        self.client = client
        # The entries not yet written, one task each; the event loop keeps only weak
        # references to tasks, so they are held here until done.
        self._tasks: set[asyncio.Task[None]] = set()

    def keep(self, stream: str, fields: dict[str, str], ttl_ms: int) -> None:
        """Append ``fields`` to ``stream`` soon; returns at once, never raises."""
        if len(self._tasks) >= MAX_PENDING:
            logger.debug("idemkey dropped an uncertain-outcome entry: %d pending", MAX_PENDING)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to write from (an async store used outside one)
            return
        task = loop.create_task(append(self.client, stream, fields, ttl_ms))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the entries being written, and for the writes a
        cancellation cut off (``detach``): a store closing, an aguard block cancelled. This
        event loop's only: a task of a loop that is gone never ends."""
        loop = asyncio.get_running_loop()
        tasks = [task for task in (*self._tasks, *_detached) if task.get_loop() is loop]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
