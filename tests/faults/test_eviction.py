"""An evicting server takes a running request's record: idemkey notices, and says why.

The promise cannot be kept (eviction destroys the record), so the failure must be loud. A real
``redis-server`` with ``maxmemory`` and ``maxmemory-policy volatile-lru``, as a shared cache
often runs, is filled with keys that have no TTL (a cache that never expires): under
``volatile-*`` only keys with a TTL can be evicted, so the keys eviction takes are exactly the
running request's record and lock. Then the filler is freed, as the cache's owner would, and a
duplicate arrives while the first owner still runs.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from idemkey import Event, LeaseLostError, Policy, RedisStore, guard
from idemkey.records import GUARD_METHOD, Record, record_for
from tests._servers import RedisServer, free_port, wait_until

pytestmark = pytest.mark.redis

LEASE = 0.6  # seconds: the heartbeat renews every 0.2 s
KEY, PAYLOAD = "charge-7", {"order": 7, "amount": 500}


@pytest.fixture
def evicting(redis_server_factory: Callable[..., RedisServer]) -> Iterator[redis.Redis]:
    server = redis_server_factory(["--maxmemory-policy", "volatile-lru"])
    client = server.client(socket_timeout=5)
    try:
        yield client
    finally:
        client.close()


def evict_every_key_with_a_ttl(admin: redis.Redis, record: Record) -> int:
    """Fill the server past ``maxmemory`` with keys that have no TTL until eviction has taken
    the record and its lock, then free the filler (as the cache's owner would, so that new
    claims are accepted again). Returns the number of keys evicted."""
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", used + 512 * 1024)
    chunk, fillers = b"x" * (64 * 1024), []

    def evicted() -> bool:
        name = f"cache:{len(fillers)}"
        try:
            admin.set(name, chunk)  # no TTL: never a candidate under volatile-lru
            fillers.append(name)
        except redis.exceptions.OutOfMemoryError:  # nothing with a TTL is left to evict
            pass
        return admin.exists(record.key, record.lock) == 0

    wait_until(evicted, timeout=10, message="eviction to take the record and its lock")
    admin.delete(*fillers)
    return int(admin.info("stats")["evicted_keys"])


def test_an_evicted_running_record_is_reported_and_its_owner_stores_nothing(
    evicting: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="idemkey")
    record = record_for(prefix, "", GUARD_METHOD, "", KEY)
    events: list[Event] = []
    store = RedisStore(evicting, Policy(prefix=prefix, lease=LEASE, on_event=events.append))
    rival = RedisStore(evicting, Policy(prefix=prefix))
    started, finish = threading.Event(), threading.Event()
    outcome: list[BaseException | Any] = []

    def first_owner() -> None:
        try:
            with guard(store, KEY, payload=PAYLOAD) as call:
                started.set()
                assert finish.wait(30), "the test never let the first owner finish"
                call.save({"charge": "ch_first"})
            outcome.append("completed")
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=first_owner)
    worker.start()
    try:
        assert started.wait(10), "the first owner never claimed"
        assert evict_every_key_with_a_ttl(evicting, record) >= 2

        # The duplicate cannot tell an evicted record from a new key: fence 1, no takeover.
        duplicate = guard(rival, KEY, payload=PAYLOAD)
        with duplicate as call:
            assert (call.replayed, call.fence, call.takeover) == (False, 1, False)
            assert duplicate.claim is not None
            rival_owner = duplicate.claim.owner.encode()

            # The first owner's heartbeat notices: an event and a WARNING that name the cause.
            lost = wait_until(
                lambda: [e for e in events if e.kind == "record_lost"],
                timeout=10,
                message="the heartbeat to report the lost record",
            )
            assert [(e.record, e.fence) for e in lost] == [(record.digest, 1)]
            assert "evicted" in lost[0].detail
            assert "maxmemory-policy noeviction" in lost[0].detail
            # ...and stops renewing: the lock is the duplicate's, never taken back or extended.
            assert evicting.get(record.lock) == rival_owner
            before = evicting.hgetall(record.key)

            # The first owner finishes: told its lease is lost, and nothing of it is stored.
            finish.set()
            worker.join(10)
            assert not worker.is_alive()
            [error] = outcome
            assert isinstance(error, LeaseLostError)
            assert error.fence == 1
            assert evicting.hgetall(record.key) == before  # no half record, no overwrite
            assert evicting.get(record.lock) == rival_owner
            call.save({"charge": "ch_second"})
    finally:
        finish.set()
        worker.join(10)
        store.close()
        rival.close()

    [lease_lost] = [e for e in events if e.kind == "lease_lost"]
    assert "evicted" in lease_lost.detail  # the cause, not "another executor took it over"
    assert "maxmemory-policy noeviction" in lease_lost.detail
    warnings = {
        getattr(r, "idemkey_event", None): r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
    }
    assert "evicted" in warnings["record_lost"]
    assert record.digest in warnings["record_lost"]  # no request: the record is named
    assert "maxmemory-policy noeviction" in warnings["lease_lost"]
    with guard(RedisStore(evicting, Policy(prefix=prefix)), KEY, payload=PAYLOAD) as again:
        assert again.replayed
        assert again.result == {"charge": "ch_second"}


APP = textwrap.dedent(
    '''
    """A payments endpoint behind idemkey's ASGI middleware (run by uvicorn); events go to a
    file, one JSON object a line."""
    import json
    import os

    import redis.asyncio
    from fastapi import FastAPI

    from idemkey import AsyncRedisStore, Event, Policy
    from idemkey.adapters.asgi import IdempotencyMiddleware

    prefix = os.environ["IDEMKEY_TEST_PREFIX"]
    client = redis.asyncio.Redis.from_url(os.environ["IDEMKEY_TEST_REDIS_URL"])


    def on_event(event: Event) -> None:
        line = {"kind": event.kind, "record": event.record, "fence": event.fence,
                "detail": event.detail}
        with open(os.environ["IDEMKEY_TEST_EVENTS"], "a") as events:
            events.write(json.dumps(line) + "\\n")


    policy = Policy(prefix=prefix, lease=0.6, on_event=on_event)
    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, store=AsyncRedisStore(client, policy))


    @app.get("/health")
    async def health() -> dict[str, bool]:
        return {"ok": True}


    @app.post("/charges", status_code=201)
    async def charge() -> dict[str, str]:
        run = await client.incr(f"{prefix}:runs")  # no TTL: never evicted under volatile-lru
        if run == 1:  # the first run waits on the payment provider until the test lets it go
            await client.blpop(f"{prefix}:go", timeout=30)
        return {"charge": f"ch_{run}"}
    '''
)


@pytest.fixture
def uvicorn_app(
    tmp_path: Path, evicting: redis.Redis, prefix: str
) -> Iterator[tuple[str, Path, Path]]:
    """uvicorn serving APP on the evicting server: (base URL, events file, server log)."""
    (tmp_path / "idemkey_evict_app.py").write_text(APP)
    events, log_path, port = tmp_path / "events.jsonl", tmp_path / "uvicorn.log", free_port()
    kwargs = evicting.connection_pool.connection_kwargs
    env = {
        **os.environ,
        "IDEMKEY_TEST_REDIS_URL": f"redis://{kwargs['host']}:{kwargs['port']}/0",
        "IDEMKEY_TEST_PREFIX": prefix,
        "IDEMKEY_TEST_EVENTS": str(events),
    }
    command = [sys.executable, "-m", "uvicorn", "idemkey_evict_app:app", "--app-dir"]
    command += [str(tmp_path), "--host", "127.0.0.1", "--port", str(port)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*command, "--log-level", "warning"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            assert proc.poll() is None, log_path.read_text()
            return httpx.get(f"{base}/health", timeout=1.0).status_code == 200

        wait_until(healthy, 20, "uvicorn to answer", ignore=(httpx.HTTPError,))
        yield base, events, log_path
    finally:
        evicting.rpush(f"{prefix}:go", "go")  # never leave the first run blocked
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def read_events(path: Path, kind: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [line for line in lines if line["kind"] == kind]


def test_an_evicted_http_request_is_reported_under_uvicorn(
    uvicorn_app: tuple[str, Path, Path], evicting: redis.Redis, prefix: str
) -> None:
    base, events, log = uvicorn_app
    send = {"json": {"order": 7}, "headers": {"Idempotency-Key": "order-7"}, "timeout": 30}
    first: list[httpx.Response] = []
    sender = threading.Thread(target=lambda: first.append(httpx.post(f"{base}/charges", **send)))
    sender.start()
    try:
        wait_until(lambda: evicting.get(f"{prefix}:runs") == b"1", 10, "the first run")
        [key] = [k.decode() for k in evicting.keys(f"{prefix}:{{*}}")]  # the request's record
        digest = key[len(prefix) + 2 : -1]
        record = Record(digest=digest, key=key, lock=key + ":lock")
        assert evict_every_key_with_a_ttl(evicting, record) >= 2

        [lost] = wait_until(
            lambda: read_events(events, "record_lost"), 10, "the heartbeat to report the record"
        )
        assert (lost["record"], lost["fence"]) == (digest, 1)
        assert "evicted" in lost["detail"]
        assert "maxmemory-policy noeviction" in lost["detail"]

        # The retry runs again (the promise is broken, and said so), and is stored.
        retry = httpx.post(f"{base}/charges", **send)
        assert (retry.status_code, retry.json()) == (201, {"charge": "ch_2"})
        assert "idempotent-replayed" not in retry.headers
    finally:
        evicting.rpush(f"{prefix}:go", "go")
        sender.join(30)
    # The first client still gets its real answer; its completion is refused, with the cause.
    [response] = first
    assert (response.status_code, response.json()) == (201, {"charge": "ch_1"})
    [lease_lost] = wait_until(
        lambda: read_events(events, "lease_lost"), 10, "the first completion to be refused"
    )
    assert "evicted" in lease_lost["detail"]
    replay = httpx.post(f"{base}/charges", **send)
    assert (replay.status_code, replay.json()) == (201, {"charge": "ch_2"})
    assert replay.headers["idempotent-replayed"] == "true"
    warnings = log.read_text()  # what an operator reads: the server's log
    assert f"idemkey record_lost on record {digest}: the record vanished" in warnings
    assert "set maxmemory-policy noeviction" in warnings
