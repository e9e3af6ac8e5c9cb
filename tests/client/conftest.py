"""Real servers for the client tests: each idemkey adapter on a real HTTP server.

``server`` is module-scoped and parametrized, so each server starts once per module:

* ``flask``: the Flask extension on werkzeug's threaded server, in this process;
* ``wsgi``: the WSGI middleware on gunicorn (gthread workers), a subprocess;
* ``asgi``: the ASGI middleware on uvicorn, a subprocess.

Every handler counts its executions in the session's real Redis (see ``_apps.py``).
"""

from __future__ import annotations

import contextlib
import http.client
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from werkzeug.serving import make_server

from tests._servers import AppServer, wait_until

from ._apps import flask_app

ROOT = Path(__file__).resolve().parents[2]
STARTUP = 30.0


@dataclass(frozen=True)
class Server:
    name: str
    port: int
    redis_url: str
    prefix: str

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url)


def _healthy(port: int) -> bool:
    with contextlib.closing(http.client.HTTPConnection("127.0.0.1", port, timeout=2)) as conn:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200


@contextlib.contextmanager
def _werkzeug(url: str, prefix: str) -> Iterator[int]:
    server = make_server("127.0.0.1", 0, flask_app(url, prefix), threaded=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        wait_until(lambda: _healthy(server.server_port), STARTUP, "werkzeug", ignore=(OSError,))
        yield server.server_port
    finally:
        server.shutdown()
        thread.join(5)
        server.server_close()


def _gunicorn(port: int) -> list[str]:
    return [
        sys.executable, "-m", "gunicorn", "--worker-class", "gthread", "--workers", "1",
        "--threads", "8", "--bind", f"127.0.0.1:{port}", "--log-level", "warning",
        "tests.client._apps:wsgi_app()",
    ]  # fmt: skip


def _uvicorn(port: int) -> list[str]:
    return [
        sys.executable, "-m", "uvicorn", "--factory", "tests.client._apps:asgi_app",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--lifespan", "off",
    ]  # fmt: skip


@contextlib.contextmanager
def serve(name: str, url: str, prefix: str, tmp: Path) -> Iterator[Server]:
    """``name`` (flask, wsgi or asgi) on a real server, until the block ends."""
    try:
        if name == "flask":
            with _werkzeug(url, prefix) as port:
                yield Server(name, port, url, prefix)
        else:
            with AppServer(
                _gunicorn if name == "wsgi" else _uvicorn, log=tmp / f"{name}.log", cwd=ROOT,
                redis_url=url, prefix=prefix, name=name, timeout=STARTUP,
            ) as server:  # fmt: skip
                yield Server(name, server.port, url, prefix)
    finally:
        client = redis.Redis.from_url(url)
        with contextlib.closing(client):
            keys = list(client.scan_iter(match=f"*{prefix}*", count=1000))
            if keys:
                client.unlink(*keys)


class Servers:
    """The three adapters' servers, started together and kept for the whole module."""

    def __init__(self, running: dict[str, Server]) -> None:
        self.running = running

    def get(self, name: str) -> Server:
        return self.running[name]


@pytest.fixture(scope="module")
def servers(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    tmp = tmp_path_factory.mktemp("servers")
    names = ("flask", "wsgi", "asgi")
    managers = {name: serve(name, redis_url, "t" + uuid.uuid4().hex[:12], tmp) for name in names}
    with contextlib.ExitStack() as stack:
        # Start them at once (each waits for its own health check); whichever started is
        # stopped at the end even if another failed.
        with ThreadPoolExecutor(len(names)) as pool:
            futures = {name: pool.submit(manager.__enter__) for name, manager in managers.items()}
            wait(futures.values())
        running = {}
        for name, future in futures.items():
            if future.exception() is None:
                stack.push(managers[name].__exit__)
                running[name] = future.result()
        for future in futures.values():
            future.result()  # raise the first startup failure, if any
        yield Servers(running)
