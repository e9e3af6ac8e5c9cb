"""The crashing process of the recovery-point tests: ``python -m tests.steps._worker ...``.

``retry URL PREFIX KEY LEASE 0``
    Run :func:`retried_job` under ``guard``: its "charge" step retries (``StepRetry``); the
    first attempt fails, the second sets ``{PREFIX}:after`` to 2 and waits for ``{PREFIX}:go``
    (the test SIGKILLs it there), a third succeeds.

``steps URL PREFIX KEY LEASE PAUSE_AFTER`` (``asteps``: the same under ``aguard``)
    Run the three-step job :func:`run_job` under ``guard`` (lease LEASE seconds, heartbeat on).
    After step PAUSE_AFTER has been checkpointed, set ``{PREFIX}:after`` to that number and wait
    for ``{PREFIX}:go`` before going on: the test kills (SIGKILL) or pauses (SIGSTOP) this
    process meanwhile. Prints the outcome as a JSON line when it gets to the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import redis
import redis.asyncio

from idemkey import (
    AsyncRedisStore,
    Call,
    LeaseLostError,
    Policy,
    RedisStore,
    StepRetry,
    aguard,
    guard,
)

STEPS = ("reserve", "charge", "ship")
WAIT_TIMEOUT = 60


def side_effect(client: redis.Redis, prefix: str, name: str, fence: int | None) -> dict[str, Any]:
    """A step's work: counted in Redis, so the test sees how often each step really ran."""
    client.incr(f"{prefix}:side:{name}")
    return {"step": name, "pid": os.getpid(), "fence": fence}


def run_job(
    call: Call[Any], client: redis.Redis, prefix: str, pause_after: int = 0
) -> list[dict[str, Any]]:
    results = []
    for number, name in enumerate(STEPS, start=1):
        results.append(call.step(name, side_effect, client, prefix, name, call.fence))
        if number == pause_after:
            client.set(f"{prefix}:after", number)
            if client.blpop([f"{prefix}:go"], timeout=WAIT_TIMEOUT) is None:
                sys.exit("no go signal")
    return results


#: The retried step's policy, the same for the worker and the test's takeover.
CHARGE_RETRY = StepRetry(attempts=4, backoff=0.05, jitter=0)


class Flaky(Exception):
    pass


def flaky_charge(client: redis.Redis, prefix: str, fence: int | None) -> dict[str, Any]:
    """The retried step: every attempt is counted (``tries``); the first fails, the second
    blocks (to be killed) unless it runs in the test, the side effect of a successful attempt
    is counted apart (``side:charge``)."""
    tries = client.incr(f"{prefix}:tries:charge")
    if tries == 1:
        raise Flaky("the PSP timed out")
    if tries == 2 and os.environ.get("IDEMKEY_STEPS_WORKER"):
        client.set(f"{prefix}:after", 2)
        client.blpop([f"{prefix}:go"], timeout=WAIT_TIMEOUT)
        raise Flaky("never reached: killed while it waited")
    return side_effect(client, prefix, "charge", fence)


def retried_job(call: Call[Any], client: redis.Redis, prefix: str) -> list[dict[str, Any]]:
    return [
        call.step("reserve", side_effect, client, prefix, "reserve", call.fence),
        call.step("charge", flaky_charge, client, prefix, call.fence, retry=CHARGE_RETRY),
        call.step("ship", side_effect, client, prefix, "ship", call.fence),
    ]


def retry(url: str, prefix: str, key: str, lease: float) -> None:
    os.environ["IDEMKEY_STEPS_WORKER"] = "1"
    client = redis.Redis.from_url(url)
    store = RedisStore(client, Policy(prefix=prefix, lease=lease))
    with guard(store, key, payload=key) as call:
        call.save(retried_job(call, client, prefix))
    print(json.dumps({"outcome": "completed"}), flush=True)


def steps(url: str, prefix: str, key: str, lease: float, pause_after: int) -> None:
    client = redis.Redis.from_url(url)
    store = RedisStore(client, Policy(prefix=prefix, lease=lease))
    try:
        with guard(store, key, payload=key) as call:
            call.save(run_job(call, client, prefix, pause_after))
    except LeaseLostError as exc:
        print(json.dumps({"outcome": "lease_lost", "fence": exc.fence}), flush=True)
    else:
        print(json.dumps({"outcome": "completed"}), flush=True)


async def asteps(url: str, prefix: str, key: str, lease: float, pause_after: int) -> None:
    client = redis.Redis.from_url(url)  # the side effects and signals, as in steps()
    aclient = redis.asyncio.Redis.from_url(url)
    store = AsyncRedisStore(aclient, Policy(prefix=prefix, lease=lease))
    results = []
    async with aguard(store, key, payload=key) as call:
        for number, name in enumerate(STEPS, start=1):
            results.append(await call.step(name, side_effect, client, prefix, name, call.fence))
            if number == pause_after:
                client.set(f"{prefix}:after", number)
                # Wait in a thread, so the event loop (and the heartbeat task) keeps running.
                await asyncio.to_thread(client.blpop, [f"{prefix}:go"], WAIT_TIMEOUT)
        call.save(results)
    print(json.dumps({"outcome": "completed"}), flush=True)


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "steps":
        steps(args[0], args[1], args[2], float(args[3]), int(args[4]))
    elif mode == "retry":
        retry(args[0], args[1], args[2], float(args[3]))
    elif mode == "asteps":
        asyncio.run(asteps(args[0], args[1], args[2], float(args[3]), int(args[4])))
    else:
        sys.exit(f"unknown mode {mode!r}")
