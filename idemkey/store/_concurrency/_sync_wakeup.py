"""Waiting for an in-flight claim to end, for threads; hand-written, twin of ``_async_wakeup``.

Every thread of one store that waits on one record shares one ``XREAD BLOCK`` on the record's
done stream (see complete.lua): the first one reads, the others wait on its event. 50
duplicates of a request cost one blocked connection, not 50 (redis-py's pool holds 100 by
default and raises past that). Reads on distinct records are capped at ``limit``; past it a
waiter is told to poll instead.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Final

#: Seconds a waiter gives a read past its block before it leaves it: the server answers a timed
#: out XREAD on its own clock, a little late, and a read nobody waits for is cancelled (a
#: dropped connection), not left to end.
READ_GRACE: Final = 0.25

__all__ = ["READ_GRACE", "Wakeups"]


class _Read:
    __slots__ = ("done", "found")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.found: bool | None = False  # what the read answered (see Wakeups)


class Wakeups:
    """One blocking read per done stream, shared by its waiters.

    ``read(stream, block_ms)`` blocks until the stream has an entry (True) or ``block_ms``
    passes (False); None when the read failed (the waiter then polls).
    """

    def __init__(self, read: Callable[[str, int], bool | None], limit: int) -> None:
        self._read = read
        self._limit = limit
        self._reads: dict[str, _Read] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def wait(self, stream: str, block_ms: int) -> bool | None:
        """Wait up to ``block_ms`` for ``stream`` to have an entry: True it has one, False the
        wait ended without one (claim again either way), None no read could be made (poll)."""
        if self._pid != os.getpid():
            # A forked child: the parent's reads are not ours (their threads are gone, their
            # events never set), and the fork may have caught the lock held. Start afresh.
            self._pid, self._reads, self._lock = os.getpid(), {}, threading.Lock()
        with self._lock:
            shared = self._reads.get(stream)
            if shared is None:
                if len(self._reads) >= self._limit:
                    return None
                shared = self._reads[stream] = _Read()
                reader = True
            else:
                reader = False
        if not reader:
            if not shared.done.wait(block_ms / 1000 + READ_GRACE):
                return False
            return shared.found
        try:
            shared.found = self._read(stream, block_ms)
        finally:
            with self._lock:
                del self._reads[stream]
            shared.done.set()
        return shared.found
