"""Own-CPU microbenchmark and profile of the guard paths, with the in-process fake client.

::

    python -m benchmarks.profile                 # min/median us per call of each path
    python -m benchmarks.profile --cprofile      # plus the top functions by own time

Process CPU time counts every thread of the process (the heartbeat thread too), and is not
inflated when the machine is busy and the process waits for a core. Unlike the interleaved
suite (which measures each call cold, between network cases), this runs each path in a
tight loop: the best case, used to compare a change before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable, Sequence

from idemkey import AsyncRedisStore, Policy, RedisStore, aguard, guard
from idemkey._codec import encode_value

from .cases import PAYLOAD, RESULT
from .fakes import AsyncFakeClient, FakeClient, first_call_replies, replay_replies

__all__ = ["main"]


def _paths(n: int) -> tuple[dict[str, Callable[[], None]], Callable[[], object]]:
    policy = Policy(prefix="profile", ttl=900.0, lease=30.0)
    stored = encode_value(RESULT)
    first_store = RedisStore(FakeClient(first_call_replies()), policy)
    replay_store = RedisStore(FakeClient(replay_replies(stored)), policy)
    afirst_store = AsyncRedisStore(AsyncFakeClient(first_call_replies()), policy)
    areplay_store = AsyncRedisStore(AsyncFakeClient(replay_replies(stored)), policy)
    keys = [f"order:{i}" for i in range(n)]
    loop = asyncio.new_event_loop()

    def first() -> None:
        for key in keys:
            with guard(first_store, key, payload=PAYLOAD) as call:
                call.save(RESULT)

    def replay() -> None:
        for _ in keys:
            with guard(replay_store, "replay", payload=PAYLOAD) as call:
                call.result  # noqa: B018

    async def afirst_loop() -> None:
        for key in keys:
            async with aguard(afirst_store, key, payload=PAYLOAD) as call:
                call.save(RESULT)

    async def areplay_loop() -> None:
        for _ in keys:
            async with aguard(areplay_store, "replay", payload=PAYLOAD) as call:
                call.result  # noqa: B018

    async def close() -> None:
        await afirst_store.aclose()
        await areplay_store.aclose()

    paths: dict[str, Callable[[], None]] = {
        "guard.first": first,
        "guard.replay": replay,
        "aguard.first": lambda: loop.run_until_complete(afirst_loop()),
        "aguard.replay": lambda: loop.run_until_complete(areplay_loop()),
    }
    return paths, lambda: (loop.run_until_complete(close()), loop.close())


def warm_cpu(n: int, repeats: int) -> dict[str, dict[str, float]]:
    """Per path: median process CPU and wall time per call (us) over ``repeats`` loops of n."""
    paths, close = _paths(n)
    out: dict[str, dict[str, float]] = {}
    try:
        for name, run in paths.items():
            wall, cpu = [], []
            for _ in range(repeats):
                t0, c0 = time.perf_counter_ns(), time.process_time_ns()
                run()
                cpu.append((time.process_time_ns() - c0) / n / 1000)
                wall.append((time.perf_counter_ns() - t0) / n / 1000)
            out[name] = {"cpu_us": statistics.median(cpu), "wall_us": statistics.median(wall),
                         "cpu_min_us": min(cpu)}  # fmt: skip
    finally:
        close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile")
    p.add_argument("-n", type=int, default=20_000, help="calls per repeat")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--cprofile", action="store_true", help="print a cProfile of each path")
    args = p.parse_args(argv)
    paths, close = _paths(args.n)
    for name, run in paths.items():
        wall, cpu = [], []
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter_ns(), time.process_time_ns()
            run()
            cpu.append((time.process_time_ns() - c0) / args.n / 1000)
            wall.append((time.perf_counter_ns() - t0) / args.n / 1000)
        print(
            f"{name:14s} wall min {min(wall):6.2f} us  median {statistics.median(wall):6.2f} us"
            f"   process CPU min {min(cpu):6.2f} us  median {statistics.median(cpu):6.2f} us"
        )
        if args.cprofile:
            profiler = cProfile.Profile()
            profiler.runcall(run)
            pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
    close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
