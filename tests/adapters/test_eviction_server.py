"""An evicted running request under uvicorn and FastAPI: reported, and never half stored.

The HTTP twin of tests/faults/test_eviction.py (see tests/faults/_eviction.py for how the real
eviction is made): the first request's record, its lease with it, is evicted while its handler
waits, the heartbeat reports it, a retry runs again and is stored, and the first client still
gets its answer while its completion is refused with the cause named.
"""

from __future__ import annotations

import json
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from idemkey.records import Record
from tests._servers import AppServer, RedisServer, wait_until
from tests.faults._eviction import evict_every_key_with_a_ttl, evicting_server

pytestmark = pytest.mark.redis

#: The servers run from the checkout, as the fixtures did before AppServer: ``idemkey`` is
#: importable there without PYTHONPATH.
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def evicting(redis_server_factory: Callable[..., RedisServer]) -> Iterator[redis.Redis]:
    client = evicting_server(redis_server_factory).client(socket_timeout=5)
    try:
        yield client
    finally:
        client.close()


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
    events, log_path = tmp_path / "events.jsonl", tmp_path / "uvicorn.log"
    kwargs = evicting.connection_pool.connection_kwargs
    env = {
        "IDEMKEY_TEST_REDIS_URL": f"redis://{kwargs['host']}:{kwargs['port']}/0",
        "IDEMKEY_TEST_PREFIX": prefix,
        "IDEMKEY_TEST_EVENTS": str(events),
    }

    def command(port: int) -> list[str]:
        return [
            sys.executable, "-m", "uvicorn", "idemkey_evict_app:app", "--app-dir", str(tmp_path),
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
        ]  # fmt: skip

    with AppServer(command, log=log_path, cwd=ROOT, env=env, name="uvicorn", timeout=20) as app:
        try:
            yield app.url, events, log_path
        finally:
            evicting.rpush(f"{prefix}:go", "go")  # never leave the first run blocked


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
        record = Record(digest=digest, record_key=key, lock_key=key + ":lock")
        assert evict_every_key_with_a_ttl(evicting, record) >= 1  # one key: the record

        [lost] = wait_until(
            lambda: read_events(events, "record_lost"), 10, "the heartbeat to report the record"
        )
        [claimed] = read_events(events, "claimed")  # the first run's claim
        assert (lost["record"], lost["fence"]) == (digest, claimed["fence"])
        assert "evicted" in lost["detail"]
        assert "maxmemory-policy noeviction" in lost["detail"]

        # The retry runs again (the promise is broken, and said so), and is stored.
        retry = httpx.post(f"{base}/charges", **send)
        assert (retry.status_code, retry.json()) == (201, {"charge": "ch_2"})
        assert "idempotent-replayed" not in retry.headers
        # Its fence is above the evicted run's: a fenced downstream refuses the first run now.
        [_, again] = read_events(events, "claimed")
        assert again["fence"] > claimed["fence"]
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
