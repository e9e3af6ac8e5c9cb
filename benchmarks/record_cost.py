"""What a record costs the server: time per call against minimal "floor" scripts, and memory.

``python -m benchmarks.record_cost`` prints both tables (a private ``redis-server``, nothing
else on it); a full ``python -m benchmarks`` run includes them.

Time.
Load-independent where wall-clock latency is not: on a private ``redis-server``, after
``CONFIG RESETSTAT``, N first calls (claim + complete on fresh keys) and then N replays (claim on
a completed key) run through ``EVALSHA``, and ``INFO commandstats`` gives the microseconds
Redis spent in ``evalsha`` (the scripts and every command inside them). The floor scripts do the
least any correct design does:

* claim: ``TIME`` + ``HSET fp state lease`` (the lease's deadline, one key as idemkey's) +
  ``PEXPIRE`` on the record;
* complete: ``HSET resp`` + ``HDEL state lease`` + ``PEXPIRE``;
* replay: one ``HMGET``.

Slices of both kinds alternate, and the median slice is reported, so a neighbour's burst hits
both alike. The scripts are read from ``--lua DIR`` (default: the installed package's), so the
same measurement runs against another checkout's scripts::

    python -m benchmarks.record_cost
    python -m benchmarks.record_cost --lua /path/to/old/idemkey/lua --hex-fingerprint

Scripts that name ``KEYS[2]`` (idemkey 0.2 and before: the record and its lock string) are sent
both keys; today's take the record alone.

Memory: :func:`benchmarks.extra.memory_per_record` (MEMORY USAGE of completed records, beside
a plain string holding the same bytes), with the installed idemkey's store.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
import xxhash

from idemkey._core import new_owner, owner_tag, record_for

from .cases import Context
from .extra import memory_per_record
from .servers import RedisServer, ServerError
from .tables import format_server_time, memory_table

__all__ = ["FLOOR_SCRIPTS", "measure", "server_time"]

FLOOR_SCRIPTS = {
    "claim": """
local now = redis.call("TIME")
redis.call("HSET", KEYS[1], "fp", ARGV[1], "state", "in_progress", "lease",
  now[1] * 1000 + math.floor(now[2] / 1000) + ARGV[3])
redis.call("PEXPIRE", KEYS[1], ARGV[4])
return {1, 1, 0}
""",
    "complete": """
redis.call("HDEL", KEYS[1], "state", "lease")
redis.call("HSET", KEYS[1], "resp", ARGV[2])
redis.call("PEXPIRE", KEYS[1], ARGV[3])
return 1
""",
    "replay": """
return {2, redis.call("HMGET", KEYS[1], "fp", "resp")[2]}
""",
}

LEASE_MS = 30_000
TTL_MS = 900_000


def _evalsha_usec(client: redis.Redis) -> tuple[int, float]:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), float(stats.get("usec", 0))


def _fingerprint(payload: bytes, hex_fingerprint: bool) -> bytes | str:
    if hex_fingerprint:
        return xxhash.xxh3_128_hexdigest(payload)
    return xxhash.xxh3_128_digest(payload)


def measure(
    client: redis.Redis,
    shas: dict[str, str],
    prefix: str,
    n: int,
    response: bytes,
    fp: bytes | str,
    keys: int = 1,
) -> tuple[float, float]:
    """Server usec per first call and per replay for one set of scripts (``shas``: claim,
    complete, and replay, which may be the claim script itself), sent ``keys`` keys (2: the
    record and 0.2's lock string)."""
    run = os.urandom(4).hex()
    records = [record_for(prefix, "", "POST", "/bench", f"{run}:{i}") for i in range(n)]
    owners = [new_owner() for _ in range(n)]
    client.execute_command("CONFIG", "RESETSTAT")
    for record, owner in zip(records, owners, strict=True):
        k = (record.key, record.lock)[:keys]
        client.execute_command("EVALSHA", shas["claim"], keys, *k, fp, owner, LEASE_MS, TTL_MS)
        client.execute_command(
            "EVALSHA", shas["complete"], keys, *k, owner, response, TTL_MS, owner_tag(owner)
        )
    calls, first_usec = _evalsha_usec(client)
    if calls != 2 * n:
        raise RuntimeError(f"expected {2 * n} evalsha calls, INFO counted {calls}")
    client.execute_command("CONFIG", "RESETSTAT")
    replay = shas["replay"]
    for record in records:
        k = (record.key, record.lock)[:keys]
        answer = client.execute_command(
            "EVALSHA", replay, keys, *k, fp, new_owner(), LEASE_MS, TTL_MS
        )
        if answer[0] != 2:
            raise RuntimeError(f"expected a replay, got {answer!r:.80}")
    _, replay_usec = _evalsha_usec(client)
    client.delete(*(r.key for r in records), *(r.lock for r in records))
    return first_usec / n, replay_usec / n


def server_time(
    client: redis.Redis,
    prefix: str,
    *,
    lua: Path | None = None,
    hex_fingerprint: bool = False,
    n: int = 2000,
    slices: int = 5,
    response_size: int = 100,
) -> dict[str, Any]:
    """Median usec per first call and per replay, idemkey's scripts and the floor's."""
    lua = lua or Path(__file__).resolve().parent.parent / "idemkey" / "lua"
    texts = {name: (lua / f"{name}.lua").read_text("utf-8") for name in ("claim", "complete")}
    ours = {name: client.script_load(text) for name, text in texts.items()}
    keys = 2 if "KEYS[2]" in texts["claim"] else 1
    ours["replay"] = ours["claim"]
    floor = {name: client.script_load(text) for name, text in FLOOR_SCRIPTS.items()}
    response = os.urandom(response_size)
    fp = _fingerprint(b'{"amount": 100}', hex_fingerprint)
    runs: dict[str, list[float]] = {
        "first": [],
        "replay": [],
        "floor_first": [],
        "floor_replay": [],
    }
    measure(client, ours, prefix, n // 4 or 1, response, fp, keys)  # warm-up
    for _ in range(slices):
        first, replay = measure(client, ours, prefix, n, response, fp, keys)
        runs["first"].append(first)
        runs["replay"].append(replay)
        first, replay = measure(client, floor, prefix, n, response, fp)
        runs["floor_first"].append(first)
        runs["floor_replay"].append(replay)
    med = {name: statistics.median(values) for name, values in runs.items()}
    return {
        "scripts": str(lua),
        "calls_per_slice": n,
        "slices": slices,
        "response_bytes": response_size,
        "first_usec": med["first"],
        "replay_usec": med["replay"],
        "floor_first_usec": med["floor_first"],
        "floor_replay_usec": med["floor_replay"],
        "first_x_floor": med["first"] / med["floor_first"],
        "replay_x_floor": med["replay"] / med["floor_replay"],
        "runs": runs,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.record_cost", description=__doc__)
    parser.add_argument("--lua", type=Path, help="directory of claim.lua/complete.lua to measure")
    parser.add_argument("--hex-fingerprint", action="store_true",
                        help="send 32 hex digits as the fingerprint (idemkey 0.1)")  # fmt: skip
    parser.add_argument("-n", type=int, default=2000, help="calls per slice")
    parser.add_argument("--slices", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    try:
        server = RedisServer()
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        client = redis.Redis.from_url(server.url)
        row = server_time(client, "idemkey-st", lua=args.lua, hex_fingerprint=args.hex_fingerprint,
                          n=args.n, slices=args.slices)  # fmt: skip
        ctx = Context(client, None, "idemkey", 1)  # the default prefix: names as long as an app's
        memory = memory_per_record(ctx, client)
        for store in ctx.stores:
            store.close()
        client.close()
    finally:
        server.close()
    if args.json:
        print(json.dumps({"server_time": row, "memory": memory}, indent=2))
    else:
        print("\n".join([*format_server_time(row), *memory_table(memory)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
