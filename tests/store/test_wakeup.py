"""Waiters learn that the claim in flight ended within milliseconds, at a bounded cost.

A duplicate that waits (``wait > 0``) marks the record; the completion or release posts to the
record's done stream, where the store's waiters share one ``XREAD BLOCK`` (see complete.lua).
Counts come from ``INFO commandstats`` of a private server, so only these tests' calls count;
wake-up latency is the time from the completion's return to each waiter's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.retry
import redis.backoff

from idemkey import AsyncRedisStore, Policy, RedisStore
from idemkey.records import Claimed, InFlight, Record, Replay, record_for
from idemkey.store._base import SCRIPTS, _block_ms
from tests._servers import WAKE_BOUND, RedisServer, async_wait_until, wait_until

WAITERS = 50
# The waiters are left blocked this long before the completion: polling (5 ms doubling to
# 250 ms) would have made ~7 claims each by then and slept up to 250 ms past the completion.
HELD = 0.5


def calls(client: redis.Redis) -> Counter[str]:
    stats = client.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})


def blocked(client: redis.Redis) -> int:
    return int(client.info("clients")["blocked_clients"])


def record(prefix: str, key: str = "k") -> Record:
    return record_for(prefix, "tenant", "POST", "/charges", key)


def load_scripts(client: redis.Redis) -> None:
    """Load every script first, so no NOSCRIPT round trip counts as a call."""
    for text in SCRIPTS.values():
        client.script_load(text)


@pytest.fixture
def admin(private_redis_server: RedisServer) -> redis.Redis:
    client = private_redis_server.client()
    load_scripts(client)
    return client


async def test_fifty_async_waiters_wake_at_the_completion(
    private_redis_server: RedisServer, admin: redis.Redis
) -> None:
    client = private_redis_server.async_client()
    store = AsyncRedisStore(client, Policy(prefix="w"))
    rec = record("w")
    try:
        first = await store.claim(rec, "fp")
        assert isinstance(first, Claimed)
        before = calls(admin)

        async def waiter() -> tuple[object, float]:
            decision = await store.claim(rec, "fp", wait=10)
            return decision, time.monotonic()

        waiters = [asyncio.create_task(waiter()) for _ in range(WAITERS)]
        await async_wait_until(
            lambda: calls(admin)["evalsha"] - before["evalsha"] == WAITERS and blocked(admin),
            timeout=10,
            message="every waiter in flight and the read blocked",
        )
        await asyncio.sleep(HELD)  # the request in flight takes a while
        assert await store.complete(rec, first.owner, b"charged")
        completed = time.monotonic()
        outcomes = await asyncio.gather(*waiters)
    finally:
        await store.aclose()
        await client.aclose()
    assert all(decision == Replay(b"charged") for decision, _ in outcomes)
    wakes = [woke - completed for _, woke in outcomes]
    assert max(wakes) < WAKE_BOUND, f"waiters returned {max(wakes) * 1000:.1f} ms after"
    spent = calls(admin) - before
    # Each waiter: an in-flight claim and the replay; one shared read; the owner's completion.
    assert spent["evalsha"] == 2 * WAITERS + 1
    assert spent["xread"] <= 2
    assert spent["evalsha"] + spent["xread"] <= 3 * WAITERS + 2


def test_fifty_threads_wake_at_the_completion(
    private_redis_server: RedisServer, admin: redis.Redis
) -> None:
    client = private_redis_server.client()
    store = RedisStore(client, Policy(prefix="w"))
    rec = record("w")
    try:
        first = store.claim(rec, "fp")
        assert isinstance(first, Claimed)
        before = calls(admin)

        def waiter(_: int) -> tuple[object, float]:
            decision = store.claim(rec, "fp", wait=10)
            return decision, time.monotonic()

        with ThreadPoolExecutor(WAITERS) as pool:
            waiters = [pool.submit(waiter, i) for i in range(WAITERS)]
            wait_until(
                lambda: calls(admin)["evalsha"] - before["evalsha"] == WAITERS and blocked(admin),
                timeout=10,
                message="every waiter in flight and the read blocked",
            )
            time.sleep(HELD)  # the request in flight takes a while
            assert store.complete(rec, first.owner, b"charged")
            completed = time.monotonic()
            outcomes = [future.result(timeout=10) for future in waiters]
    finally:
        store.close()
        client.close()
    assert all(decision == Replay(b"charged") for decision, _ in outcomes)
    wakes = [woke - completed for _, woke in outcomes]
    assert max(wakes) < WAKE_BOUND, f"waiters returned {max(wakes) * 1000:.1f} ms after"
    spent = calls(admin) - before
    assert spent["evalsha"] == 2 * WAITERS + 1
    assert spent["xread"] <= 2
    assert spent["evalsha"] + spent["xread"] <= 3 * WAITERS + 2


async def test_a_release_wakes_the_waiters_and_one_takes_the_claim(
    private_redis_server: RedisServer, admin: redis.Redis
) -> None:
    client = private_redis_server.async_client()
    store = AsyncRedisStore(client, Policy(prefix="w"))
    rec = record("w")
    try:
        first = await store.claim(rec, "fp")
        assert isinstance(first, Claimed)
        before = calls(admin)
        waiters = [asyncio.create_task(store.claim(rec, "fp", wait=10)) for _ in range(10)]
        await async_wait_until(
            lambda: calls(admin)["evalsha"] - before["evalsha"] == 10 and blocked(admin),
            timeout=10,
            message="every waiter in flight and the read blocked",
        )
        assert await store.release(rec, first.owner)
        released = time.monotonic()
        done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        assert time.monotonic() - released < WAKE_BOUND
        (taken,) = done
        second = taken.result()
        assert isinstance(second, Claimed)
        assert (second.fence > first.fence, second.takeover) == (True, False)
        # The others found the new claim in flight and wait for it in turn.
        await async_wait_until(
            lambda: blocked(admin), timeout=10, message="the others to block again"
        )
        assert not any(waiter.done() for waiter in pending)
        assert await store.complete(rec, second.owner, b"second")
        completed = time.monotonic()
        outcomes = await asyncio.gather(*pending)
        assert time.monotonic() - completed < WAKE_BOUND
    finally:
        await store.aclose()
        await client.aclose()
    assert outcomes == [Replay(b"second")] * 9


async def test_a_forced_forget_wakes_the_waiters_and_one_claims_afresh(
    private_redis_server: RedisServer, admin: redis.Redis
) -> None:
    # forget.lua deletes a live claim's record (force): its waiters must not sleep out their
    # wait on a stream nobody will post to.
    client = private_redis_server.async_client()
    store = AsyncRedisStore(client, Policy(prefix="w"))
    rec = record("w")
    try:
        first = await store.claim(rec, "fp")
        assert isinstance(first, Claimed)
        waiter = asyncio.create_task(store.claim(rec, "fp", wait=10))
        await async_wait_until(
            lambda: blocked(admin), timeout=10, message="the waiter's read blocked"
        )
        assert (await store.forget(rec, force=True)).forgotten
        forgotten = time.monotonic()
        second = await asyncio.wait_for(waiter, 10)
        assert time.monotonic() - forgotten < WAKE_BOUND
        assert isinstance(second, Claimed)
        assert (second.fence > first.fence, second.takeover) == (True, False)
        assert await store.complete(rec, second.owner, b"second")
    finally:
        await store.aclose()
        await client.aclose()


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_lease_that_lapses_without_an_end_is_taken_over(
    private_redis_server: RedisServer, admin: redis.Redis, kind: str
) -> None:
    lease = 0.3
    sync_client = private_redis_server.client()
    async_client = private_redis_server.async_client()
    store: Any = (
        RedisStore(sync_client, Policy(prefix="w", lease=lease))
        if kind == "sync"
        else AsyncRedisStore(async_client, Policy(prefix="w", lease=lease))
    )
    rec = record("w")
    try:
        claim = store.claim(rec, "fp", heartbeat=False)  # a crashed owner: no renewals
        first = claim if kind == "sync" else await claim
        assert isinstance(first, Claimed)
        before = calls(admin)
        started = time.monotonic()
        waiting = store.claim(rec, "fp", wait=10, heartbeat=False)
        second = waiting if kind == "sync" else await waiting
        took = time.monotonic() - started
    finally:
        if kind == "sync":
            store.close()
        else:
            await store.aclose()
        sync_client.close()
        await async_client.aclose()
    assert isinstance(second, Claimed)
    assert (second.fence > first.fence, second.takeover) == (True, True)
    assert took < lease + WAKE_BOUND  # woken when the lease lapsed, not at the 5 s cap
    spent = calls(admin) - before
    assert spent["evalsha"] <= 3  # in flight, (in flight again within the margin,) claimed
    assert spent["xread"] <= 2


async def test_a_cancelled_waiter_leaves_no_connection_or_read_behind(
    private_redis_server: RedisServer, admin: redis.Redis
) -> None:
    client = private_redis_server.async_client()
    store = AsyncRedisStore(client, Policy(prefix="w"))
    rec = record("w")
    try:
        first = await store.claim(rec, "fp")
        assert isinstance(first, Claimed)
        waiter = asyncio.create_task(store.claim(rec, "fp", wait=10))
        await async_wait_until(lambda: blocked(admin), timeout=10, message="the read to block")
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await async_wait_until(
            lambda: blocked(admin) == 0, timeout=10, message="the server to drop the read"
        )
        await async_wait_until(
            lambda: not client.connection_pool._in_use_connections,  # type: ignore[attr-defined]
            timeout=10,
            message="the pool to get its connection back",
        )
        # The store still works: a new waiter blocks and wakes.
        again = asyncio.create_task(store.claim(rec, "fp", wait=10))
        await async_wait_until(lambda: blocked(admin), timeout=10, message="a new read")
        assert await store.complete(rec, first.owner, b"ok")
        assert await asyncio.wait_for(again, 5) == Replay(b"ok")
    finally:
        await store.aclose()
        await client.aclose()


async def test_waiters_poll_when_the_server_refuses_blocking_reads(
    private_redis_server: RedisServer, admin: redis.Redis
) -> None:
    # A server or proxy without XREAD (renamed away here): waiting still works, by polling.
    client = private_redis_server.async_client()
    store = AsyncRedisStore(client, Policy(prefix="w"))
    real = client.execute_command

    async def no_xread(*args: Any, **kwargs: Any) -> Any:
        if args[0] == "XREAD":
            raise redis.ResponseError("unknown command 'XREAD'")
        return await real(*args, **kwargs)

    client.execute_command = no_xread  # type: ignore[method-assign]
    rec = record("w")
    try:
        first = await store.claim(rec, "fp")
        assert isinstance(first, Claimed)
        waiter = asyncio.create_task(store.claim(rec, "fp", wait=10))
        await async_wait_until(
            lambda: b"w" in admin.hgetall(rec.key), timeout=10, message="the waiter"
        )
        assert await store.complete(rec, first.owner, b"ok")
        assert await asyncio.wait_for(waiter, 5) == Replay(b"ok")
    finally:
        await store.aclose()
        await client.aclose()


def test_a_completion_without_waiters_writes_no_stream(
    private_redis_server: RedisServer, admin: redis.Redis
) -> None:
    client = private_redis_server.client()
    store = RedisStore(client, Policy(prefix="w"))
    rec = record("w")
    try:
        first = store.claim(rec, "fp")
        assert isinstance(first, Claimed)
        assert isinstance(store.claim(rec, "fp"), InFlight)  # wait=0: no mark
        assert store.complete(rec, first.owner, b"ok")
    finally:
        store.close()
        client.close()
    assert calls(admin)["xadd"] == 0
    assert admin.keys("*done*") == []
    assert b"w" not in admin.hgetall(rec.key)


def test_block_is_never_zero_which_would_block_forever() -> None:
    deadline = time.monotonic() + 10
    assert _block_ms(0.0, deadline, 5.0) == 2  # lease ended: the margin, in whole ms
    assert _block_ms(-1.0, deadline, 5.0) == 1
    assert _block_ms(30.0, deadline, 5.0) == 5000
    assert _block_ms(30.0, time.monotonic() - 1, 5.0) == 0  # out of wait: stop


def test_threads_share_one_read(private_redis_server: RedisServer, admin: redis.Redis) -> None:
    client = private_redis_server.client()
    store = RedisStore(client, Policy(prefix="w"))
    rec = record("w")
    ready = threading.Barrier(5)
    try:
        first = store.claim(rec, "fp")
        assert isinstance(first, Claimed)

        def waiter(_: int) -> object:
            ready.wait()
            return store.claim(rec, "fp", wait=10)

        with ThreadPoolExecutor(5) as pool:
            futures = [pool.submit(waiter, i) for i in range(5)]
            wait_until(lambda: blocked(admin), timeout=10, message="the read to block")
            assert blocked(admin) == 1
            assert store.complete(rec, first.owner, b"ok")
            assert [future.result(timeout=10) for future in futures] == [Replay(b"ok")] * 5
    finally:
        store.close()
        client.close()


async def test_reads_stay_within_the_socket_timeout(
    private_redis_server: RedisServer, admin: redis.Redis
) -> None:
    # socket_timeout 1 s, no retries: each read blocks 0.5 s at most, so none is cut off as
    # a failure (which would drop the waiter to polling) while the claim stays in flight over
    # two whole blocks, even though the server answers a timed-out block up to 100 ms late
    # (hz 10) and a loaded host adds its own delay. The completion comes as the third read
    # starts, so that read (not a timeout just before it) is the one that sees it.
    no_retry = redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0)
    client = private_redis_server.async_client(socket_timeout=1.0, retry=no_retry)
    store = AsyncRedisStore(client, Policy(prefix="w"))
    outcomes: list[bool | None] = []
    third_read = asyncio.Event()
    started = 0
    read = store._wakeups._read

    async def counted(stream: str, block_ms: int) -> bool | None:
        nonlocal started
        started += 1
        if started == 3:
            third_read.set()
        outcomes.append(await read(stream, block_ms))
        return outcomes[-1]

    store._wakeups._read = counted
    rec = record("w")
    try:
        first = await store.claim(rec, "fp")
        assert isinstance(first, Claimed)
        waiter = asyncio.create_task(store.claim(rec, "fp", wait=10))
        await asyncio.wait_for(third_read.wait(), 10)  # two whole blocks went by
        assert await store.complete(rec, first.owner, b"ok")
        assert await asyncio.wait_for(waiter, 5) == Replay(b"ok")
    finally:
        await store.aclose()
        await client.aclose()
    assert len(outcomes) == 3
    assert None not in outcomes  # no read failed
    assert outcomes[-1] is True  # the third read saw the completion


async def test_an_entry_left_in_the_stream_does_not_make_a_claim_loop(
    private_redis_server: RedisServer, admin: redis.Redis
) -> None:
    # An entry the claim could not drop (a node that refused the DEL mid-migration) wakes every
    # read at once; the waiter backs off as a poll would instead of claiming in a loop.
    client = private_redis_server.async_client()
    store = AsyncRedisStore(client, Policy(prefix="w"))
    rec = record("w")
    try:
        first = await store.claim(rec, "fp")
        assert isinstance(first, Claimed)
        admin.xadd(rec.key + ":done", {"end": "stale"})
        before = calls(admin)
        waiter = asyncio.create_task(store.claim(rec, "fp", wait=10))
        await asyncio.sleep(0.5)  # the request in flight takes a while
        assert await store.complete(rec, first.owner, b"ok")
        assert await asyncio.wait_for(waiter, 5) == Replay(b"ok")
    finally:
        await store.aclose()
        await client.aclose()
    spent = calls(admin) - before
    assert spent["evalsha"] <= 10  # polling's ~7 over 0.5 s, the completion, the replay
