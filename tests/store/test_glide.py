"""AsyncRedisStore on a valkey-glide client (idemkey/store/_glide.py), on a real server.

The store contract itself runs on glide in test_scripts.py, test_guard.py and
test_tombstones.py (``GlideAsyncStore``); here is what is glide's own: scripts reloaded after
SCRIPT FLUSH, waiters that never block the one multiplexed connection, a dead server as
StoreError, what is refused at construction, and the status, uncertain and check reads that go
through the facade.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import redis
import redis.asyncio

from idemkey import AsyncRedisStore, Policy, RedisStore, aguard
from idemkey.errors import ConfigurationError, StoreError
from idemkey.events import Reporter
from idemkey.policy import Replicas
from idemkey.records import Claimed, InFlight, Replay, record_for
from tests._servers import RedisServer, async_wait_until
from tests.store._both import glide_client_for

glide = pytest.importorskip("glide", reason="valkey-glide is not installed (idemkey[glide])")


@pytest_asyncio.fixture
async def glide_client(redis_url: str) -> AsyncIterator[Any]:
    client = await glide_client_for(redis_url)
    try:
        yield client
    finally:
        await client.close()


@pytest_asyncio.fixture
async def store(glide_client: Any, prefix: str) -> AsyncIterator[AsyncRedisStore]:
    store = AsyncRedisStore(glide_client, Policy(prefix=prefix))
    try:
        yield store
    finally:
        await store.aclose()


def _record(prefix: str, key: str = "k") -> Any:
    return record_for(prefix, "tenant", "POST", "/charges", key)


async def test_scripts_are_sent_by_invoke_script_and_reloaded_after_script_flush(
    store: AsyncRedisStore, real_async_client: redis.asyncio.Redis, prefix: str
) -> None:
    first = await store.claim(_record(prefix, "a"), "fp", heartbeat=False)
    assert isinstance(first, Claimed)
    await real_async_client.script_flush()
    assert not any(await real_async_client.script_exists(store._scripts["claim"].sha))
    # The server has no script now: glide's core answers NOSCRIPT by loading it, once.
    second = await store.claim(_record(prefix, "b"), "fp", heartbeat=False)
    assert isinstance(second, Claimed)
    assert await store.complete(_record(prefix, "b"), second.owner, b"done")
    assert await store.claim(_record(prefix, "b"), "fp") == Replay(b"done")
    assert all(await real_async_client.script_exists(store._scripts["claim"].sha))


async def test_a_noscript_from_execute_command_is_the_stores_noscript_class(
    store: AsyncRedisStore,
) -> None:
    with pytest.raises(store._noscript):
        await store.client.execute_command("EVALSHA", "0" * 40, 0)


async def test_a_waiter_polls_and_never_blocks_the_multiplexed_connection(
    store: AsyncRedisStore, glide_client: Any, prefix: str
) -> None:
    record = _record(prefix, "waited")
    first = await store.claim(record, "fp", lease_ms=30_000, heartbeat=False)
    assert isinstance(first, Claimed)
    waiter = asyncio.ensure_future(store.claim(record, "fp", wait=4.0, heartbeat=False))
    await asyncio.sleep(0)  # let the waiter's first claim go out
    # An XREAD BLOCK on glide's one connection would hold this PING behind it for seconds.
    for _ in range(5):
        started = time.monotonic()
        assert await glide_client.custom_command(["PING"]) == b"PONG"
        assert time.monotonic() - started < 1.0
    assert not waiter.done()
    assert await store.complete(record, first.owner, b"result")
    answer = await asyncio.wait_for(waiter, 5.0)
    assert answer == Replay(b"result")


async def test_concurrent_aguards_on_one_key_run_the_body_once(
    store: AsyncRedisStore,
) -> None:
    runs = 0

    async def call(i: int) -> object:
        nonlocal runs
        waiting = store.policy.replace(wait=5.0)
        async with aguard(store, "charge:once", payload=b"p", policy=waiting) as call:
            if not call.replayed:
                runs += 1
                await asyncio.sleep(0.05)  # a body that takes a while: the others wait
                call.save({"charged": True})
        return call.result

    results = await asyncio.gather(*(call(i) for i in range(20)))
    assert runs == 1
    assert results == [{"charged": True}] * 20


async def test_records_record_uncertain_and_acheck_read_through_glide(
    store: AsyncRedisStore, prefix: str
) -> None:
    done, running = _record(prefix, "done"), _record(prefix, "running")
    claim = await store.claim(done, "fp", heartbeat=False)
    assert isinstance(claim, Claimed)
    assert await store.complete(done, claim.owner, b"r")
    held = await store.claim(running, "fp", heartbeat=False, origin="POST /charges tenant")
    assert isinstance(held, Claimed)

    states = {status.key: status.state async for status in store.records()}
    assert states == {done.key: "complete", running.key: "in_progress"}
    assert [s.key async for s in store.records(state="in_progress")] == [running.key]
    status = await store.record(running)
    assert status is not None
    assert status.state == "in_progress"
    assert status.lease_left is not None
    assert await store.record(_record(prefix, "none")) is None

    store.keep_uncertain("lease_lost", Reporter(None, running, "tenant", "POST", "/charges"), 1)

    async def kept() -> list[Any]:
        return await store.uncertain()

    entries = await async_wait_until(kept, timeout=5, message="the uncertain entry")
    assert [(e.kind, e.digest, e.fence) for e in entries] == [("lease_lost", running.digest, 1)]
    # The session server keeps nothing on disk: acheck() says so, through CONFIG GET.
    warnings = await store.acheck()
    assert any("neither RDB save points nor AOF" in w for w in warnings)


async def test_a_dead_server_is_a_store_error(redis_server_factory: Any, prefix: str) -> None:
    server: RedisServer = redis_server_factory()
    config = glide.GlideClientConfiguration(
        [glide.NodeAddress("127.0.0.1", server.port)], request_timeout=500
    )
    client = await glide.GlideClient.create(config)
    store = AsyncRedisStore(client, Policy(prefix=prefix))
    try:
        record = _record(prefix)
        assert isinstance(await store.claim(record, "fp", heartbeat=False), Claimed)
        server.stop()
        with pytest.raises(StoreError, match="Redis failed during claim"):
            await store.claim(_record(prefix, "other"), "fp", heartbeat=False)
        with pytest.raises(StoreError, match="Redis failed during records"):
            [s async for s in store.records()]
        assert await store.acheck() == []  # never raises: nothing could be read
    finally:
        await store.aclose()
        await client.close()


def test_a_glide_store_used_from_a_later_asyncio_run_is_refused_not_a_hang(
    redis_url: str, prefix: str
) -> None:
    """glide answers on the loop its client was made on: from the next ``asyncio.run`` the
    claim reached Redis and its reply never came back (past any request timeout). A
    ConfigurationError at once says to make the client in each loop."""
    made: dict[str, Any] = {}

    async def job(n: int) -> object:
        if not made:
            made["store"] = AsyncRedisStore(
                await glide_client_for(redis_url), Policy(prefix=prefix)
            )
        async with aguard(made["store"], f"job-{n}", payload=b"p") as call:
            if not call.replayed:
                call.save(n)
        return call.result

    async def first() -> object:
        try:
            return await job(0)
        finally:  # closed in its own loop (a loop that is gone cannot close it)
            await made["store"].client.glide.close()

    assert asyncio.run(asyncio.wait_for(first(), 10)) == 0

    async def twice() -> list[float]:
        took = []
        for n in (1, 2):  # a worker that catches the error and tries again in the same loop
            started = time.monotonic()
            with pytest.raises(ConfigurationError, match="the event loop it was made on"):
                await job(n)
            took.append(time.monotonic() - started)
        return took

    assert max(asyncio.run(asyncio.wait_for(twice(), 10))) < 0.5  # at once, every time


async def test_what_cannot_work_on_glide_is_refused_at_construction(glide_client: Any) -> None:
    with pytest.raises(ConfigurationError, match="WAIT blocks"):
        AsyncRedisStore(glide_client, Policy(durability=Replicas(1, timeout=0.1)))
    with pytest.raises(ConfigurationError, match="use AsyncRedisStore"):
        RedisStore(glide_client)


async def test_in_flight_answers_alike_on_glide_and_redis_py(
    store: AsyncRedisStore, real_async_client: redis.asyncio.Redis, prefix: str
) -> None:
    """The facade's replies are redis-py's: the same script answers decode the same."""
    record = _record(prefix, "both")
    other = AsyncRedisStore(real_async_client, Policy(prefix=prefix))
    try:
        first = await store.claim(record, "fp", heartbeat=False)
        assert isinstance(first, Claimed)
        on_glide = await store.claim(record, "fp", heartbeat=False)
        on_redis = await other.claim(record, "fp", heartbeat=False)
        assert isinstance(on_glide, InFlight)
        assert isinstance(on_redis, InFlight)
        assert abs(on_glide.lease_remaining - on_redis.lease_remaining) < 1.0
        step = await store.checkpoint(record, first.owner, "s:1", b"one")
        assert step == b"one"
        assert await other.checkpoint(record, first.owner, "s:1", b"two") == b"one"
    finally:
        await other.aclose()
