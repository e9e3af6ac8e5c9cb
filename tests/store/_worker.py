"""The other processes of the cross-process tests: ``python -m tests.store._worker MODE ...``.

``race URL PREFIX N_KEYS``
    Wait for the start signal, then run ``guard`` on keys 0..N_KEYS-1 in order, each body
    counting its execution with INCR on ``{PREFIX}:runs:<key>``. Prints a JSON line of outcomes.
``hold URL PREFIX KEY LEASE``
    Claim KEY with ``guard`` (lease LEASE seconds, heartbeat on), announce the fence on
    ``{PREFIX}:claimed``, and wait for ``{PREFIX}:finish`` before saving. The test kills or
    pauses this process meanwhile. Prints the outcome of the save as a JSON line.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

import redis

from idemkey import LeaseLostError, Policy, RedisStore, RequestInFlightError, guard

START_TIMEOUT = 60


def race(url: str, prefix: str, n_keys: int) -> None:
    client = redis.Redis.from_url(url)
    store = RedisStore(client, Policy(prefix=prefix))
    outcomes: Counter[str] = Counter()
    client.incr(f"{prefix}:ready")
    if client.blpop([f"{prefix}:go"], timeout=START_TIMEOUT) is None:
        sys.exit("no start signal")
    for index in range(n_keys):
        key = f"job:{index}"
        try:
            with guard(store, key, payload=key) as call:
                if call.replayed:
                    outcomes["replayed"] += 1
                    continue
                client.incr(f"{prefix}:runs:{key}")
                call.save(os.getpid())
                outcomes["ran"] += 1
        except RequestInFlightError:
            outcomes["in_flight"] += 1
    store.close()
    print(json.dumps(outcomes), flush=True)


def hold(url: str, prefix: str, key: str, lease: float) -> None:
    client = redis.Redis.from_url(url)
    store = RedisStore(client, Policy(prefix=prefix, lease=lease))
    try:
        with guard(store, key) as call:
            client.set(f"{prefix}:claimed", str(call.fence))
            client.blpop([f"{prefix}:finish"], timeout=START_TIMEOUT)
            call.save("from the first owner")
    except LeaseLostError as exc:
        print(json.dumps({"outcome": "lease_lost", "fence": exc.fence}), flush=True)
    else:
        print(json.dumps({"outcome": "completed"}), flush=True)


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "race":
        race(args[0], args[1], int(args[2]))
    elif mode == "hold":
        hold(args[0], args[1], args[2], float(args[3]))
    else:
        sys.exit(f"unknown mode {mode!r}")
