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
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ._loopback import LoopbackServer

__all__ = ["Seen", "ScriptedServer", "answer"]


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


class ScriptedServer(LoopbackServer):
    def __init__(self, respond: Callable[[Seen], bytes]) -> None:
        self.respond = respond
        #: Every request that fully arrived, in order.
        self.seen: list[Seen] = []
        super().__init__("scripted-server")

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
