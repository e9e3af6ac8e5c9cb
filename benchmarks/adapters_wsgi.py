"""What the WSGI middleware and the Flask extension add to a request, as multiples of a Redis
PING in the same run.

::

    python -m benchmarks.adapters_wsgi                  # private redis-server on a free port
    python -m benchmarks.adapters_wsgi --rounds 5000 --redis-url redis://127.0.0.1:6400/0

Cases, interleaved round by round in a fresh random order (a noisy neighbour slows all alike):

* ``ping``: one PING, the network's unit;
* ``floor.first`` / ``floor.replay``: DESIGN.md section 8's bare floor, idemkey's scripts sent
  as bare EVALSHA with precomputed arguments (claim + complete; one claim);
* ``<app>.bare``: the app alone, called in-process through WSGI (no server, no socket);
* ``<app>.first`` / ``<app>.replay``: the same app guarded by idemkey, a fresh key every round
  / one completed key.

Apps: ``raw`` (a bare PEP 3333 callable behind ``IdempotencyMiddleware``, so only the
middleware's cost shows) and ``flask`` (one view, without and with ``@idem.idempotent``).
The report gives each case's p50 and mean, and the added latency (guarded minus bare, by p50)
as a multiple of the PING and of the floor.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import redis

from idemkey import Policy, RedisStore
from idemkey._codec import StoredResponse, encode_response
from idemkey._core import Record, fingerprint, new_owner, record_for
from idemkey.adapters.wsgi import IdempotencyMiddleware
from idemkey.store import SCRIPTS

BODY = b'{"invoice":"inv_42","amount":1999,"currency":"eur","customer":"cus_9"}'
ANSWER = b'{"id":"ch_3Mtw","status":"succeeded","amount":1999}'
HEADERS = [("Content-Type", "application/json"), ("Content-Length", str(len(ANSWER)))]
STORED = encode_response(StoredResponse(201, (("content-type", "application/json"),), ANSWER))


def raw_app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))
    start_response("201 Created", HEADERS)
    return [ANSWER]


def flask_apps(store: RedisStore) -> tuple[Any, Any]:
    """The same Flask view twice: alone, and guarded by the extension."""
    from flask import Flask, Response, request

    from idemkey.adapters.flask import Idemkey

    def view() -> Response:
        request.get_data()
        return Response(ANSWER, 201, content_type="application/json")

    bare = Flask("bare")
    bare.add_url_rule("/charges", "charges", view, methods=["POST"])
    guarded = Flask("guarded")
    idem = Idemkey(guarded, store=store)
    guarded.add_url_rule("/charges", "charges", idem.idempotent(view), methods=["POST"])
    return bare, guarded


def environ(key: str) -> dict[str, Any]:
    return {
        "REQUEST_METHOD": "POST",
        "SCRIPT_NAME": "",
        "PATH_INFO": "/charges",
        "QUERY_STRING": "",
        "SERVER_NAME": "api.example",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "HTTP_HOST": "api.example",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(BODY)),
        "HTTP_IDEMPOTENCY_KEY": key,
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(BODY),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }


def start_response(status: str, headers: Any, exc_info: Any = None) -> Any:
    if not status.startswith("201"):
        raise RuntimeError(f"unexpected status {status}")
    return None


def call(app: Any, key: str) -> None:
    """Play the server: call, drain the body, close."""
    result = app(environ(key), start_response)
    try:
        for _ in result:
            pass
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()


Run = Callable[[int], None]


def cases(client: Any, store: RedisStore, shas: dict[str, str], rounds: int) -> dict[str, Run]:
    policy = store.policy
    lease_ms, ttl_ms = policy.lease_ms, policy.ttl_ms
    fp = fingerprint("POST", "/floor", "", "application/json", BODY)
    fresh = [floor_record(policy, f"floor-{i}") for i in range(rounds)]
    done = floor_record(policy, "floor-replay")

    def ping(i: int) -> None:
        client.execute_command("PING")

    def floor_first(i: int) -> None:
        key, lock = fresh[i].key, fresh[i].lock
        owner = new_owner()
        client.execute_command("EVALSHA", shas["claim"], 2, key, lock, fp, owner, lease_ms, ttl_ms)
        client.execute_command("EVALSHA", shas["complete"], 2, key, lock, owner, STORED, ttl_ms)

    def floor_replay(i: int) -> None:
        client.execute_command(
            "EVALSHA", shas["claim"], 2, done.key, done.lock, fp, "x", lease_ms, ttl_ms
        )

    runs: dict[str, Run] = {"ping": ping, "floor.first": floor_first, "floor.replay": floor_replay}
    flask_bare, flask_guarded = flask_apps(store)
    apps = {
        "raw": (raw_app, IdempotencyMiddleware(raw_app, store)),
        "flask": (flask_bare, flask_guarded),
    }
    for name, (bare_app, guarded_app) in apps.items():

        def bare(i: int, app: Any = bare_app, name: str = name) -> None:
            call(app, f"{name}-bare-{i}")

        def first(i: int, app: Any = guarded_app, name: str = name) -> None:
            call(app, f"{name}-first-{i}")

        def replay(i: int, app: Any = guarded_app, name: str = name) -> None:
            call(app, f"{name}-replay")

        runs[f"{name}.bare"], runs[f"{name}.first"], runs[f"{name}.replay"] = bare, first, replay
    return runs


def floor_record(policy: Policy, key: str) -> Record:
    return record_for(policy.prefix, "bench", "POST", "/floor", key)


def measure(url: str, rounds: int, warmup: int, seed: int) -> dict[str, list[int]]:
    client = redis.Redis.from_url(url, decode_responses=False)
    prefix = "bench-wsgi-" + uuid.uuid4().hex[:8]
    store = RedisStore(client, Policy(prefix=prefix, ttl=900.0))
    try:
        shas = {name: client.script_load(text) for name, text in SCRIPTS.items()}
        shas = {k: v.decode() if isinstance(v, bytes) else v for k, v in shas.items()}
        runs = cases(client, store, shas, warmup + rounds)
        # The replay cases need a completed record before timing starts.
        for name in ("raw", "flask"):
            runs[f"{name}.replay"](0)
        record = floor_record(store.policy, "floor-replay")
        owner = new_owner()
        fp = fingerprint("POST", "/floor", "", "application/json", BODY)
        policy = store.policy
        args = (record.key, record.lock)
        client.execute_command(
            "EVALSHA", shas["claim"], 2, *args, fp, owner, policy.lease_ms, policy.ttl_ms
        )
        client.execute_command("EVALSHA", shas["complete"], 2, *args, owner, STORED, policy.ttl_ms)

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
                run(r)
                elapsed = clock() - t0
                if r >= warmup:
                    samples[name].append(elapsed)
        gc.unfreeze()
        return samples
    finally:
        store.close()
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.unlink(key)
        client.close()


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
    print("\nadded by idemkey (guarded p50 - bare p50):")
    for app in ("raw", "flask"):
        for kind in ("first", "replay"):
            added = p50[f"{app}.{kind}"] - p50[f"{app}.bare"]
            row = {"us": added / 1e3, "x_ping": added / ping, "x_floor": added / floors[kind]}
            out["added"][f"{app}.{kind}"] = row
            print(
                f"  {app + '.' + kind:<16}{row['us']:>8.1f} us = {row['x_ping']:.2f}x PING"
                f" = {row['x_floor']:.2f}x the bare floor ({kind})"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
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
        samples = measure(url, args.rounds, args.warmup, args.seed)
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
