"""One racing client of the soak: ``python -m tests.soak._worker URL PREFIX N SEED OUT SECONDS``.

In rounds, until SECONDS have passed since the start signal: sends every key
``r<round>-job-<i>`` (i in 0..N-1) once, in its own random order, with up to CONCURRENCY requests in
flight (asyncio tasks over ``aguard``). Each handler run fails at random (before its effect),
and some requests are cancelled at a random moment (during the claim, the handler or the
completion). A handler that succeeds records its effect in the same step as ``call.save``:
``INCR {PREFIX}:ok:<key>`` and ``SET {PREFIX}:val:<key> <value>``, with no await in between, so
a cancellation cannot split the effect from the saved value. Writes a JSON summary to OUT:
counts per outcome and every replayed value, for the test to check against Redis.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from collections import Counter

import redis
import redis.asyncio

from idemkey import AsyncRedisStore, Policy, RequestInFlightError, StoreError, aguard

CONCURRENCY = 32
FAIL_RATE = 0.1
CANCEL_RATE = float(os.environ.get("IDEMKEY_SOAK_CANCEL_RATE", "0.2"))
LEASE = 2.0
START_TIMEOUT = 60


class HandlerFailed(Exception):
    pass


async def main(url: str, prefix: str, n_keys: int, seed: int, seconds: float) -> dict[str, object]:
    rng = random.Random(seed)
    client = redis.asyncio.Redis.from_url(url, socket_timeout=10, max_connections=CONCURRENCY + 8)
    effects = redis.Redis.from_url(url, socket_timeout=10)  # sync: no await inside the effect
    # Duplicates wait for the first to finish (and replay it) rather than get 409 at once.
    store = AsyncRedisStore(client, Policy(prefix=prefix, lease=LEASE, wait=LEASE + 2))
    outcomes: Counter[str] = Counter()
    replays: dict[str, str] = {}
    gate = asyncio.Semaphore(CONCURRENCY)

    async def send(key: str) -> None:
        async with aguard(store, key, payload=key) as call:
            if call.replayed:
                value = call.result
                if replays.setdefault(key, value) != value:
                    outcomes["replay_differs_within_process"] += 1
                outcomes["replayed"] += 1
                return
            await asyncio.sleep(rng.random() * 0.004)  # the handler's I/O
            if rng.random() < FAIL_RATE:
                raise HandlerFailed
            value = f"{key}:{os.getpid()}:{rng.getrandbits(32):08x}"
            effects.incr(f"{prefix}:ok:{key}")
            effects.set(f"{prefix}:val:{key}", value)
            call.save(value)
            outcomes["ran"] += 1

    async def one(key: str) -> None:
        async with gate:
            task = asyncio.ensure_future(send(key))
            if rng.random() < CANCEL_RATE:
                # Cancel at a random moment: during the claim, the handler or the completion.
                await asyncio.wait([task], timeout=rng.random() * 0.006)
                task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                outcomes["cancelled"] += 1
            except HandlerFailed:
                outcomes["failed"] += 1
            except RequestInFlightError:
                outcomes["in_flight"] += 1
            except StoreError as exc:
                outcomes["store_error"] += 1
                print(f"store error: {exc}", file=sys.stderr)

    await client.incr(f"{prefix}:ready")
    if await client.blpop([f"{prefix}:go"], timeout=START_TIMEOUT) is None:
        sys.exit("no start signal")
    deadline = time.monotonic() + seconds
    rounds = 0
    while rounds == 0 or time.monotonic() < deadline:
        keys = [f"r{rounds}-job-{i}" for i in range(n_keys)]
        rng.shuffle(keys)
        await asyncio.gather(*(one(key) for key in keys))
        rounds += 1
    # Writes that a cancellation cut off finish in tasks of their own (idemkey.guard):
    # a server process keeps running them; this one must not close the client under them.
    others = asyncio.all_tasks() - {asyncio.current_task()}
    await asyncio.wait_for(asyncio.gather(*others, return_exceptions=True), 30)
    await store.aclose()
    await client.aclose()
    effects.close()
    return {"outcomes": outcomes, "replays": replays, "rounds": rounds}


if __name__ == "__main__":
    url, prefix, n, seed, out, seconds = sys.argv[1:7]
    summary = asyncio.run(main(url, prefix, int(n), int(seed), float(seconds)))
    with open(out, "w") as fh:
        json.dump(summary, fh)
