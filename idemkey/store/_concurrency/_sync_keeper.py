"""Appending uncertain outcomes off the request's path, in one writer thread; twin of
``_async_keeper``.

The request that caused an entry never waits for it: entries go to a queue of at most
:data:`MAX_PENDING` (a slow or down Redis: entries past that are dropped), which a daemon
thread of the store writes. A write that could not connect (nothing reached Redis, so sending
it again cannot make two entries) is tried again for up to :data:`RETRY_SECONDS`; any other
failure is logged at debug level and the entry forgotten.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import time
import weakref
from typing import Any, Final

from ...events import logger
from .._backend import _never_connected
from ..uncertain import MAX_ENTRIES

__all__ = ["MAX_PENDING", "RETRY_SECONDS", "Keeper"]

#: Entries waiting to be written, at most; more are dropped.
MAX_PENDING: Final = 64
#: How long an entry whose connection could not be made is tried again (Redis restarting).
RETRY_SECONDS: Final = 10.0
#: A writer with nothing to write for this long ends (a store need not be closed for it).
IDLE_SECONDS: Final = 5.0

_Entry = tuple[str, dict[str, str], int]

# The keepers whose thread runs: at exit, each gets up to EXIT_DRAIN seconds to write what it
# holds (its thread is a daemon, which the interpreter would stop mid-queue).
_running: weakref.WeakSet[Keeper] = weakref.WeakSet()
EXIT_DRAIN: Final = 1.0


@atexit.register
def _drain_at_exit() -> None:
    for keeper in list(_running):
        keeper.drain(EXIT_DRAIN)


# Every keeper, to start afresh in a forked child: the writer thread does not exist there, and
# the lock (or the queue's own mutex) may have been held at fork time by a thread that does not
# exist either (a writer leaving, a request starting one), so nothing the child inherited may
# be taken. The heartbeat does the same (``_sync_heartbeat``).
_keepers: weakref.WeakSet[Keeper] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    _running.clear()  # the parent's writers: none runs here, nothing to drain at exit
    for keeper in list(_keepers):
        keeper._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Keeper:
    """Writes stream entries for one store, from a thread started on the first entry."""

    __slots__ = ("__weakref__", "_lock", "_queue", "_thread", "client")

    def __init__(self, client: Any) -> None:
        self.client = client
        self._queue: queue.Queue[_Entry] = queue.Queue(MAX_PENDING)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        _keepers.add(self)

    def _forked(self) -> None:
        """In a forked child, at fork: a lock, queue and writer of its own (the parent's
        entries are the parent's to write)."""
        self._lock = threading.Lock()
        self._queue = queue.Queue(MAX_PENDING)
        self._thread = None

    def keep(self, stream: str, fields: dict[str, str], ttl_ms: int) -> None:
        """Append ``fields`` to ``stream`` soon; returns at once, never raises."""
        try:
            self._queue.put_nowait((stream, fields, ttl_ms))
        except queue.Full:
            logger.debug("idemkey dropped an uncertain-outcome entry: %d pending", MAX_PENDING)
            return
        # After the put: a writer that found the queue empty and left is replaced (it clears
        # _thread under the lock before it leaves, so an entry is never stranded).
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="idemkey-uncertain", daemon=True
                )
                self._thread.start()
                _running.add(self)

    def _run(self) -> None:
        while True:
            try:
                entry = self._queue.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():  # idle: leave, a new entry starts a new writer
                        self._thread = None
                        return
                continue
            try:
                self._write(*entry)
            finally:
                self._queue.task_done()

    def _write(self, stream: str, fields: dict[str, str], ttl_ms: int) -> None:
        deadline, delay = time.monotonic() + RETRY_SECONDS, 0.05
        while True:
            try:
                pipe = self.client.pipeline(transaction=False)
                pipe.xadd(stream, fields, maxlen=MAX_ENTRIES, approximate=True)
                pipe.pexpire(stream, ttl_ms)
                pipe.execute()
                return
            except Exception as exc:  # the request it describes went on, whatever happens here
                if not _never_connected(exc) or time.monotonic() + delay > deadline:
                    logger.debug("idemkey could not keep an uncertain outcome: %s", exc)
                    return
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the entries being written (a store closing)."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        deadline = time.monotonic() + timeout
        done = self._queue.all_tasks_done
        with done:
            while self._queue.unfinished_tasks and (left := deadline - time.monotonic()) > 0:
                done.wait(left)
