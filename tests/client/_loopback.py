"""The plumbing of the client tests' own loopback servers: a listener on 127.0.0.1, a thread
per connection with a short socket timeout, and a stop flag, so nothing outlives ``close()``.

A server subclasses :class:`LoopbackServer`, sets its own fields, then calls
``super().__init__(name)`` (which starts accepting) and answers each connection in ``_serve``.
It listens on a port of its own, or on ``listener``: a socket bound beforehand, which refuses
connections until the server starts (a server that comes up between two attempts).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Any, TypeVar

__all__ = ["LoopbackServer"]

S = TypeVar("S", bound="LoopbackServer")

_TICK = 0.05
_JOIN = 2.0


class LoopbackServer:
    def __init__(self, name: str, listener: socket.socket | None = None) -> None:
        if listener is None:
            listener = socket.create_server(("127.0.0.1", 0))
        else:
            listener.listen()
        self._listener = listener
        self._listener.settimeout(_TICK)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        #: Open sockets, shut down at close() so no thread waits on one past it.
        self._sockets: set[socket.socket] = set()
        self._acceptor = threading.Thread(target=self._accept, name=name, daemon=True)
        self._acceptor.start()

    def _serve(self, conn: socket.socket) -> Any:
        raise NotImplementedError

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(_TICK)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            with self._lock:
                self._sockets.add(conn)
                self._threads.append(thread)
            thread.start()

    def _recv(self, conn: socket.socket) -> bytes:
        """What the peer sent next; b"" when it closed or the server is stopping."""
        while not self._stop.is_set():
            try:
                return conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return b""
        return b""

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._acceptor.join(_JOIN)
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(_JOIN)

    def __enter__(self: S) -> S:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
