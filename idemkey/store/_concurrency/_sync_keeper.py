"""Appending uncertain outcomes off the request's path, in one writer thread; twin of
``_async_keeper``.

The request that caused an entry never waits for it: entries go to a queue, which a daemon
thread of the store writes with ``_sync_append`` (the retry loop both keepers share), at most
:data:`~idemkey.store.uncertain.MAX_PENDING` of them not yet written, the one being written
included (a slow or down Redis: entries past that are dropped).
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
from ..uncertain import MAX_PENDING
from ._sync_append import append

__all__ = ["Keeper"]

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

    __slots__ = ("__weakref__", "_lock", "_pending", "_queue", "_thread", "client")

    def __init__(self, client: Any) -> None:
        self.client = client
        self._queue: queue.Queue[_Entry] = queue.Queue()
        # Entries kept and not yet written (queued, or the writer's own), under the lock.
        self._pending = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        _keepers.add(self)

    def _forked(self) -> None:
        """In a forked child, at fork: a lock, queue and writer of its own (the parent's
        entries are the parent's to write)."""
        self._lock = threading.Lock()
        self._queue = queue.Queue()
        self._pending = 0
        self._thread = None

    def keep(self, stream: str, fields: dict[str, str], ttl_ms: int) -> None:
        """Append ``fields`` to ``stream`` soon; returns at once, never raises."""
        with self._lock:
            full = self._pending >= MAX_PENDING
            if not full:
                self._pending += 1
                self._queue.put_nowait((stream, fields, ttl_ms))
                # A writer that found the queue empty and left cleared _thread under this lock
                # first: it is replaced, so an entry is never stranded.
                if self._thread is None:
                    # Set only once started: a start that raises (a pids limit) leaves None and
                    # the entry queued, for the next entry's writer.
                    thread = threading.Thread(
                        target=self._run, name="idemkey-uncertain", daemon=True
                    )
                    try:
                        thread.start()
                    except RuntimeError as exc:
                        logger.debug("idemkey could not start its uncertain writer: %s", exc)
                    else:
                        self._thread = thread
                        _running.add(self)
        if full:
            logger.debug("idemkey dropped an uncertain-outcome entry: %d pending", MAX_PENDING)

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
                append(self.client, *entry)
            finally:
                with self._lock:
                    self._pending -= 1
                self._queue.task_done()

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
