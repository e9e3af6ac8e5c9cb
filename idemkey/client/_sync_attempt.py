"""One attempt held to what is left of the deadline, in a thread; twin of ``_async_attempt``.

A blocking read cannot be cancelled, and httpx's timeouts bound each read, not a response (a
server that sends a byte now and then never lets one time out). So the attempt runs in another
thread (an idle one, reused) while the caller waits at most ``seconds`` for it: past that, the
caller raises at once, and the attempt's socket is shut down so that the abandoned thread ends
with its read instead of with the server's answer. The socket is known once the connection is
made (httpcore's ``trace`` extension) or once the head arrived (a reused connection); an
abandoned attempt still waiting for the head on a reused connection ends at its own timeouts.
The thread runs in a copy of the caller's context (``contextvars``), for the httpx event hooks.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import queue
import socket
import threading
from collections.abc import Callable
from typing import Any

import httpx

from ._async_attempt import overdue

__all__ = ["drain", "exchange", "overdue"]


def exchange(
    start: Callable[[httpx.Request], httpx.Response], request: httpx.Request, seconds: float
) -> httpx.Response:
    """``start(request)`` (a response not read yet), read and closed, within ``seconds``."""
    attempt = _Attempt(start, request)
    request.extensions["trace"] = attempt.trace
    _submit(functools.partial(contextvars.copy_context().run, attempt.run))
    try:
        finished = attempt.done.wait(min(seconds, threading.TIMEOUT_MAX))
    except BaseException:  # KeyboardInterrupt while waiting: the attempt is abandoned too
        attempt.abandon()
        raise
    if not finished:
        attempt.abandon()
        raise overdue(request, seconds)
    return attempt.outcome()


class _Attempt:
    def __init__(self, start: Callable[[httpx.Request], httpx.Response], request: httpx.Request):
        self.start, self.request = start, request
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._streams: list[Any] = []
        self._abandoned = False
        self._response: httpx.Response | None = None
        self._error: BaseException | None = None

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if event.endswith((".connect_tcp.complete", ".start_tls.complete")):
            self._watch(info.get("return_value"))

    def run(self) -> None:
        try:
            response = self.start(self.request)
            self._watch(response.extensions.get("network_stream"))
            drain(response)
            self._response = response
        except BaseException as exc:  # handed to the caller, who raises it (or gave up)
            self._error = exc
        finally:
            self.done.set()

    def _watch(self, stream: Any) -> None:
        if stream is None:
            return
        with self._lock:
            self._streams.append(stream)
            abandoned = self._abandoned
        if abandoned:
            _shut(stream)

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            streams = list(self._streams)
        for stream in streams:
            _shut(stream)

    def outcome(self) -> httpx.Response:
        if self._error is not None:
            raise self._error
        assert self._response is not None
        return self._response


def drain(response: httpx.Response) -> None:
    """Read ``response`` to its end, and close it."""
    try:
        response.read()
    finally:
        response.close()


def _shut(stream: Any) -> None:
    """Wake the read blocked on ``stream``'s socket (it returns end-of-file) from this thread.

    ``socket.socket.shutdown`` even on a TLS socket: ``SSLSocket.shutdown`` would also drop the
    TLS object under the thread that is reading through it.
    """
    with contextlib.suppress(Exception):  # a stream without a socket, or one closed already
        sock = stream.get_extra_info("socket")
        if isinstance(sock, socket.socket):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


# ---- the threads attempts run in ----------------------------------------------------------
#
# Starting a thread per attempt doubled the cost of a call over loopback on a loaded 2-core
# box; an idle thread takes the next attempt instead, and ends after IDLE seconds without one.
# An abandoned attempt keeps its thread until its read ends; a new attempt never waits for it.

IDLE = 10.0

_lock = threading.Lock()
_jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_idle = 0  # threads waiting on _jobs that no submitted job has claimed yet


def _submit(job: Callable[[], None]) -> None:
    global _idle
    with _lock:
        claimed = _idle > 0
        if claimed:
            _idle -= 1
    if claimed:
        _jobs.put(job)
    else:
        threading.Thread(target=_work, args=(job,), name="idemkey-client", daemon=True).start()


def _work(job: Callable[[], None]) -> None:
    global _idle
    jobs = _jobs
    while True:
        job()
        with _lock:
            _idle += 1
        try:
            job = jobs.get(timeout=IDLE)
        except queue.Empty:
            with _lock:
                if _idle > 0:  # no job counts on this thread: it may end
                    _idle -= 1
                    return
            job = jobs.get()  # a job was submitted against this thread: it is on its way


def _forget_threads() -> None:
    # A forked child (a Celery prefork worker...) has none of its parent's threads.
    global _idle, _jobs, _lock
    _idle, _jobs, _lock = 0, queue.SimpleQueue(), threading.Lock()


os.register_at_fork(after_in_child=_forget_threads)
