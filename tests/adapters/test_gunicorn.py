"""The Flask extension under a real server: gunicorn, gthread workers (2 processes x 8
threads), real HTTP from 32 concurrent clients, the session's real Redis.

Each of 1 600 keys (32 clients x 50 keys) is sent 4 times, the copies racing on different
connections; the handler must run exactly once per key (counted with INCR in Redis, since the
workers are processes), every other answer being a replay of the same body or a 409.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis

from tests._servers import AppServer

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[2]
CLIENTS, KEYS_PER_CLIENT, COPIES = 32, 50, 4


@pytest.fixture
def gunicorn(redis_url: str, prefix: str, tmp_path: Path) -> Iterator[int]:
    """A gunicorn serving tests.adapters.gunicorn_app on a free port; yields the port."""

    def command(port: int) -> list[str]:
        return [
            sys.executable, "-m", "gunicorn", "--worker-class", "gthread", "--workers", "2",
            "--threads", "8", "--bind", f"127.0.0.1:{port}", "--log-level", "warning",
            "--keep-alive", "30", "tests.adapters.gunicorn_app:create_app()",
        ]  # fmt: skip

    log = tmp_path / "gunicorn.log"
    with AppServer(
        command, log=log, cwd=ROOT, redis_url=redis_url, prefix=prefix, name="gunicorn"
    ) as server:
        yield server.port


class Clients:
    """One keep-alive connection per thread; a dropped connection is retried with the same key
    (which is exactly what idempotency keys make safe)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.local = threading.local()
        self.all: list[http.client.HTTPConnection] = []
        self.lock = threading.Lock()

    def close(self) -> None:
        with self.lock:
            for conn in self.all:
                conn.close()

    def post(self, key: str, amount: int) -> tuple[int, dict[str, str], bytes]:
        body = json.dumps({"amount": amount}).encode()
        headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
        for attempt in range(3):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPConnection(
                    "127.0.0.1", self.port, timeout=30
                )
                with self.lock:
                    self.all.append(conn)
            try:
                conn.request("POST", "/charges", body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                return response.status, dict(response.getheaders()), data
            except (TimeoutError, http.client.HTTPException, ConnectionError):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def test_gunicorn_runs_each_key_exactly_once(gunicorn: int, redis_url: str, prefix: str) -> None:
    clients = Clients(gunicorn)
    try:
        check(clients, redis_url, prefix)
    finally:
        clients.close()


def check(clients: Clients, redis_url: str, prefix: str) -> None:
    keys = [f"c{c}-k{k}" for c in range(CLIENTS) for k in range(KEYS_PER_CLIENT)]
    # The copies of one key sit next to each other, so different threads send them at once.
    sends = [(key, n) for n, key in enumerate(keys) for _ in range(COPIES)]
    with ThreadPoolExecutor(CLIENTS) as pool:
        replies = list(pool.map(lambda send: clients.post(*send), sends))

    answers: dict[str, set[bytes]] = {key: set() for key in keys}
    for (key, _), (status, _, body) in zip(sends, replies, strict=True):
        if status == 201:
            answers[key].add(body)
        else:
            assert status == 409, (status, body)
            assert json.loads(body)["code"] == "in_flight"
    assert all(len(bodies) == 1 for bodies in answers.values())  # one answer per key

    counter = redis.Redis.from_url(redis_url)
    with contextlib.closing(counter):
        runs = counter.mget([f"{prefix}:runs:{key}" for key in keys])
    assert runs == [b"1"] * len(keys)  # the handler ran exactly once per key

    # Every key replays its one answer afterwards, from either worker.
    for key in keys[:: len(keys) // 40]:
        status, headers, body = clients.post(key, keys.index(key))
        assert status == 201
        assert headers.get("Idempotent-Replayed") == "true"
        assert {body} == answers[key]
