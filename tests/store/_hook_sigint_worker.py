"""Ctrl-C while an on_event hook runs: ``python -m tests.store._hook_sigint_worker URL PREFIX
SCENARIO``.

The hook raises SIGINT itself on ``claimed`` (``signal.raise_signal``), as a Ctrl-C landing
while a slow hook exports the event would, at the same point every time. The program catches
the KeyboardInterrupt and goes on, as a REPL, a notebook or a worker's warm shutdown does: it
retries at once; when that is refused, it waits for the lease to lapse and retries again. It
prints a JSON line of what it saw.

* ``guard``: ``guard()``; the signal raises KeyboardInterrupt in the hook (the block never
  ran: released).
* ``aguard-1``: ``aguard`` under ``asyncio.run``, one Ctrl-C: asyncio.run cancels its main
  task, and the cancel lands at the block's first await (a cancelled block: kept to lapse).
* ``aguard-2``: as ``aguard-1``, and a second Ctrl-C while the hook still runs: that one
  raises KeyboardInterrupt in the hook, the cancel still pending (the block never ran).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time

import redis
import redis.asyncio

from idemkey import AsyncRedisStore, Event, Policy, RedisStore, RequestInFlightError, aguard, guard
from idemkey._core import Record, record_for
from idemkey.guard import GUARD_METHOD
from tests._lease import lease_left

KEY = "charge"
#: Short, so the claim the interruption left lapses soon; renewed, it never does.
LEASE = 0.5
#: How long the program waits for that lapse: ten leases.
LAPSE_WAIT = 10 * LEASE


def ctrl_c_on_claimed(presses: int) -> object:
    def hook(event: Event) -> None:
        if event.kind == "claimed":
            for _ in range(presses):
                signal.raise_signal(signal.SIGINT)

    return hook


def wait_for(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():  # type: ignore[operator]
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def retry(store: RedisStore) -> str:
    try:
        with guard(store, KEY, payload=1) as call:
            if call.replayed:
                return "replayed"
            call.save("charged")
            return "ran (takeover)" if call.takeover else "ran"
    except RequestInFlightError:
        return "RequestInFlightError"


def first_guard(url: str, prefix: str) -> str:
    hook = ctrl_c_on_claimed(1)
    store = RedisStore(redis.Redis.from_url(url), Policy(prefix=prefix, lease=LEASE, on_event=hook))
    try:
        with guard(store, KEY, payload=1) as call:
            call.save("charged")
        return "returned"
    except KeyboardInterrupt:
        return "KeyboardInterrupt"
    finally:
        # Not closed: the program goes on with the store, whose heartbeat thread keeps
        # running. Its uncertain entries are written by a thread: wait for them.
        store._keeper.drain(5)


def first_aguard(url: str, prefix: str, presses: int) -> str:
    async def main() -> None:
        hook = ctrl_c_on_claimed(presses)
        client = redis.asyncio.Redis.from_url(url)
        store = AsyncRedisStore(client, Policy(prefix=prefix, lease=LEASE, on_event=hook))
        async with aguard(store, KEY, payload=1) as call:
            await asyncio.sleep(0)
            call.save("charged")

    try:
        asyncio.run(main())
        return "returned"
    except KeyboardInterrupt:
        return "KeyboardInterrupt"


def main(url: str, prefix: str, scenario: str) -> None:
    # As in a terminal: a runner that started this process with SIGINT ignored (a background
    # job) would leave it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if scenario == "guard":
        first = first_guard(url, prefix)
    else:
        first = first_aguard(url, prefix, int(scenario.rpartition("-")[2]))
    client = redis.Redis.from_url(url)
    record: Record = record_for(prefix, "", GUARD_METHOD, "", KEY)
    store = RedisStore(client, Policy(prefix=prefix, lease=30, wait=0))
    try:
        seen: dict[str, object] = {"first": first, "at_once": retry(store)}
        if seen["at_once"] == "RequestInFlightError":
            seen["lapsed"] = wait_for(lambda: lease_left(client, record) <= 0, LAPSE_WAIT)
            seen["retry"] = retry(store)
        store._keeper.drain(5)
        kinds = [entry.kind for entry in reversed(store.uncertain())]
        seen["entries"] = [kind for kind in kinds if kind != "takeover"]
    finally:
        store.close()
    print(json.dumps(seen))


if __name__ == "__main__":
    main(*sys.argv[1:4])
