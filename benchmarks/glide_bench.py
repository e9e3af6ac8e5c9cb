"""idemkey on valkey-glide (``idemkey[glide]``): single-call latency and 64-client throughput.

``python -m benchmarks.glide_bench`` (a private ``redis-server``, or ``--redis-url``) prints both;
a full ``python -m benchmarks`` run includes the same cases and throughput rows when
valkey-glide is installed, and says it skipped them otherwise.

* Latency, interleaved with their redis.asyncio twins (``aredis.ping``, ``afloor.*``,
  ``aguard.*``) so the two clients see the same noise: ``glide.ping``; ``gfloor.first`` /
  ``gfloor.replay``, the bare floor as glide sends it (``invoke_script`` with every argument
  ready); ``gaguard.first`` / ``gaguard.replay``, ``aguard()`` on an AsyncRedisStore over glide.
* Throughput (``benchmarks.extra.throughput``): the uvicorn app's ``/asgi/glide`` (idemkey's
  ASGI middleware on glide) and ``/asgi/glide-floor`` beside the redis-py rows, slice by slice.
  The goal (issue 25): idemkey on glide at >= 1.3x the app + bare redis-py floor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio

from idemkey import AsyncRedisStore, aguard
from idemkey._codec import encode_value
from idemkey._core import owner_tag, payload_fingerprint, record_for
from idemkey.guard import GUARD_METHOD
from idemkey.store._base import SCRIPT_KEYS

from .cases import PAYLOAD, RESULT, Case, Context, core_cases
from .extra import CLIENTS
from .report import SCALE_TARGETS, build_cases, glide_throughput_target, ratio
from .runner import prepare_all, run_interleaved
from .servers import ServerError, redis_url

__all__ = ["GLIDE_TARGET", "glide_cases", "glide_config", "main"]

#: idemkey on glide against the app + bare redis-py floor, 64 clients (issue 25, item 3).
GLIDE_TARGET = SCALE_TARGETS["throughput.glide"]


def glide_config(url: str) -> Any:
    """A ``GlideClientConfiguration`` for a ``redis://host:port/db`` URL."""
    import glide

    parts = redis.connection.parse_url(url)
    address = glide.NodeAddress(parts.get("host", "127.0.0.1"), int(parts.get("port", 6379)))
    db = int(parts.get("db", 0))
    return glide.GlideClientConfiguration([address], request_timeout=5000, database_id=db or None)


async def glide_cases(ctx: Context, url: str) -> tuple[list[Case], Any, str | None]:
    """(cases, the glide client to close, None) or ([], None, why they were skipped)."""
    try:
        import glide
    except ImportError as exc:
        return [], None, f"valkey-glide is not installed (idemkey[glide]): {exc}"
    client = await glide.GlideClient.create(glide_config(url))
    policy = ctx.policy
    store = AsyncRedisStore(client, policy)
    ctx.stores.append(store)
    claim, complete = (glide.Script(store._scripts[n].script) for n in ("claim", "complete"))
    fp, owner = payload_fingerprint(PAYLOAD), secrets.token_hex(16)
    lease_ms, ttl_ms, tag, stored = (
        str(policy.lease_ms),
        str(policy.ttl_ms),
        owner_tag(owner),
        (encode_value(RESULT)),
    )

    def record(case: str, key: str) -> tuple[str]:
        rec = record_for(ctx.prefix, "", GUARD_METHOD, "", f"{case}:{key}")
        return (rec.key,)

    async def invoke(script: Any, *keys_and_args: Any) -> Any:
        keys, args = keys_and_args[:SCRIPT_KEYS], keys_and_args[SCRIPT_KEYS:]
        return await client.invoke_script(script, keys=list(keys), args=list(args))

    replay = record("gfloor.replay", "r")

    async def prepare_replay() -> None:
        async with aguard(store, "glide-replay", payload=PAYLOAD) as call:
            if not call.replayed:
                call.save(RESULT)
        await invoke(claim, *replay, fp, owner, lease_ms, ttl_ms)
        await invoke(complete, *replay, owner, stored, ttl_ms, tag)

    async def ping(i: int) -> None:
        await client.custom_command(["PING"])

    async def floor_first(i: int) -> None:
        (key,) = record("gfloor.first", str(i))
        await invoke(claim, key, fp, owner, lease_ms, ttl_ms)
        await invoke(complete, key, owner, stored, ttl_ms, tag)

    async def floor_replay(i: int) -> None:
        await invoke(claim, *replay, fp, owner, lease_ms, ttl_ms)

    async def guard_first(i: int) -> None:
        async with aguard(store, f"gaguard.first:{i}", payload=PAYLOAD) as call:
            if not call.replayed:
                call.save(RESULT)

    async def guard_replay(i: int) -> None:
        async with aguard(store, "glide-replay", payload=PAYLOAD) as call:
            if not call.replayed:
                raise AssertionError("gaguard.replay did not replay")
            call.result  # noqa: B018 - the decoded value is part of a replay's cost

    g = "glide.ping"
    cases = [
        Case("glide.ping", "redis", ping, is_async=True, ping=g, note="PING round trip (glide)"),
        Case("gfloor.first", "floor", floor_first, is_async=True, ping=g,
             note="bare invoke_script claim + complete (glide)"),
        Case("gfloor.replay", "floor", floor_replay, is_async=True, ping=g,
             note="bare invoke_script claim (glide)", prepare=prepare_replay),
        Case("gaguard.first", "idemkey", guard_first, is_async=True, floor="gfloor.first",
             ping=g, note="aguard() on glide: claim, save, complete"),
        Case("gaguard.replay", "idemkey", guard_replay, is_async=True, floor="gfloor.replay",
             ping=g, note="aguard() on glide: replay, decoded"),
    ]  # fmt: skip
    return cases, client, None


_LATENCY_ROWS = (
    ("PING", "aredis.ping", "glide.ping"),
    ("bare floor, first call", "afloor.first", "gfloor.first"),
    ("bare floor, replay", "afloor.replay", "gfloor.replay"),
    ("aguard(), first call", "aguard.first", "gaguard.first"),
    ("aguard(), replay", "aguard.replay", "gaguard.replay"),
)


async def inprocess_throughput(
    stores: dict[str, AsyncRedisStore], slices: int, seconds: float
) -> dict[str, list[float]]:
    """First calls per second of 64 asyncio tasks calling ``aguard`` on fresh keys in this
    process (no HTTP), for each store, the stores taking turns slice by slice."""

    async def drive(store: AsyncRedisStore, label: str) -> float:
        count, deadline = 0, time.perf_counter() + seconds

        async def caller(c: int) -> None:
            nonlocal count
            i = 0
            while time.perf_counter() < deadline:
                i += 1
                async with aguard(store, f"{label}:{c}:{i}", payload=PAYLOAD) as call:
                    if not call.replayed:
                        call.save(RESULT)
                count += 1

        start = time.perf_counter()
        await asyncio.gather(*(caller(c) for c in range(CLIENTS)))
        return count / (time.perf_counter() - start)

    runs: dict[str, list[float]] = {name: [] for name in stores}
    for i in range(slices):
        for name, store in stores.items():
            runs[name].append(await drive(store, f"inproc-{name}-{i}"))
    return runs


def format_glide(cases: dict[str, Any], tp: dict[str, Any] | None) -> list[str]:
    """The latency table (redis.asyncio beside glide, p50) and the glide throughput rows."""
    lines = ["Single call, p50 (one caller; interleaved):", "",
             "| call | redis.asyncio | valkey-glide |", "|---|---:|---:|"]  # fmt: skip
    for label, redis_name, glide_name in _LATENCY_ROWS:
        a, b = cases.get(redis_name), cases.get(glide_name)
        if a and b:
            lines.append(f"| {label} | {a['p50'] / 1000:.0f} us | {b['p50'] / 1000:.0f} us |")
    if tp and tp.get("glide_rps") is not None:
        lines += ["", f"Throughput, {tp['clients']} clients ({tp['server']}, median of "
                      f"{tp['slices']} x {tp['slice_seconds']:g} s), req/s:", "",
                  "| app alone | app + redis-py floor | idemkey, redis-py | app + glide floor "
                  "| idemkey, glide | glide / redis-py floor |",
                  "|---:|---:|---:|---:|---:|---:|",
                  f"| {tp['plain_rps']:.0f} | {tp['floor_rps']:.0f} | {tp['idemkey_rps']:.0f} "
                  f"| {tp['glide_floor_rps']:.0f} | {tp['glide_rps']:.0f} "
                  f"| {ratio(tp['glide_ratio_to_floor'])}x |"]  # fmt: skip
    target = glide_throughput_target(tp)
    if target:
        lines += ["", f"- {'ok  ' if target['ok'] else 'MISS'} {target['target']}: "
                      f"{target['measured']}"]  # fmt: skip
    return lines


async def _run(url: str, rounds: int, slices: int, seconds: float) -> dict[str, Any]:
    from .extra import throughput

    prefix = "idemkey-bench-" + secrets.token_hex(4)
    warmup = max(30, rounds // 10)
    client, aclient = redis.Redis.from_url(url), redis.asyncio.Redis.from_url(url)
    ctx = Context(client, aclient, prefix, warmup + rounds + 1)
    glide_client = None
    try:
        found, glide_client, why = await glide_cases(ctx, url)
        if why is not None:
            raise SystemExit(f"error: {why}")
        wanted = {name for _, *names in _LATENCY_ROWS for name in names}
        cases = [c for c in core_cases(ctx) + found if c.name in wanted]
        await prepare_all(cases)
        print(f"running {warmup} + {rounds} rounds of {len(cases)} cases...", file=sys.stderr)
        samples = await run_interleaved(cases, rounds, warmup=warmup, first_index=1)
        stores = {
            "redis.asyncio": AsyncRedisStore(aclient, ctx.policy),
            "glide": AsyncRedisStore(glide_client, ctx.policy),
        }
        ctx.stores += stores.values()
        inproc = await inprocess_throughput(stores, slices=3, seconds=2.0)
        tp = await throughput(ctx, url, slices=slices, seconds=seconds)
        return {"cases": build_cases(cases, samples, {}), "inprocess": inproc, "throughput": tp}
    finally:
        await ctx.close()
        if glide_client is not None:
            await glide_client.close()
        for key in client.scan_iter(match=f"*{prefix}*", count=1000):
            client.delete(key)
        client.close()
        await aclient.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.glide_bench", description=__doc__)
    p.add_argument("--redis-url", help="use this Redis (default: start a private redis-server)")
    p.add_argument("--rounds", type=int, default=2000, help="timed latency rounds")
    p.add_argument("--slices", type=int, default=5, help="throughput slices per app")
    p.add_argument("--throughput-seconds", type=float, default=1.0, help="one slice's length")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = p.parse_args(argv)
    try:
        with redis_url(args.redis_url) as url:
            doc = asyncio.run(_run(url, args.rounds, args.slices, args.throughput_seconds))
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tp = doc["throughput"] if isinstance(doc["throughput"], dict) else None
    if tp is None:
        print(f"throughput skipped: {doc['throughput']}", file=sys.stderr)
    print("\n".join(format_glide(doc["cases"], tp)))
    pairs = zip(doc["inprocess"]["redis.asyncio"], doc["inprocess"]["glide"], strict=True)
    print(f"\nIn one process, {CLIENTS} asyncio tasks calling aguard (first calls/s), "
          "redis.asyncio / glide per 2 s slice: "
          + ", ".join(f"{a:.0f} / {b:.0f} ({b / a:.2f}x)" for a, b in pairs))  # fmt: skip
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
    target = glide_throughput_target(tp)
    return 0 if target is None or target["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
