"""Leases on real Redis: the heartbeat keeps a slow claim, a dead claimer frees the key after
its lease, and a claimer that wakes up after losing its lease changes nothing.

Each check polls with a deadline; the only sleeps are the "work" of a slow body.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio

from idemkey import (
    AsyncRedisStore,
    Event,
    LeaseLostError,
    Policy,
    RedisStore,
    RequestInFlightError,
    aguard,
    guard,
)
from idemkey._core import OWNER_TAG_LENGTH
from idemkey.records import GUARD_METHOD, Record, record_for
from tests._lease import lease_holder, lease_left
from tests._servers import async_wait_until, wait_until

# Seconds each, not milliseconds: lease lengths and a body four leases long.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LEASE = 0.5
BODY_SECONDS = 2.0


def test_the_heartbeat_keeps_a_slow_claim(real_client: redis.Redis, prefix: str) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix, lease=LEASE))
    record = record_for(prefix, "", GUARD_METHOD, "", "slow")
    claimed, finished = threading.Event(), threading.Event()
    owners: set[bytes | None] = set()

    def slow_body() -> None:
        with guard(store, "slow") as call:
            claimed.set()
            time.sleep(BODY_SECONDS)  # the work: four leases long
            call.save("done")
        finished.set()

    body = threading.Thread(target=slow_body)
    body.start()
    try:
        assert claimed.wait(10), "the slow body never claimed"
        retry_afters: list[float] = []
        while not finished.wait(0.05):
            try:
                with guard(store, "slow") as duplicate:
                    # Only a replay may get in: the body completed between two checks.
                    assert duplicate.replayed, "a duplicate ran while the slow body held it"
                break
            except RequestInFlightError as exc:
                retry_afters.append(exc.retry_after)
            owners.add(lease_holder(real_client, record))  # type: ignore[arg-type]
        assert len(retry_afters) >= 10
        assert all(0 < retry_after <= LEASE for retry_after in retry_afters)
    finally:
        body.join(10)
        store.close()
    owners.discard(None)  # read just after completion
    assert len(owners) == 1  # one owner throughout: never lost, never taken over
    with guard(RedisStore(real_client, Policy(prefix=prefix)), "slow") as call:
        assert call.replayed
        assert call.result == "done"
    (owner,) = owners  # ...and it completed the record: the record keeps its 12-digit tag
    assert real_client.hget(record.key, "fp")[-OWNER_TAG_LENGTH:] == owner[:OWNER_TAG_LENGTH]


async def test_the_async_heartbeat_keeps_a_slow_claim(
    real_async_client: redis.asyncio.Redis, prefix: str
) -> None:
    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix, lease=LEASE))
    claimed = asyncio.Event()

    async def slow_body() -> None:
        async with aguard(store, "slow") as call:
            claimed.set()
            await asyncio.sleep(BODY_SECONDS)  # the work: four leases long
            call.save("done")

    body = asyncio.create_task(slow_body())
    record = record_for(prefix, "", GUARD_METHOD, "", "slow")
    try:
        await asyncio.wait_for(claimed.wait(), 10)
        owner = await lease_holder(real_async_client, record)  # type: ignore[misc]
        checks = 0
        while not body.done():
            try:
                async with aguard(store, "slow") as duplicate:
                    # Only a replay may get in: the body completed while this claim was sent.
                    assert duplicate.replayed, "a duplicate ran while the slow body held it"
                break
            except RequestInFlightError:
                checks += 1
            await asyncio.wait([body], timeout=0.05)
        await body
        assert checks >= 10
        async with aguard(store, "slow") as call:
            assert call.replayed
            assert call.result == "done"
    finally:
        await store.aclose()
    # The first owner completed it (never taken over): the record keeps its 12-digit tag.
    tag = (await real_async_client.hget(record.key, "fp"))[-OWNER_TAG_LENGTH:]
    assert tag == owner[:OWNER_TAG_LENGTH]


@pytest.fixture
def hold(redis_url: str, prefix: str) -> Iterator[subprocess.Popen[str]]:
    """A process that claims ``job`` with a 0.5 s lease and waits inside the guard."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.store._worker", "hold", redis_url, prefix, "job", str(LEASE)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.communicate()


def test_a_killed_claimer_frees_the_key_after_its_lease(
    hold: subprocess.Popen[str], real_client: redis.Redis, prefix: str
) -> None:
    first = int(
        wait_until(lambda: real_client.get(f"{prefix}:claimed"), timeout=30, message="the claim")
    )
    assert first > 0
    hold.kill()  # SIGKILL inside the guard: no release, no more heartbeat
    hold.wait()

    record = record_for(prefix, "", GUARD_METHOD, "", "job")
    assert real_client.hget(record.key, "state") == b"in_progress"  # never released

    events: list[Event] = []
    store = RedisStore(real_client, Policy(prefix=prefix, on_event=events.append))
    try:
        with guard(store, "job", policy=store.policy.replace(wait=10)) as call:
            assert call.takeover is True
            assert call.fence > first
            call.save("from the second owner")
    finally:
        store.close()
    assert [e.kind for e in events] == ["takeover", "completed"]


def test_a_stale_claimer_that_wakes_up_changes_nothing(
    hold: subprocess.Popen[str], real_client: redis.Redis, prefix: str
) -> None:
    first = int(
        wait_until(lambda: real_client.get(f"{prefix}:claimed"), timeout=30, message="the claim")
    )
    os.kill(hold.pid, signal.SIGSTOP)  # a GC pause or a frozen VM: its heartbeat stops too
    store = RedisStore(real_client, Policy(prefix=prefix, wait=10))
    try:
        with guard(store, "job") as call:
            assert call.takeover is True
            assert call.fence > first
            call.save("from the second owner")
    finally:
        store.close()
    record = record_for(prefix, "", GUARD_METHOD, "", "job")
    before = real_client.hgetall(record.key)

    real_client.rpush(f"{prefix}:finish", "go")
    os.kill(hold.pid, signal.SIGCONT)
    out, err = hold.communicate(timeout=30)
    assert hold.returncode == 0, err
    assert json.loads(out) == {"outcome": "lease_lost", "fence": first}
    assert real_client.hgetall(record.key) == before
    assert lease_left(real_client, record) == -2  # the stale owner left no lease behind
    with guard(RedisStore(real_client, Policy(prefix=prefix)), "job") as again:
        assert again.result == "from the second owner"


def test_a_body_longer_than_the_retention_still_completes_once(
    real_client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix, ttl=1.0, lease=0.3))
    record = record_for(prefix, "", GUARD_METHOD, "", "long")
    try:
        with guard(store, "long") as call:
            time.sleep(1.5)  # the work: longer than the whole retention window
            assert real_client.hget(record.key, "owner") is not None  # still our record
            call.save("done")
        with guard(store, "long") as again:
            assert again.replayed
            assert again.result == "done"
    finally:
        store.close()


def test_a_short_lease_claimed_while_the_heartbeat_sleeps_on_a_long_one_is_renewed(
    real_client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix))
    short = store.policy.replace(lease=LEASE)
    try:
        with guard(store, "long-lease"):
            # The heartbeat now sleeps ~10 s, until the long lease is due.
            wait_until(lambda: store._sleeping_until > 0, message="the heartbeat to sleep")
            with guard(store, "short-lease", policy=short) as call:
                end = time.monotonic() + 3 * LEASE
                while time.monotonic() < end:  # the work, in steps, three short leases long
                    time.sleep(0.05)
                    with pytest.raises(RequestInFlightError), guard(store, "short-lease"):
                        pytest.fail("the short lease lapsed: a duplicate got in")
                call.save("done")
    finally:
        store.close()


async def test_a_short_lease_claimed_while_the_async_heartbeat_sleeps_is_renewed(
    real_async_client: redis.asyncio.Redis, prefix: str
) -> None:
    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix))
    short = store.policy.replace(lease=LEASE)
    try:
        async with aguard(store, "long-lease"):
            await async_wait_until(
                lambda: store._sleeping_until > 0, message="the heartbeat to sleep"
            )
            async with aguard(store, "short-lease", policy=short) as call:
                end = time.monotonic() + 3 * LEASE
                while time.monotonic() < end:  # the work, in steps, three short leases long
                    await asyncio.sleep(0.05)
                    with pytest.raises(RequestInFlightError):
                        async with aguard(store, "short-lease"):
                            pytest.fail("the short lease lapsed: a duplicate got in")
                call.save("done")
    finally:
        await store.aclose()


def test_an_idle_heartbeat_thread_ends_and_a_new_claim_starts_another(
    real_client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix, lease=LEASE))
    rival = RedisStore(real_client, Policy(prefix=prefix))
    store.heartbeat_idle_exit = 0.2
    try:
        with guard(store, "first") as call:
            call.save(1)
        first = store._heartbeat
        assert first is not None
        wait_until(lambda: not first.is_alive(), 10, "the idle heartbeat thread to end")
        assert store._heartbeat is None
        # A new slow claim gets a new heartbeat that keeps its lease.
        with guard(store, "second") as call:
            assert store._heartbeat is not None
            assert store._heartbeat.is_alive()
            deadline = time.monotonic() + LEASE * 3
            while time.monotonic() < deadline:  # three leases long: renewed, never lost
                with pytest.raises(RequestInFlightError), guard(rival, "second"):
                    pytest.fail("a duplicate ran while the claim was being renewed")
                time.sleep(0.05)  # pacing the checks, not waiting for anything
            call.save(2)
    finally:
        store.close()
        rival.close()


# ---- close() / aclose(): a closed store is reused, an open guard keeps its lease -----------


def lease_deadline(client: redis.Redis, record: Record) -> int:
    """The claim's lease deadline (Unix ms, server clock): it moves on with each renewal."""
    return int(client.hget(record.key, "lease") or 0)


async def alease_deadline(client: redis.asyncio.Redis, record: Record) -> int:
    return int(await client.hget(record.key, "lease") or 0)


def test_a_claim_on_a_closed_store_is_renewed(real_client: redis.Redis, prefix: str) -> None:
    """A worker that closes its store after each job and reuses it (as AsyncRedisStore is
    after aclose()). Before, the closed sync store still claimed but never renewed: a job
    longer than the lease was taken over while it ran."""
    store = RedisStore(real_client, Policy(prefix=prefix, lease=LEASE))
    record = record_for(prefix, "", GUARD_METHOD, "", "job-2")
    try:
        with guard(store, "job-1") as call:
            call.save(1)
        first = store._heartbeat
        assert first is not None
        store.close()  # the end of job 1
        wait_until(lambda: not first.is_alive(), 10, "the closed store's heartbeat to end")
        with guard(store, "job-2") as call:
            claimed = lease_deadline(real_client, record)
            wait_until(
                lambda: lease_deadline(real_client, record) > claimed,
                10,
                "the closed store's claim to be renewed",
            )
            call.save(2)
    finally:
        store.close()


async def test_a_claim_on_an_aclosed_store_is_renewed(
    real_async_client: redis.asyncio.Redis, prefix: str
) -> None:
    """The asyncio store's side of the test above (it already behaved so)."""
    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix, lease=LEASE))
    record = record_for(prefix, "", GUARD_METHOD, "", "job-2")
    try:
        async with aguard(store, "job-1") as call:
            call.save(1)
        await store.aclose()  # the end of job 1
        async with aguard(store, "job-2") as call:
            claimed = await alease_deadline(real_async_client, record)
            await async_wait_until(
                lambda: _later(alease_deadline(real_async_client, record), claimed),
                10,
                "the closed store's claim to be renewed",
            )
            call.save(2)
    finally:
        await store.aclose()


async def _later(deadline: Awaitable[int], than: int) -> bool:
    return await deadline > than


# ---- a slow on_event hook: the heartbeat's reports never delay a renewal -----------------

HOOK_SECONDS = 3.0  # a hook stuck this long (an alerting call that hangs): three short leases


def test_a_slow_record_lost_hook_does_not_stop_the_other_claims_renewals(
    real_client: redis.Redis, prefix: str
) -> None:
    """Before, the heartbeat thread called the hook itself: while it ran, no other claim of the
    store was renewed, their leases lapsed, and a duplicate ran them a second time."""
    stuck, unstick = threading.Event(), threading.Event()
    threads: list[str] = []

    def hook(event: Event) -> None:
        if event.kind == "record_lost":
            threads.append(threading.current_thread().name)
            stuck.set()
            unstick.wait(HOOK_SECONDS)

    store = RedisStore(real_client, Policy(prefix=prefix, lease=1.0, on_event=hook))
    rival = RedisStore(real_client, Policy(prefix=prefix))
    lost = record_for(prefix, "", GUARD_METHOD, "", "job-a")
    try:
        with guard(store, "job-b") as call:
            with pytest.raises(LeaseLostError), guard(store, "job-a") as doomed:  # noqa: PT012
                real_client.delete(lost.record_key)  # job-a's record deleted (or evicted)
                assert stuck.wait(10), "the heartbeat never reported job-a's lost record"
                doomed.save("too late")
            end = time.monotonic() + 2.0  # the hook is stuck for all of it: two leases of job-b
            while time.monotonic() < end:
                with pytest.raises(RequestInFlightError), guard(rival, "job-b"):
                    pytest.fail("job-b's lease lapsed while the hook ran: a duplicate got in")
                time.sleep(0.05)  # pacing the checks, not waiting for anything
            call.save("done")
    finally:
        unstick.set()
        store.close()
        rival.close()
    assert threads != ["idemkey-heartbeat"]


async def test_the_async_heartbeat_reports_outside_its_renewal_loop(
    real_async_client: redis.asyncio.Redis, prefix: str
) -> None:
    """Hooks run on the event loop (a hook that blocks it stalls everything, renewals too), but
    not inside the heartbeat's task: one that hands slow work to a task, as a hook on an asyncio
    store should, keeps every other claim renewed while that work runs."""
    tasks: list[asyncio.Task[object] | None] = []
    slow: list[asyncio.Task[None]] = []

    def hook(event: Event) -> None:
        if event.kind == "record_lost":
            tasks.append(asyncio.current_task())
            slow.append(asyncio.get_running_loop().create_task(asyncio.sleep(HOOK_SECONDS)))

    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix, lease=1.0, on_event=hook))
    rival = AsyncRedisStore(real_async_client, Policy(prefix=prefix))
    lost = record_for(prefix, "", GUARD_METHOD, "", "job-a")
    try:
        async with aguard(store, "job-b") as call:
            with pytest.raises(LeaseLostError):  # noqa: PT012 - the scenario
                async with aguard(store, "job-a") as doomed:
                    await real_async_client.delete(lost.record_key)
                    await async_wait_until(lambda: slow, 10, "the lost record's report")
                    doomed.save("too late")
            heartbeat = store._heartbeat
            while not slow[0].done():  # the hook's slow work: three leases of job-b
                with pytest.raises(RequestInFlightError):
                    async with aguard(rival, "job-b"):
                        pytest.fail("job-b's lease lapsed while the hook's work ran")
                await asyncio.sleep(0.05)  # pacing the checks, not waiting for anything
            call.save("done")
    finally:
        for task in slow:
            task.cancel()
        await store.aclose()
        await rival.aclose()
    assert heartbeat is not None
    assert tasks != [heartbeat]
