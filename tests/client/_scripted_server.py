"""A loopback HTTP/1.1 server whose answer to each request is a function's: a hostile server.

The idemkey servers in ``conftest.py`` answer as idemkey does; the client must also survive a
server that answers anything at all (a ``Retry-After`` of 5 000 digits, a problem body nested
100 000 deep, a redirect to another host). ::

    with ScriptedServer(lambda seen: answer(503, [("Retry-After", "9" * 400)])) as server:
        server.url                  # http://127.0.0.1:<port>
        server.seen                 # each request: method, target, headers (lower case), body

Each connection gets one thread with a short socket timeout and the stop flag: nothing
outlives ``close()``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType

__all__ = ["Seen", "ScriptedServer", "answer"]

_TICK = 0.05
_JOIN = 2.0


@dataclass(frozen=True, slots=True)
class Seen:
    """One request as it arrived."""

    method: str
    target: str
    headers: dict[str, str]  # lower-case names
    body: bytes


def answer(status: int, headers: Iterable[tuple[str, str]] = (), body: bytes = b"") -> bytes:
    """A whole HTTP/1.1 response, framed by a ``Content-Length``."""
    lines = [f"HTTP/1.1 {status} Scripted", *(f"{name}: {value}" for name, value in headers)]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class ScriptedServer:
    def __init__(self, respond: Callable[[Seen], bytes]) -> None:
        self.respond = respond
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(_TICK)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        #: Every request that fully arrived, in order.
        self.seen: list[Seen] = []
        self._acceptor = threading.Thread(target=self._accept, name="scripted-server", daemon=True)
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
        data = b""
        with contextlib.closing(conn):
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = self._recv(conn)
                    if not chunk:
                        return
                    data += chunk
                head, data = data.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0"))
                while len(data) < length:
                    chunk = self._recv(conn)
                    if not chunk:
                        return
                    data += chunk
                body, data = data[:length], data[length:]
                method, target, _ = lines[0].split(" ", 2)
                seen = Seen(method, target, headers, body)
                with self._lock:
                    self.seen.append(seen)
                try:
                    conn.sendall(self.respond(seen))
                except OSError:
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

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
