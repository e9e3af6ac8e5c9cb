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
import time
from typing import Literal

from ._loopback import LoopbackServer

__all__ = ["SlowServer"]

Mode = Literal["body", "head", "fast"]


class SlowServer(LoopbackServer):
    def __init__(self, mode: Mode, *, interval: float = 0.1, size: int = 100) -> None:
        self.mode, self.interval, self.size = mode, interval, size
        #: The headers of each request that fully arrived (names in lower case).
        self.seen: list[dict[str, str]] = []
        #: time.monotonic() when a client went away before the whole answer was sent.
        self.left: list[float] = []
        super().__init__("slow-server")

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
