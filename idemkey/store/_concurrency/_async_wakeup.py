"""Waiting for an in-flight claim to end, for asyncio; hand-written, twin of ``_sync_wakeup``.

Every task of one store that waits on one record shares one ``XREAD BLOCK`` on the record's
done stream (see complete.lua): 50 duplicates of a request cost one blocked connection, not 50
(redis-py's pool holds 100 by default and raises past that), and the read, not the waiters,
decides when they wake. Reads on distinct records are capped at ``limit``; past it a waiter is
told to poll instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Final

#: Seconds a waiter gives a read past its block before it leaves it: the server answers a timed
#: out XREAD on its own clock, a little late, and a read nobody waits for is cancelled (a
#: dropped connection), not left to end.
READ_GRACE: Final = 0.25

__all__ = ["READ_GRACE", "AsyncWakeups"]


class AsyncWakeups:
    """One blocking read per done stream, shared by its waiters.

    ``read(stream, block_ms)`` blocks until the stream has an entry (True) or ``block_ms``
    passes (False); None when the read failed (the waiter then polls).
    """

    def __init__(
        self, read: Callable[[str, int], Coroutine[Any, Any, bool | None]], limit: int
    ) -> None:
        self._read = read
        self._limit = limit
        self._reads: dict[str, asyncio.Task[bool | None]] = {}
        self._waiters: dict[str, int] = {}

    async def wait(self, stream: str, block_ms: int) -> bool | None:
        """Wait up to ``block_ms`` for ``stream`` to have an entry: True it has one, False the
        wait ended without one (claim again either way), None no read could be made (poll)."""
        read = self._reads.get(stream)
        loop = asyncio.get_running_loop()
        # A read of another event loop (a store used from several) cannot be awaited here.
        if read is None or read.done() or read.get_loop() is not loop:
            if len(self._reads) >= self._limit:
                return None
            read = loop.create_task(self._read(stream, block_ms))
            self._reads[stream] = read
            read.add_done_callback(lambda task: self._forget(stream, task))
        self._waiters[stream] = self._waiters.get(stream, 0) + 1
        try:
            await asyncio.wait((read,), timeout=block_ms / 1000 + READ_GRACE)
        finally:
            left = self._waiters.pop(stream) - 1
            if left:
                self._waiters[stream] = left
            elif not read.done():
                read.cancel()  # no one waits on it any more (its caller was cancelled, say)
        if not read.done() or read.cancelled():
            return False
        return read.result()

    def _forget(self, stream: str, task: asyncio.Task[bool | None]) -> None:
        if self._reads.get(stream) is task:
            del self._reads[stream]
