"""A loopback HTTP/1.1 server that answers slowly on purpose, one byte at a time.

The client's ``deadline`` must bound the whole call, not each read: a server that trickles its
answer (a byte every ``interval`` seconds) never lets a read time out. ::

    with SlowServer("body", interval=0.1) as server:   # the head at once, then the body
        server.url                                      # http://127.0.0.1:<port>
        server.seen                                     # each request's headers (lower case)
        server.left                                     # when each client left, mid-answer

``mode`` is ``"body"`` (head at once, body trickled), ``"head"`` (the status line and headers
trickled too) or ``"fast"`` (the whole answer at once). Each connection gets one thread with
a short socket timeout and the stop flag: nothing outlives ``close()``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from types import TracebackType
from typing import Literal

__all__ = ["SlowServer"]

Mode = Literal["body", "head", "fast"]

_TICK = 0.05
_JOIN = 2.0


class SlowServer:
    def __init__(self, mode: Mode, *, interval: float = 0.1, size: int = 100) -> None:
        self.mode, self.interval, self.size = mode, interval, size
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(_TICK)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        #: The headers of each request that fully arrived (names in lower case).
        self.seen: list[dict[str, str]] = []
        #: time.monotonic() when a client went away before the whole answer was sent.
        self.left: list[float] = []
        self._acceptor = threading.Thread(target=self._accept, name="slow-server", daemon=True)
        self._acceptor.start()

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
                self._threads.append(thread)
            thread.start()

    def _read_request(self, conn: socket.socket) -> dict[str, str] | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self._recv(conn)
            if not chunk:
                return None
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        headers = {}
        for line in head.decode("latin-1").split("\r\n")[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        while len(body) < int(headers.get("content-length", "0")):
            chunk = self._recv(conn)
            if not chunk:
                return None
            body += chunk
        return headers

    def _recv(self, conn: socket.socket) -> bytes:
        while not self._stop.is_set():
            try:
                return conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return b""
        return b""

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.closing(conn):
            while (headers := self._read_request(conn)) is not None:
                with self._lock:
                    self.seen.append(headers)
                body = b"x" * self.size
                head = (
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body)
                )
                slow = {"fast": b"", "body": body, "head": head + body}[self.mode]
                try:
                    conn.sendall((head + body)[: len(head + body) - len(slow)])
                    for byte in range(len(slow)):
                        if self._stop.wait(self.interval):
                            return
                        conn.sendall(slow[byte : byte + 1])
                except OSError:  # the client went away mid-answer
                    with self._lock:
                        self.left.append(time.monotonic())
                    return

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._acceptor.join(_JOIN)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(_JOIN)

    def __enter__(self) -> SlowServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
