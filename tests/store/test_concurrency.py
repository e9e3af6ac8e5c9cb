"""Many callers, one key, real Redis: the body runs exactly once.

Threads with ``guard``, asyncio tasks with ``aguard``, and separate processes. Every other
caller gets the replay or ``RequestInFlightError`` (with ``wait``: always the replay).
Executions are counted with INCR in the same Redis, so a double run cannot hide.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
import redis.asyncio

from idemkey import AsyncRedisStore, Policy, RedisStore, RequestInFlightError, aguard, guard
from tests._servers import wait_until

ROOT = Path(__file__).resolve().parents[2]
CALLERS = 100


@pytest.mark.parametrize("wait", [0.0, 10.0], ids=["no-wait", "wait"])
def test_threads_on_one_key_run_the_body_once(
    real_client: redis.Redis, prefix: str, wait: float
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix, wait=wait))
    start = threading.Barrier(CALLERS)
    counter = f"{prefix}:runs"

    def caller(_: int) -> tuple[str, object]:
        start.wait()
        try:
            with guard(store, "charge:1", payload=b"invoice") as call:
                if call.replayed:
                    return "replayed", call.result
                runs = real_client.incr(counter)
                call.save({"runs": runs})
                return "ran", call.result
        except RequestInFlightError as exc:
            return "in_flight", exc.retry_after

    try:
        with ThreadPoolExecutor(CALLERS) as pool:
            outcomes = list(pool.map(caller, range(CALLERS)))
    finally:
        store.close()
    kinds = Counter(kind for kind, _ in outcomes)
    assert kinds["ran"] == 1
    assert int(real_client.get(counter) or 0) == 1
    assert kinds["ran"] + kinds["replayed"] + kinds["in_flight"] == CALLERS
    assert all(result == {"runs": 1} for kind, result in outcomes if kind != "in_flight")
    assert all(0 < retry <= 30 for kind, retry in outcomes if kind == "in_flight")  # type: ignore[operator]
    if wait:
        assert kinds["replayed"] == CALLERS - 1


@pytest.mark.parametrize("wait", [0.0, 10.0], ids=["no-wait", "wait"])
async def test_tasks_on_one_key_run_the_body_once(
    real_async_client: redis.asyncio.Redis, prefix: str, wait: float
) -> None:
    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix, wait=wait))
    start = asyncio.Event()
    counter = f"{prefix}:runs"

    async def caller() -> tuple[str, object]:
        await start.wait()
        try:
            async with aguard(store, "charge:1", payload=b"invoice") as call:
                if call.replayed:
                    return "replayed", call.result
                runs = await real_async_client.incr(counter)
                await asyncio.sleep(0)  # let the others reach Redis while we hold the claim
                call.save({"runs": runs})
                return "ran", call.result
        except RequestInFlightError:
            return "in_flight", None

    tasks = [asyncio.create_task(caller()) for _ in range(CALLERS)]
    start.set()
    try:
        outcomes = await asyncio.gather(*tasks)
    finally:
        await store.aclose()
    kinds = Counter(kind for kind, _ in outcomes)
    assert kinds["ran"] == 1
    assert int(await real_async_client.get(counter) or 0) == 1
    assert kinds["ran"] + kinds["replayed"] + kinds["in_flight"] == CALLERS
    assert all(result == {"runs": 1} for kind, result in outcomes if kind != "in_flight")
    if wait:
        assert kinds["replayed"] == CALLERS - 1


PROCESSES = 8
KEYS = 25


@pytest.mark.slow  # starts 8 interpreters
def test_processes_racing_on_the_same_keys_run_each_once(
    redis_url: str, real_client: redis.Redis, prefix: str
) -> None:
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.store._worker", "race", redis_url, prefix, str(KEYS)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    try:
        # Start them together, once every one is connected and waiting.
        wait_until(
            lambda: int(real_client.get(f"{prefix}:ready") or 0) == PROCESSES,
            timeout=60,
            message=f"{PROCESSES} worker processes to be ready",
        )
        real_client.rpush(f"{prefix}:go", *["go"] * PROCESSES)
        results = []
        for worker in workers:
            out, err = worker.communicate(timeout=60)
            assert worker.returncode == 0, err
            results.append(Counter(json.loads(out)))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.communicate()
    runs = {index: int(real_client.get(f"{prefix}:runs:job:{index}") or 0) for index in range(KEYS)}
    assert runs == dict.fromkeys(range(KEYS), 1)
    total = sum(results, Counter())
    assert total["ran"] == KEYS
    assert total["ran"] + total["replayed"] + total["in_flight"] == KEYS * PROCESSES
