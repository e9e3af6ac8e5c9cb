"""Waiters in one process: 50 asyncio tasks or 50 threads wait on one claim (``wait > 0``).

The claim is held ``--hold`` seconds, then completed; reported: how long after the completion
started each waiter returned (the store's own wake-up, no HTTP), and the ``INFO commandstats``
calls the waiters and the completion cost on a private redis-server.

    python -m benchmarks.waiters_inprocess                        # this checkout's idemkey
    python -m benchmarks.waiters_inprocess --idemkey /work/wt/before

The measurement runs in a child interpreter with ``--idemkey`` first on its path, so one script
measures two checkouts.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from .servers import RedisServer

CHILD = """
import asyncio, statistics, sys, threading, time
import redis, redis.asyncio
from idemkey import AsyncRedisStore, Policy, RedisStore
from idemkey.records import record_for

url, waiters, hold, runs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
admin = redis.Redis.from_url(url)


def calls():
    return {k: v["calls"] for k, v in admin.info("commandstats").items()}


def report(kind, wakes, before):
    after = calls()
    spent = {k: after[k] - before.get(k, 0) for k in ("cmdstat_evalsha", "cmdstat_xread")
             if k in after}
    print(f"{kind:>7}  {statistics.median(wakes):>11.1f}  {max(wakes):>11.1f}  "
          f"{spent.get('cmdstat_evalsha', 0):>7}  {spent.get('cmdstat_xread', 0):>5}")


async def tasks(index):
    client = redis.asyncio.Redis.from_url(url)
    store = AsyncRedisStore(client, Policy(prefix="p", wait=10))
    warm = record_for("p", "t", "POST", "/x", f"warm-a{index}")
    await store.complete(warm, (await store.claim(warm, "fp")).owner, b"w")  # loads scripts
    record = record_for("p", "t", "POST", "/x", f"a{index}")
    first = await store.claim(record, "fp")
    before = calls()

    async def wait():
        await store.claim(record, "fp", wait=10)
        return time.monotonic()

    waiting = [asyncio.create_task(wait()) for _ in range(waiters)]
    await asyncio.sleep(hold)
    completed = time.monotonic()
    await store.complete(record, first.owner, b"r")
    woke = await asyncio.gather(*waiting)
    report("tasks", [(t - completed) * 1000 for t in woke], before)
    await store.aclose()
    await client.aclose()


def threads(index):
    client = redis.Redis.from_url(url, max_connections=waiters * 2 + 10)
    store = RedisStore(client, Policy(prefix="p", wait=10))
    warm = record_for("p", "t", "POST", "/x", f"warm-s{index}")
    store.complete(warm, store.claim(warm, "fp").owner, b"w")
    record = record_for("p", "t", "POST", "/x", f"s{index}")
    first = store.claim(record, "fp")
    before, woke = calls(), []

    def wait():
        store.claim(record, "fp", wait=10)
        woke.append(time.monotonic())

    waiting = [threading.Thread(target=wait) for _ in range(waiters)]
    for thread in waiting:
        thread.start()
    time.sleep(hold)
    completed = time.monotonic()
    store.complete(record, first.owner, b"r")
    for thread in waiting:
        thread.join()
    report("threads", [(t - completed) * 1000 for t in woke], before)
    store.close()
    client.close()


import idemkey
print(idemkey.__file__)
print("   kind  wake p50 ms  wake max ms  EVALSHA  XREAD")
for index in range(runs):
    asyncio.run(tasks(index))
for index in range(runs):
    threads(index)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idemkey", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--waiters", type=int, default=50)
    parser.add_argument("--hold", type=float, default=0.5, help="seconds the claim is held")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    print(
        f"{args.waiters} waiters, claim held {args.hold * 1000:g} ms, idemkey from {args.idemkey}"
    )
    env = {**os.environ, "PYTHONPATH": args.idemkey}
    with RedisServer() as server:
        command = [sys.executable, "-c", CHILD, server.url, str(args.waiters), str(args.hold),
                   str(args.runs)]  # fmt: skip
        # cwd: ``-c`` puts the working directory first on the path, before PYTHONPATH.
        return subprocess.run(command, env=env, cwd=args.idemkey, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
