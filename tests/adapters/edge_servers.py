"""Real servers for the edge-case tests: gunicorn (gthread), werkzeug, waitress and granian's
WSGI interface; uvicorn, hypercorn, daphne and granian's ASGI interface, serving
``tests/adapters/edge_apps.py``, and a raw-socket client that can send what httpx will not
(short bodies, broken chunks, repeated field lines).
"""

from __future__ import annotations

import contextlib
import socket
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

import pytest
import redis

from tests._servers import AppServer

APPS = Path(__file__).with_name("edge_apps.py")

#: server -> app kinds it serves.
COMMANDS = {
    "gunicorn": lambda app, port: [
        sys.executable, "-m", "gunicorn", "--worker-class", "gthread", "--workers", "1",
        "--threads", "4", "--bind", f"127.0.0.1:{port}", "--log-level", "warning",
        f"idemkey_edge_apps:{app}_app()",
    ],
    "werkzeug": lambda app, port: [sys.executable, "-m", "idemkey_edge_apps", app,
                                   str(port)],
    "waitress": lambda app, port: [
        sys.executable, "-m", "waitress", "--host", "127.0.0.1", "--port", str(port),
        "--threads", "4", "--call", f"idemkey_edge_apps:{app}_app",
    ],
    # granian serves the WSGI app and the ASGI app alike: --interface picks the one to speak.
    "granian": lambda app, port: [
        sys.executable, "-m", "granian", "--interface", "asgi" if "asgi" in app else "wsgi",
        "--factory", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--log-level", "warning", f"idemkey_edge_apps:{app}_app",
    ],
    "uvicorn": lambda app, port: [
        sys.executable, "-m", "uvicorn", "--factory", f"idemkey_edge_apps:{app}_app",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
    ],
    "hypercorn": lambda app, port: [
        sys.executable, "-m", "hypercorn", f"idemkey_edge_apps:{app}_app()",
        "--bind", f"127.0.0.1:{port}", "--log-level", "warning",
    ],
    # daphne takes no factory: the module builds the app on first access of `asgi`.
    "daphne": lambda app, port: [
        sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "-v", "0",
        f"idemkey_edge_apps:{app}",
    ],
}  # fmt: skip

#: The WSGI servers and the ASGI servers the edge tests run the same requests through.
WSGI = ("gunicorn", "werkzeug", "waitress", "granian")
ASGI = ("uvicorn", "hypercorn", "daphne", "granian")
#: (server, app) test parameters: each WSGI server with the Flask extension and the WSGI
#: middleware, each ASGI server with the ASGI middleware.
WSGI_SERVED = [pytest.param((s, a), id=f"{s}-{a}") for s in WSGI for a in ("flask", "wsgi")]
ASGI_SERVED = [pytest.param((s, "asgi"), id=f"{s}-asgi") for s in ASGI]


@dataclass
class Raw:
    """A response read off the socket: status line, header lines in order, body."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for n, v in self.headers if n.lower() == name.lower()), None)


class Server:
    """One server process serving one edge app; ``close()`` stops it and purges its keys."""

    def __init__(
        self,
        server: str,
        app: str,
        redis_url: str,
        log: Path,
        prefix: str | None = None,
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        health: str = "/health",
    ) -> None:
        """``prefix``: the servers given one share their records (two deployments, one
        Redis); else a new one. ``args`` go after the server's command line, ``env`` into its
        environment; ``health`` is the path its readiness is asked at."""
        self.name = f"{server}-{app}"
        self.redis_url = redis_url
        self.prefix = prefix or "e" + uuid.uuid4().hex[:12]
        self.log = log
        # The app runs as a top-level module copied next to its log, with that directory as
        # cwd: idemkey then comes from PYTHONPATH (this worktree, or another checkout when
        # checking that a test fails there), never from a `tests` package that shadows it.
        (log.parent / "idemkey_edge_apps.py").write_text(APPS.read_text())
        self.process = AppServer(
            lambda port: [*COMMANDS[server](app, port), *args], log=log, cwd=log.parent,
            redis_url=redis_url, prefix=self.prefix, name=self.name, env=env, health=health,
        )  # fmt: skip
        self.port = self.process.port
        self.proc = self.process.proc

    def runs(self, key: str) -> int:
        """How many times the handler ran for ``key`` (counted in Redis by the app)."""
        client = redis.Redis.from_url(self.redis_url)
        with contextlib.closing(client):
            return int(client.get(f"{self.prefix}:runs:{key}") or 0)

    def send(self, data: bytes, *, close_write: bool = False, timeout: float = 15.0) -> Raw:
        """Send raw bytes, optionally half-close (the client stops sending), read the answer."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall(data)
            if close_write:
                sock.shutdown(socket.SHUT_WR)
            return read_response(sock)

    def post(self, path: str, body: bytes, headers: list[tuple[str, str]] | None = None) -> Raw:
        lines = [f"POST {path} HTTP/1.1", "Host: t", "Connection: close"]
        lines += [f"{n}: {v}" for n, v in headers or []]
        lines.append(f"Content-Length: {len(body)}")
        return self.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def close(self) -> None:
        self.process.close()


def read_response(sock: socket.socket) -> Raw:
    """Read one HTTP/1.1 response (Content-Length, chunked, or until close)."""
    stream = sock.makefile("rb")
    status_line = stream.readline().decode("latin-1").rstrip("\r\n")
    if not status_line:
        raise ValueError("the server closed the connection without an answer")
    _, code, *reason = status_line.split(" ", 2)
    headers: list[tuple[str, str]] = []
    while (line := stream.readline().decode("latin-1").rstrip("\r\n")) != "":
        name, _, value = line.partition(":")
        headers.append((name, value.strip()))
    found = {n.lower(): v for n, v in headers}
    status = int(code)
    if status in (204, 304) or 100 <= status < 200:
        body = b""
    elif "content-length" in found:
        body = stream.read(int(found["content-length"]))
    elif found.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while size := int(stream.readline().split(b";")[0], 16):
            parts.append(stream.read(size))
            stream.readline()
        body = b"".join(parts)
    else:
        body = stream.read()
    return Raw(status, reason[0] if reason else "", headers, body)


def started_on_demand(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, prefix: str | None = None
) -> Iterator[Callable[[str, str], Server]]:
    """``get(server, app)``, each started at its first use and all stopped at the end;
    ``prefix``: all on one shared prefix (else one each)."""
    running: dict[tuple[str, str], Server] = {}

    def get(server: str, app: str) -> Server:
        if (server, app) not in running:
            log = tmp_path_factory.mktemp("edge") / f"{server}-{app}.log"
            running[server, app] = Server(server, app, redis_url, log, prefix=prefix)
        return running[server, app]

    try:
        yield get
    finally:
        for server in running.values():
            server.close()


@pytest.fixture(scope="module")
def servers(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str, str], Server]]:
    """``servers(server, app)``: each started once per test module, stopped at its end."""
    yield from started_on_demand(redis_url, tmp_path_factory)
