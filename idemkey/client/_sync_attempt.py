"""One attempt held to what is left of the deadline, in a thread; twin of ``_async_attempt``.

A blocking read cannot be cancelled, and httpx's timeouts bound each read, not a response (a
server that sends a byte now and then never lets one time out). So the attempt runs in another
thread (an idle one, reused) while the caller waits at most ``seconds`` for it: past that, or
on an interrupt (Ctrl-C), the caller raises at once and the attempt is abandoned. The attempt
watches itself through httpcore's ``trace`` extension (chained with the caller's own):

* an abandoned attempt raises where it would open a connection or write its request, so a
  request the caller gave up on (one waiting for a pooled connection, say) is never sent;
* on HTTP/1.1 the socket that carries the request is shut down, so that the abandoned thread
  ends with its read instead of with the server's answer. The socket is known once the
  connection is made, or once the head arrived (a reused connection: before that, the attempt
  ends at its own timeouts, which are clipped to the deadline), and forgotten once the response
  is closed (the connection goes back to the pool, another request's);
* an HTTP/2 connection's socket is never shut down: every stream on it would end. Nor may a
  read time out at the deadline: httpcore keeps the first read error of a connection for all
  its streams. So on HTTP/2 the attempt's read and write timeouts are the call's own, not
  clipped, and an abandoned stream ends with its answer or at those timeouts.

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
from collections.abc import Callable, Mapping
from typing import Any, Final

import httpx

from ._async_attempt import overdue
from ._operation import LONGEST

__all__ = ["drain", "exchange", "overdue"]

#: httpcore's trace events where an attempt would open a connection or start to write its
#: request: an abandoned one raises there instead.
_SENDING: Final = frozenset(
    {
        "connection.connect_tcp.started",
        "connection.connect_unix_socket.started",
        "http11.send_request_headers.started",
        "http2.send_request_headers.started",
    }
)

#: The events whose return value is a connection's new network stream.
_OPENED: Final = (
    "connection.connect_tcp.complete",
    "connection.connect_unix_socket.complete",
    "connection.start_tls.complete",
)


class _Abandoned(Exception):
    """Raised in an abandoned attempt's thread before it sends: no caller waits for it."""


def exchange(
    start: Callable[[httpx.Request], httpx.Response],
    request: httpx.Request,
    seconds: float,
    configured: Mapping[str, float | None],
) -> httpx.Response:
    """``start(request)`` (a response not read yet), read and closed, within ``seconds``;
    ``configured`` is the call's own timeouts (not clipped), for a stream on HTTP/2."""
    attempt = _Attempt(start, request, configured)
    request.extensions["trace"] = attempt.trace
    try:
        _submit(functools.partial(contextvars.copy_context().run, attempt.run))
        finished = attempt.done.wait(min(seconds, threading.TIMEOUT_MAX))
    except BaseException:  # KeyboardInterrupt while waiting: the attempt is abandoned too
        attempt.abandon()
        raise
    if not finished:
        attempt.abandon()
        raise overdue(request, seconds)
    return attempt.outcome()


class _Attempt:
    def __init__(
        self,
        start: Callable[[httpx.Request], httpx.Response],
        request: httpx.Request,
        configured: Mapping[str, float | None],
    ):
        self.start, self.request = start, request
        self.done = threading.Event()
        self._traced = request.extensions.get("trace")  # the caller's own, called after ours
        self._shared_timeout = {
            name: None if (value := configured.get(name)) is None else min(value, LONGEST)
            for name in ("read", "write")
        }
        self._lock = threading.Lock()
        self._opened: Any = None  # the stream of a connection this attempt made, if any
        self._held: Any = None  # the stream of the HTTP/1.1 connection the request is on
        self._abandoned = False
        self._response: httpx.Response | None = None
        self._error: BaseException | None = None

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if event in _SENDING and self._abandoned:
            raise _Abandoned(event)
        if event.endswith(_OPENED):
            self._opened = info.get("return_value")
        elif event.startswith("http2."):
            self._opened = None
            if (request := info.get("request")) is not None:
                timeout = request.extensions.get("timeout", {})
                request.extensions["timeout"] = {**timeout, **self._shared_timeout}
        elif event == "http11.send_request_headers.started":
            if info["request"].method != b"CONNECT":  # a proxy's tunnel is made first
                # Taken once: a redirect followed on a reused connection is not on this one.
                self._hold(self._opened)
                self._opened = None
        elif event == "http11.response_closed.started":
            self._hold(None)  # the connection goes back to the pool
        if self._traced is not None:
            self._traced(event, info)

    def run(self) -> None:
        try:
            response = self.start(self.request)
            if response.extensions.get("http_version") != b"HTTP/2":
                self._hold(response.extensions.get("network_stream"))
            drain(response)
            self._response = response
        except BaseException as exc:  # handed to the caller, who raises it (or gave up)
            self._error = exc
        finally:
            self.done.set()

    def _hold(self, stream: Any) -> None:
        with self._lock:
            self._held = stream
            abandoned = self._abandoned
        if abandoned and stream is not None:
            _shut(stream)

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            stream = self._held
        if stream is not None:
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
