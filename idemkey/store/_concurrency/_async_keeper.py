"""Appending uncertain outcomes off the request's path, in tasks; twin of ``_sync_keeper``.

The request that caused an entry never waits for it: the write runs in a task of its own, at
most :data:`MAX_PENDING` at once (a slow or down Redis: entries past that are dropped, never
queued without bound). A write that could not connect (nothing reached Redis, so sending it
again cannot make two entries) is tried again for up to :data:`RETRY_SECONDS`; any other
failure is logged at debug level and the entry forgotten.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

from ...events import logger
from .._backend import _never_connected
from ..uncertain import MAX_ENTRIES

__all__ = ["MAX_PENDING", "RETRY_SECONDS", "AsyncKeeper"]

#: Entries being written at once, at most; more are dropped.
MAX_PENDING: Final = 64
#: How long an entry whose connection could not be made is tried again (Redis restarting).
RETRY_SECONDS: Final = 10.0


class AsyncKeeper:
    """Writes stream entries for one store, each in a task."""

    __slots__ = ("_tasks", "client")

    def __init__(self, client: Any) -> None:
        self.client = client
        # The event loop keeps only weak references to tasks: held here until done.
        self._tasks: set[asyncio.Task[None]] = set()

    def keep(self, stream: str, fields: dict[str, str], ttl_ms: int) -> None:
        """Append ``fields`` to ``stream`` soon; returns at once, never raises."""
        if len(self._tasks) >= MAX_PENDING:
            logger.debug(
                "idemkey dropped an uncertain-outcome entry: %d writes pending", MAX_PENDING
            )
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to write from (an async store used outside one)
            return
        task = loop.create_task(self._write(stream, fields, ttl_ms))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, stream: str, fields: dict[str, str], ttl_ms: int) -> None:
        deadline, delay = time.monotonic() + RETRY_SECONDS, 0.05
        while True:
            try:
                pipe = self.client.pipeline(transaction=False)
                pipe.xadd(stream, fields, maxlen=MAX_ENTRIES, approximate=True)
                pipe.pexpire(stream, ttl_ms)
                await pipe.execute()
                return
            except Exception as exc:  # the request it describes went on, whatever happens here
                if not _never_connected(exc) or time.monotonic() + delay > deadline:
                    logger.debug("idemkey could not keep an uncertain outcome: %s", exc)
                    return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the entries being written (a store closing)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)
