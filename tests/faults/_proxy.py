"""A small TCP proxy that a test controls, to put faults between a Redis client and its server.

::

    with FaultProxy(server.host, server.port) as proxy:
        client = redis.Redis(host=proxy.host, port=proxy.port, socket_timeout=0.5)
        proxy.delay_replies(1.5)      # the next reply from Redis arrives 1.5 s late
        proxy.blackhole()             # bytes go nowhere, in both directions; reads time out
        proxy.cut()                   # every open connection is closed now
        proxy.refuse()                # new connections are closed as soon as they open
        proxy.heal()                  # back to a plain pipe

Plain threads and blocking sockets with short timeouts: every loop checks a stop flag at least
every 50 ms, every delay waits on that flag, and :meth:`close` joins each thread with a
deadline. Nothing here can keep a test (or the interpreter) alive: threads are daemons.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field
from types import TracebackType

__all__ = ["FaultProxy"]

_TICK = 0.05  # how often a blocked thread looks at the stop flag, seconds
_JOIN = 2.0  # how long close() waits for each thread


@dataclass(eq=False)
class _Pair:
    client: socket.socket
    upstream: socket.socket
    threads: list[threading.Thread] = field(default_factory=list)
    closed: bool = False

    def close(self) -> None:
        self.closed = True
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class FaultProxy:
    """Forward 127.0.0.1:``port`` to ``upstream_host:upstream_port``, with faults on demand."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host = "127.0.0.1"
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((self.host, 0))
        self._listener.listen(64)
        self._listener.settimeout(_TICK)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pairs: list[_Pair] = []
        self._blackhole = False
        self._refuse = False
        self._delays: list[float] = []  # one entry per upcoming delayed reply chunk
        #: Connections accepted so far (a client that re-sends after a timeout reconnects).
        self.connections = 0
        #: Reply chunks held back by delay_replies so far.
        self.delayed = 0
        self._acceptor = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._acceptor.start()

    # ---- faults -------------------------------------------------------------------------------

    def delay_replies(self, seconds: float, count: int = 1) -> None:
        """Hold the next ``count`` chunks coming back from the server for ``seconds`` each.

        Requests still reach the server at once, so it applies them; only the answers are late.
        """
        with self._lock:
            self._delays.extend([seconds] * count)

    def blackhole(self) -> None:
        """Swallow every byte in both directions: the peer sees a silent, open connection."""
        self._blackhole = True

    def cut(self) -> None:
        """Close every open connection now (the client sees a reset or EOF)."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()

    def refuse(self) -> None:
        """Close new connections as soon as they are accepted (until :meth:`heal`)."""
        self._refuse = True

    def heal(self) -> None:
        """Forward again: no black hole, no refusal, no pending delays."""
        with self._lock:
            self._blackhole = False
            self._refuse = False
            self._delays.clear()

    # ---- plumbing -----------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            if self._refuse:
                with contextlib.suppress(OSError):
                    client.close()
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=2.0)
            except OSError:
                with contextlib.suppress(OSError):
                    client.close()
                continue
            client.settimeout(_TICK)
            upstream.settimeout(_TICK)
            pair = _Pair(client, upstream)
            with self._lock:
                self._pairs.append(pair)
            for source, sink, replies in ((client, upstream, False), (upstream, client, True)):
                thread = threading.Thread(
                    target=self._pump, args=(pair, source, sink, replies), daemon=True
                )
                pair.threads.append(thread)
                thread.start()

    def _pump(self, pair: _Pair, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        try:
            while not self._stop.is_set() and not pair.closed:
                try:
                    data = source.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                if self._blackhole:
                    continue
                if replies:
                    with self._lock:
                        delay = self._delays.pop(0) if self._delays else None
                    if delay is not None:
                        self.delayed += 1
                        if self._stop.wait(delay):
                            break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            pair.close()
            with self._lock:
                if pair in self._pairs:
                    self._pairs.remove(pair)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._acceptor.join(_JOIN)
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()
            for thread in pair.threads:
                thread.join(_JOIN)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<FaultProxy {self.host}:{self.port} -> {self.upstream[0]}:{self.upstream[1]}>"
