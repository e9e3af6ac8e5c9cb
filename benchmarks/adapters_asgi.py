"""What the ASGI middleware adds to a request, as multiples of a Redis PING in the same run.

::

    python -m benchmarks.adapters_asgi                  # private redis-server on a free port
    python -m benchmarks.adapters_asgi --rounds 5000 --redis-url redis://127.0.0.1:6400/0

Cases, interleaved round by round in a fresh random order (a noisy neighbour slows all alike):

* ``ping``: one async PING, the network's unit;
* ``floor.first`` / ``floor.replay``: DESIGN.md section 8's bare floor, idemkey's scripts sent
  as bare EVALSHA with precomputed arguments (claim + complete; one claim);
* ``<app>.bare``: the app alone, called in-process as a raw ASGI call (no server, no socket);
* ``<app>.first`` / ``<app>.replay``: the same app behind ``IdempotencyMiddleware``, a fresh key
  every round / one completed key.

Apps: ``raw`` (a bare ASGI callable, so only the middleware's cost shows) and ``starlette``.
The report gives each case's p50 and mean, and the added latency (guarded minus bare, by p50)
as a multiple of the PING and of the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio

from idemkey import AsyncRedisStore, Policy
from idemkey._codec import StoredResponse, encode_response
from idemkey._core import Record, fingerprint, new_owner, record_for
from idemkey.adapters.asgi import IdempotencyMiddleware
from idemkey.store import SCRIPTS

BODY = b'{"invoice":"inv_42","amount":1999,"currency":"eur","customer":"cus_9"}'
ANSWER = b'{"id":"ch_3Mtw","status":"succeeded","amount":1999}'
START = {
    "type": "http.response.start",
    "status": 201,
    "headers": [(b"content-type", b"application/json"), (b"content-length", b"52")],
}
FINAL = {"type": "http.response.body", "body": ANSWER, "more_body": False}
STORED = encode_response(StoredResponse(201, (("content-type", "application/json"),), ANSWER))


async def raw_app(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send(START)
    await send(FINAL)


def starlette_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request as StarletteRequest
    from starlette.responses import Response
    from starlette.routing import Route

    async def charge(request: StarletteRequest) -> Response:
        await request.body()
        return Response(ANSWER, 201, media_type="application/json")

    return Starlette(routes=[Route("/charges", charge, methods=["POST"])])


def scope(key: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/charges",
        "raw_path": b"/charges",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"api.example"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(BODY)).encode()),
            (b"idempotency-key", key.encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("api.example", 80),
    }


async def receive() -> dict[str, Any]:
    return {"type": "http.request", "body": BODY, "more_body": False}


async def send(message: Any) -> None:
    if message["type"] == "http.response.start" and message["status"] != 201:
        raise RuntimeError(f"unexpected status {message['status']}")


Run = Callable[[int], Awaitable[Any]]


def cases(client: Any, store: AsyncRedisStore, shas: dict[str, str], rounds: int) -> dict[str, Run]:
    policy = store.policy
    lease_ms, ttl_ms = policy.lease_ms, policy.ttl_ms

    fp = fingerprint("POST", "/floor", "", "application/json", BODY)
    fresh = [floor_record(policy, f"floor-{i}") for i in range(rounds)]
    done = floor_record(policy, "floor-replay")

    async def ping(i: int) -> None:
        await client.execute_command("PING")

    async def floor_first(i: int) -> None:
        key, lock = fresh[i].key, fresh[i].lock
        owner = new_owner()
        await client.execute_command(
            "EVALSHA", shas["claim"], 2, key, lock, fp, owner, lease_ms, ttl_ms
        )
        await client.execute_command(
            "EVALSHA", shas["complete"], 2, key, lock, owner, STORED, ttl_ms
        )

    async def floor_replay(i: int) -> None:
        await client.execute_command(
            "EVALSHA", shas["claim"], 2, done.key, done.lock, fp, "x", lease_ms, ttl_ms
        )

    runs: dict[str, Run] = {"ping": ping, "floor.first": floor_first, "floor.replay": floor_replay}
    for name, app in (("raw", raw_app), ("starlette", starlette_app())):
        guarded = IdempotencyMiddleware(app, store)
        bare_scopes = [scope(f"{name}-bare-{i}") for i in range(rounds)]
        first_scopes = [scope(f"{name}-first-{i}") for i in range(rounds)]
        replay_scope = scope(f"{name}-replay")

        def bare(i: int, app: Any = app, scopes: Any = bare_scopes) -> Awaitable[None]:
            return app(scopes[i], receive, send)  # type: ignore[no-any-return]

        def first(i: int, app: Any = guarded, scopes: Any = first_scopes) -> Awaitable[None]:
            return app(scopes[i], receive, send)  # type: ignore[no-any-return]

        def replay(i: int, app: Any = guarded, s: Any = replay_scope) -> Awaitable[None]:
            return app(dict(s), receive, send)  # type: ignore[no-any-return]

        runs[f"{name}.bare"], runs[f"{name}.first"], runs[f"{name}.replay"] = bare, first, replay
    return runs


async def measure(url: str, rounds: int, warmup: int, seed: int) -> dict[str, list[int]]:
    client = redis.asyncio.Redis.from_url(url, decode_responses=False)
    prefix = "bench-asgi-" + uuid.uuid4().hex[:8]
    store = AsyncRedisStore(client, Policy(prefix=prefix, ttl=900.0))
    try:
        shas = {name: await client.script_load(text) for name, text in SCRIPTS.items()}
        shas = {k: v.decode() if isinstance(v, bytes) else v for k, v in shas.items()}
        runs = cases(client, store, shas, warmup + rounds)
        # The replay cases need a completed record before timing starts: the floor's replay
        # record is completed by hand , the apps' by one request.
        for name in ("raw", "starlette"):
            await runs[f"{name}.replay"](0)
        await _complete(client, store.policy, shas, floor_record(store.policy, "floor-replay"))

        rng = random.Random(seed)
        order = list(runs.items())
        samples: dict[str, list[int]] = {name: [] for name in runs}
        clock = time.perf_counter_ns
        gc.collect()
        gc.freeze()
        for r in range(warmup + rounds):
            rng.shuffle(order)
            for name, run in order:
                t0 = clock()
                await run(r)
                elapsed = clock() - t0
                if r >= warmup:
                    samples[name].append(elapsed)
        gc.unfreeze()
        return samples
    finally:
        await store.aclose()
        async for key in client.scan_iter(match=f"{prefix}*", count=1000):
            await client.unlink(key)
        await client.aclose()


def floor_record(policy: Policy, key: str) -> Record:
    return record_for(policy.prefix, "bench", "POST", "/floor", key)


async def _complete(client: Any, policy: Policy, shas: dict[str, str], record: Record) -> None:
    fp = fingerprint("POST", "/floor", "", "application/json", BODY)
    owner = new_owner()
    args = (record.key, record.lock)
    await client.execute_command(
        "EVALSHA", shas["claim"], 2, *args, fp, owner, policy.lease_ms, policy.ttl_ms
    )
    await client.execute_command(
        "EVALSHA", shas["complete"], 2, *args, owner, STORED, policy.ttl_ms
    )


def report(samples: dict[str, list[int]]) -> dict[str, Any]:
    p50 = {name: statistics.median(values) for name, values in samples.items()}
    mean = {name: statistics.fmean(values) for name, values in samples.items()}
    ping = p50["ping"]
    floors = {"first": p50["floor.first"], "replay": p50["floor.replay"]}
    out: dict[str, Any] = {
        "cases": {n: {"p50_us": p50[n] / 1e3, "mean_us": mean[n] / 1e3} for n in samples},
        "added": {},
    }
    print(f"{'case':<18}{'p50 us':>10}{'mean us':>10}{'x ping':>9}")
    for name in samples:
        print(
            f"{name:<18}{p50[name] / 1e3:>10.1f}{mean[name] / 1e3:>10.1f}{p50[name] / ping:>9.2f}"
        )
    print("\nadded by the middleware (guarded p50 - bare p50):")
    for app in ("raw", "starlette"):
        for kind in ("first", "replay"):
            added = p50[f"{app}.{kind}"] - p50[f"{app}.bare"]
            row = {
                "us": added / 1e3,
                "x_ping": added / ping,
                "x_floor": added / floors[kind],
            }
            out["added"][f"{app}.{kind}"] = row
            print(
                f"  {app + '.' + kind:<16}{row['us']:>8.1f} us = {row['x_ping']:.2f}x PING"
                f" = {row['x_floor']:.2f}x the bare floor ({kind})"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--redis-url", help="a Redis to use (default: a private redis-server)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)

    server = None
    url = args.redis_url
    if url is None:
        from tests._servers import RedisServer

        server = RedisServer().start()
        url = server.url
    try:
        samples = asyncio.run(measure(url, args.rounds, args.warmup, args.seed))
    finally:
        if server is not None:
            server.close()
    results = report(samples)
    results["meta"] = {"rounds": args.rounds, "warmup": args.warmup, "python": sys.version}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
