"""The heartbeat thread: one daemon thread per store renews every live claim of this process;
hand-written, twin of ``_async_heartbeat``.

The thread ends after ``heartbeat_idle_exit`` seconds without a claim, so an idle store can be
garbage-collected, and as soon as no claim is left to renew once ``close()`` was called; the
next claim starts another. A forked child starts afresh.

What the heartbeat reports (a lost record to the ``on_event`` hook, a failing renewal to the
logger) goes to a second daemon thread, the reporter, started on the first report and ended
after ``_IDLE_SECONDS`` without one: a hook stuck for seconds never delays a renewal. Before,
the heartbeat called the hook itself, and while it ran every other claim's lease lapsed.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Final

from ..._core import Record
from ...errors import StoreError
from ...policy import Policy
from .._base import _IDLE_SECONDS, StoreBase
from .._leases import Lease

__all__ = ["Heartbeat"]

# Reports not yet made, at most (a hook stuck for good): later ones are dropped.
_MAX_REPORTS: Final = 1024

# Every live store, to start afresh in a forked child (see Heartbeat._condition): done once at
# fork rather than with a getpid system call on every claim and completion.
_live: weakref.WeakSet[Heartbeat] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_live):
        store._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Heartbeat(StoreBase):
    """The heartbeat part of RedisStore: ``_watch``, ``_unwatch`` and ``close``."""

    awaits_client = False

    #: Seconds without a live claim after which the heartbeat thread ends (a new claim starts
    #: another), so an idle store can be garbage-collected.
    heartbeat_idle_exit: float = 30.0

    def __init__(self, client: object, policy: Policy | None) -> None:
        super().__init__(client, policy)
        # Claims take the lock itself (a C context manager); the heartbeat waits on the
        # condition built on it. Condition's own __enter__/__exit__ are Python calls.
        self._lock = threading.RLock()
        self._wakeup = threading.Condition(self._lock)
        self._heartbeat: threading.Thread | None = None
        # While the heartbeat thread waits: the monotonic time it wakes at by itself (inf when
        # it has no lease); 0.0 while it is not waiting, as it then rereads the table anyway.
        self._sleeping_until = 0.0
        self._pid = os.getpid()
        # close() was called while the thread ran: it ends as soon as no claim is left to
        # renew, and resets this (so it is only ever True while a thread runs).
        self._closing = False
        self._reports: queue.Queue[Callable[[], None]] = queue.Queue(_MAX_REPORTS)
        self._reporter: threading.Thread | None = None
        _live.add(self)

    def _renew(self, record: Record, owner: str, lease_ms: int, fence: int | None) -> int:
        raise NotImplementedError  # the store's

    def close(self) -> None:
        """Stop renewing every claim (an open guard's too: its lease then lapses while its
        block runs, so close a store after its work), and end the heartbeat thread. The store
        stays usable: a later claim starts a thread again, as after an idle exit (a worker
        that closes its store after each job). The Redis client stays open: it belongs to
        the caller."""
        with self._condition():
            self._leases.clear()
            if self._heartbeat is not None:
                self._closing = True
                self._wakeup.notify_all()

    def _condition(self) -> threading.Condition:
        """The heartbeat's condition, checked for a fork before anyone takes it.

        In a forked child the parent's claims and thread are not ours, and the parent's lock may
        be held forever by its heartbeat thread (caught mid-loop by the fork, and gone): start
        afresh with a new condition, or the child's first claim would hang. Claims and
        completions rely on the reset done at fork (``_after_fork_in_child``) instead.
        """
        if self._pid != os.getpid():
            self._forked()
        return self._wakeup

    def _forked(self) -> None:
        self._pid, self._heartbeat, self._closing = os.getpid(), None, False
        self._lock = threading.RLock()
        self._wakeup = threading.Condition(self._lock)
        self._leases.clear()
        self._records_lost.clear()
        self._sleeping_until = 0.0
        self._reports, self._reporter = queue.Queue(_MAX_REPORTS), None

    def _watch(self, record: Record, owner: str, lease_ms: int, fence: int) -> None:
        # No fork check: a forked child's stores were reset at fork (_after_fork_in_child).
        with self._lock:
            due = self._leases.add(record, owner, lease_ms, time.monotonic(), fence)
            if self._heartbeat is None:
                # Set only once started: a start that raises (RuntimeError "can't start new
                # thread", a pids limit) leaves None, so the next claim tries again.
                heartbeat = threading.Thread(
                    target=self._beat, name="idemkey-heartbeat", daemon=True
                )
                heartbeat.start()
                self._heartbeat = heartbeat
            # Wake the heartbeat only if this lease falls due before it wakes by itself. With
            # one lease length, a new claim is due after every live one; waking the thread on
            # each claim made it fight the request thread for the GIL (~9 us per guarded call).
            if due < self._sleeping_until:
                self._wakeup.notify()

    def _unwatch(self, record: Record, owner: str) -> Lease | None:
        with self._lock:
            return self._leases.remove(record, owner)

    def _beat(self) -> None:
        try:
            self._beat_until_idle()
        finally:
            # Ended by an exception too: the next claim starts a new thread (a normal end has
            # cleared it already, under the lock, and a new one may run by now).
            with self._lock:
                if self._heartbeat is threading.current_thread():
                    self._heartbeat, self._closing = None, False

    def _beat_until_idle(self) -> None:
        idle_since: float | None = None
        while True:
            with self._wakeup:
                due = self._leases.due(time.monotonic())
                while not due:
                    next_due = self._leases.next_due()
                    now = time.monotonic()
                    if next_due is not None:
                        idle_since = None
                    elif self._closing:
                        # close() was called: end now (the next claim starts a new thread,
                        # under this same lock).
                        self._heartbeat, self._closing = None, False
                        return
                    elif idle_since is None:
                        idle_since = now
                    elif now - idle_since >= self.heartbeat_idle_exit:
                        # Long idle: end, so the thread does not keep the store alive; the next
                        # claim starts a new one (under this same lock, so none is missed).
                        self._heartbeat = None
                        return
                    # Without a lease, still wake every _IDLE_SECONDS: a new claim then needs no
                    # notify unless it falls due sooner. Sleeping for ever made every claim wake
                    # the thread, which found the claim already completed and slept for ever
                    # again: a GIL ping-pong per request.
                    wake = now + _IDLE_SECONDS if next_due is None else next_due
                    self._sleeping_until = wake
                    self._wakeup.wait(max(0.0, wake - now))
                    self._sleeping_until = 0.0
                    due = self._leases.due(time.monotonic())
            for lease in due:
                reply: int | StoreError
                try:
                    reply = self._renew(lease.record, lease.owner, lease.lease_ms, lease.fence)
                except StoreError as exc:
                    reply = exc
                ours = None if isinstance(reply, StoreError) else reply == 1
                with self._wakeup:
                    failures = self._leases.failures(lease)
                    lost = self._leases.answered(lease, ours, time.monotonic())
                    news = self._renewal_news(lease, reply, failures, lost)
                if news is not None:
                    # No reporter thread (a pids limit): the next report starts one.
                    with contextlib.suppress(RuntimeError):
                        self._report_later(news)

    def _report_later(self, news: Callable[[], None]) -> None:
        """Have the reporter thread call ``news``; returns at once."""
        with self._lock:
            try:
                self._reports.put_nowait(news)
            except queue.Full:
                return
            # A reporter that found the queue empty and left cleared _reporter under this lock
            # first: it is replaced, so a report is never stranded.
            if self._reporter is None:
                # Set only once started: see _watch.
                reporter = threading.Thread(
                    target=self._report, name="idemkey-reporter", daemon=True
                )
                reporter.start()
                self._reporter = reporter

    def _report(self) -> None:
        """The reporter thread: calls each report in turn, ends when idle."""
        reports = self._reports
        while True:
            try:
                news = reports.get(timeout=_IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if reports.empty():
                        self._reporter = None
                        return
                continue
            try:
                news()  # emit() logs a hook that raises an Exception
            except BaseException:
                # Past that (a hook raising SystemExit): the next report starts a new reporter.
                with self._lock:
                    self._reporter = None
                raise
