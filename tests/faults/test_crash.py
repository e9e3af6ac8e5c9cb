"""Crash recovery through the WSGI adapter, with real worker processes.

A worker (``tests/faults/_http_worker.py``) takes a keyed request and blocks in its handler.
SIGKILLed there, it frees the key once its lease lapses (its heartbeat died with it) and the
retry that takes over is told so (``takeover`` event, a higher fence). SIGSTOPped past its
lease (a GC pause, a frozen VM), it wakes up to find the record taken over: its own client
still gets its answer, but it cannot complete the record (``lease_lost``) and nothing it wrote
is kept.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
from werkzeug.test import Client

from idemkey import Event, Policy, RedisStore
from idemkey._core import Record, record_state
from idemkey.adapters.wsgi import IdempotencyMiddleware
from tests._lease import lease_left
from tests._servers import wait_until

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
LEASE = 0.5


@pytest.fixture
def spawn(redis_url: str, prefix: str) -> Iterator[Callable[[], subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []

    def start() -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faults._http_worker", redis_url, prefix, str(LEASE)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            proc.communicate(timeout=30)


def fence_app(environ: WSGIEnvironment, start_response: StartResponse) -> list[bytes]:
    fence = environ["idemkey.exchange"].claim.fence
    start_response("201 Created", [("Content-Type", "application/json")])
    return [json.dumps({"ran_with_fence": fence}).encode()]


def successor(real_client: redis.Redis, prefix: str, events: list[Event]) -> Client:
    """Another worker of the same service, in this process."""
    store = RedisStore(real_client, Policy(prefix=prefix, lease=LEASE, on_event=events.append))
    return Client(IdempotencyMiddleware(fence_app, store))


def post(web: Client) -> Any:
    return web.post("/charges", data=b"{}", headers={"Idempotency-Key": "crash-key"})


def record_key_of(real_client: redis.Redis, prefix: str) -> bytes:
    """The one record hash under ``prefix``."""
    keys = list(real_client.scan_iter(match=f"{prefix}:{{*}}", count=1000))
    assert len(keys) == 1
    return keys[0]


def record_of(real_client: redis.Redis, prefix: str) -> Record:
    """The one record under ``prefix``, named as the store names it."""
    key = record_key_of(real_client, prefix).decode()
    return Record(digest=key[len(prefix) + 2 : -1], record_key=key, lock_key=key + ":lock")


def test_a_worker_killed_mid_handler_frees_its_key_after_the_lease(
    spawn: Callable[[], subprocess.Popen[str]], real_client: redis.Redis, prefix: str
) -> None:
    worker = spawn()
    [started] = wait_until(
        lambda: real_client.lrange(f"{prefix}:started", 0, -1), 30, "the handler to run"
    )
    first = int(started)
    record = record_of(real_client, prefix)
    # While the worker lives, its heartbeat renews the lease (the time left jumps back up).
    samples: list[int] = []
    wait_until(
        lambda: samples.append(lease_left(real_client, record)) or samples[-1] > min(samples),
        10,
        "a heartbeat renewal",
    )
    events: list[Event] = []
    web = successor(real_client, prefix, events)
    assert post(web).status_code == 409

    worker.kill()  # SIGKILL in the middle of the handler: no release, no heartbeat
    worker.wait(10)

    reply = wait_until(
        lambda: (r := post(web)).status_code == 201 and r, LEASE + 10, "the takeover"
    )
    fence = reply.json["ran_with_fence"]
    assert fence > first
    takeovers = [e for e in events if e.kind == "takeover"]
    assert len(takeovers) == 1
    assert takeovers[0].fence == fence
    assert real_client.lrange(f"{prefix}:events", 0, -1) == [f"claimed:{first}".encode()]
    assert post(web).headers["Idempotent-Replayed"] == "true"


def test_a_stale_worker_that_wakes_up_cannot_complete_or_overwrite(
    spawn: Callable[[], subprocess.Popen[str]], real_client: redis.Redis, prefix: str
) -> None:
    worker = spawn()
    [started] = wait_until(
        lambda: real_client.lrange(f"{prefix}:started", 0, -1), 30, "the handler to run"
    )
    first = int(started)
    os.kill(worker.pid, signal.SIGSTOP)  # frozen inside its handler, heartbeat and all

    events: list[Event] = []
    web = successor(real_client, prefix, events)
    reply = wait_until(
        lambda: (r := post(web)).status_code == 201 and r, LEASE + 10, "the takeover"
    )
    fence = reply.json["ran_with_fence"]
    assert fence > first
    assert [e.kind for e in events][-2:] == ["takeover", "completed"]
    record_key = record_key_of(real_client, prefix)
    before = real_client.hgetall(record_key)
    assert record_state(before) == "complete"

    real_client.rpush(f"{prefix}:go", "go")
    os.kill(worker.pid, signal.SIGCONT)
    out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    # Its own client still gets the answer its handler produced...
    answer = json.loads(out)
    assert answer["status"] == 201
    assert json.loads(answer["body"]) == {"ran_with_fence": first}
    # ...but the record is not its to complete: lease_lost, and nothing was overwritten.
    worker_events = [e.decode() for e in real_client.lrange(f"{prefix}:events", 0, -1)]
    assert worker_events[0] == f"claimed:{first}"
    assert f"lease_lost:{first}" in worker_events
    assert f"completed:{first}" not in worker_events
    assert real_client.hgetall(record_key) == before
    replay = post(web)
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json == {"ran_with_fence": fence}
