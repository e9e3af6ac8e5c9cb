"""Recovery points across processes: a worker SIGKILLed between two steps, a worker SIGSTOPped
past its lease. The takeover (this test process) runs only the steps that did not finish; the
side effects, counted in Redis, show each step ran exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from idemkey import LeaseLostError, Policy, RedisStore, guard
from idemkey._core import record_for
from idemkey.guard import GUARD_METHOD
from tests._lease import lapse
from tests._servers import wait_until
from tests.steps._worker import STEPS, retried_job, run_job, side_effect

ROOT = Path(__file__).resolve().parents[2]
LEASE = 0.6  # seconds: short, so the takeover comes quickly after the kill


@pytest.fixture
def spawn(redis_url: str, prefix: str) -> Iterator[object]:
    workers: list[subprocess.Popen[str]] = []

    def start(key: str, pause_after: int, mode: str = "steps") -> subprocess.Popen[str]:
        argv = [sys.executable, "-m", "tests.steps._worker", mode, redis_url, prefix, key]
        worker = subprocess.Popen(
            [*argv, str(LEASE), str(pause_after)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGKILL)
        worker.communicate(timeout=10)


def side_effects(client: redis.Redis, prefix: str) -> dict[str, int]:
    return {name: int(client.get(f"{prefix}:side:{name}") or 0) for name in STEPS}


def wait_for_pause(client: redis.Redis, prefix: str, worker: subprocess.Popen[str]) -> int:
    def paused() -> int:
        if worker.poll() is not None:
            pytest.fail(f"the worker ended early: {worker.communicate()}")
        return int(client.get(f"{prefix}:after") or 0)

    return wait_until(paused, timeout=20, message="the worker to finish its first steps")


def ranked(fences: list[int]) -> list[int]:
    """Fences by rank, 1 for the lowest (a fence is the server's clock in µs, so only their
    order and repeats say which executor ran what)."""
    order = sorted(set(fences))
    return [order.index(fence) + 1 for fence in fences]


@pytest.mark.parametrize("killed_after", [1, 2])
def test_a_takeover_after_sigkill_between_steps_runs_each_step_once(
    spawn, real_client: redis.Redis, redis_url: str, prefix: str, killed_after: int
) -> None:
    worker = spawn("order-1", killed_after)
    assert wait_for_pause(real_client, prefix, worker) == killed_after
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)

    store = RedisStore(real_client, Policy(prefix=prefix, lease=LEASE, wait=10))
    try:
        # wait=10: the first claim finds the dead worker's lease, then takes over once it lapses.
        with guard(store, "order-1", payload="order-1") as call:
            assert call.takeover
            assert call.resumed_steps == STEPS[:killed_after]
            results = run_job(call, real_client, prefix)
            call.save(results)
    finally:
        store.close()

    assert side_effects(real_client, prefix) == dict.fromkeys(STEPS, 1)
    # The finished steps' results are the dead worker's (its fence), the others ours (higher).
    fences = [result["fence"] for result in results]
    assert ranked(fences) == [1] * killed_after + [2] * (3 - killed_after)
    assert fences[-1] == call.fence
    assert {result["pid"] for result in results[:killed_after]} == {worker.pid}


def test_sigkill_during_a_retried_step_the_takeover_continues_its_attempt_count(
    spawn, real_client: redis.Redis, prefix: str
) -> None:
    worker = spawn("order-r", 0, "retry")
    assert wait_for_pause(real_client, prefix, worker) == 2  # attempt 2 of "charge" runs
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)
    record = record_for(prefix, "", GUARD_METHOD, "", "order-r")
    assert real_client.hget(record.key, "a:charge") == b"2"

    store = RedisStore(real_client, Policy(prefix=prefix, lease=LEASE, wait=10))
    try:
        with guard(store, "order-r", payload="order-r") as call:
            assert call.takeover
            assert call.resumed_steps == ("reserve",)
            results = retried_job(call, real_client, prefix)
            # The takeover's attempt was the third of four, not a first.
            assert real_client.hget(record.key, "a:charge") == b"3"
            call.save(results)
    finally:
        store.close()
    # Three attempts in all (one failed, one killed, one succeeded); the side effect of each
    # step happened once, for its one successful attempt.
    assert real_client.get(f"{prefix}:tries:charge") == b"3"
    assert side_effects(real_client, prefix) == dict.fromkeys(STEPS, 1)
    assert ranked([result["fence"] for result in results]) == [1, 2, 2]


def test_a_stale_owner_resumed_after_sigstop_cannot_checkpoint(
    spawn, real_client: redis.Redis, prefix: str
) -> None:
    worker = spawn("order-2", 1)
    wait_for_pause(real_client, prefix, worker)
    os.kill(worker.pid, signal.SIGSTOP)  # frozen, heartbeat and all: its lease lapses

    store = RedisStore(real_client, Policy(prefix=prefix, lease=5, wait=10))
    record = record_for(prefix, "", GUARD_METHOD, "", "order-2")
    try:
        with guard(store, "order-2", payload="order-2") as call:
            assert call.takeover
            assert call.resumed_steps == ("reserve",)
            # The stale worker wakes up and goes on to its step 2 while we own the record.
            os.kill(worker.pid, signal.SIGCONT)
            real_client.rpush(f"{prefix}:go", 1)
            out, err = worker.communicate(timeout=20)
            stale = json.loads(out)
            assert stale["outcome"] == "lease_lost", err
            # Its "charge" ran (a stale owner cannot be stopped from running code: that is what
            # call.fence and call.step_key are for downstream), but it was not checkpointed...
            assert real_client.hget(record.key, "s:charge") is None
            # ...so ours runs, is stored, and the stale worker never reached "ship".
            results = run_job(call, real_client, prefix)
            call.save(results)
    finally:
        store.close()
    assert ranked([result["fence"] for result in results]) == [1, 2, 2]
    assert stale["fence"] == results[0]["fence"]  # the stale worker's own fence
    assert side_effects(real_client, prefix) == {"reserve": 1, "charge": 2, "ship": 1}


def test_a_stale_owner_in_process_gets_lease_lost_and_no_later_step_runs(
    real_client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix, lease=10))
    record = record_for(prefix, "", GUARD_METHOD, "", "k")
    ran: list[str] = []
    try:
        with guard(store, "k") as stale:
            stale.step("one", ran.append, "one")
            assert lapse(real_client, record) == 1  # the lease lapsed (a long pause)...
            with guard(store, "k") as fresh:  # ...and another executor took over
                assert fresh.takeover
                assert fresh.resumed_steps == ("one",)
            with pytest.raises(LeaseLostError) as lost:
                stale.step("two", ran.append, "two")  # runs, but is refused
            assert lost.value.fence == stale.fence
            with pytest.raises(LeaseLostError):
                stale.step("three", ran.append, "three")  # never starts after a refusal
    finally:
        store.close()
    assert ran == ["one", "two"]
    assert real_client.hget(record.key, "s:two") is None


async def test_an_async_takeover_after_sigkill_of_an_async_worker_resumes(
    spawn, real_client: redis.Redis, redis_url: str, prefix: str
) -> None:
    import redis.asyncio

    from idemkey import AsyncRedisStore, aguard

    worker = spawn("order-3", 2, "asteps")
    assert wait_for_pause(real_client, prefix, worker) == 2
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)

    aclient = redis.asyncio.Redis.from_url(redis_url)
    store = AsyncRedisStore(aclient, Policy(prefix=prefix, lease=LEASE, wait=10))
    try:
        async with aguard(store, "order-3", payload="order-3") as call:
            assert call.takeover
            assert call.resumed_steps == STEPS[:2]
            results = [
                await call.step(name, side_effect, real_client, prefix, name, call.fence)
                for name in STEPS
            ]
            call.save(results)
    finally:
        await store.aclose()
        await aclient.aclose()
    assert side_effects(real_client, prefix) == dict.fromkeys(STEPS, 1)
    assert ranked([result["fence"] for result in results]) == [1, 1, 2]
