"""Where a WSGI replay's time goes: idemkey's replay against the least a correct one must do.

``python -m benchmarks.least`` (a private ``redis-server``, or ``--redis-url``) times, in one
interleaved run with the same cache disturbance before every call (1 MiB touched, some
unrelated Python), so every row is equally cold:

* ``floor``: the bare floor, one ``execute_command("EVALSHA", claim, ...)``;
* ``plain``: the WSGI app alone (it reads the body and answers);
* ``idemkey``: the same app behind :class:`~idemkey.adapters.wsgi.IdempotencyMiddleware`,
  replaying one record;
* ``least``: a hand-written WSGI replay of the same record that does only what no correct
  replay can skip: read the key and the body, name the record (``record_for``: BLAKE2b),
  fingerprint the request (``fingerprint``: xxh3), send the claim on the store's own lean
  path, decode the stored response (msgspec) and send it marked ``Idempotent-Replayed``. No
  key validation, no scope, no state machine, no events, no origin, no CORS: not a product,
  a measure.

Each is printed as "added over the app alone x floor", the suite's HTTP column. What
``idemkey`` costs over ``least`` is idemkey's own structure (the checks and the layers a
replay passes through), not Redis, the network or the work a replay needs: benchmarks/
RESULTS.md quotes it for issue 39.

``--stages`` adds, in the same run, ``checks`` (:func:`checks_for`: idemkey's replay without
its layers, every check through idemkey's own function in one function: what ``idemkey`` costs
over it is the Exchange, its transitions, the driver and ``store.claim``), and the least replay
with one piece of idemkey's before it
(``request_of``: the request view; ``scope``: it and the default scope; ``record_for``: a
second record name; ``fingerprint``: the view and ``request_fingerprint``; ``begin``: the view
and ``begin``, which builds the Exchange), each printed as what it adds to the least replay x
floor: the cold cost of that piece alone.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import redis

from idemkey import Policy, RedisStore
from idemkey._codec import StoredResponse
from idemkey._core import (
    fingerprint,
    new_owner,
    record_for,
)
from idemkey.adapters._environ import request_of
from idemkey.adapters.wsgi import IdempotencyMiddleware
from idemkey.http import begin
from idemkey.http._fingerprint import request_fingerprint
from idemkey.http._scope import NO_CREDENTIALS, credential_scope

from .http_apps import plain_wsgi as plain
from .httpcases import wsgi_environ
from .servers import redis_url
from .short_probe import wsgi_probe

__all__ = ["main"]

_PREFIX = "least"
_DECODER = msgspec.msgpack.Decoder(StoredResponse)
_REPLAY = 2  # claim.lua's tag of a replay


def _start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
    return None


def _call(app: Callable[..., Any]) -> None:
    for _ in app(wsgi_environ("/orders", "seed"), _start_response):
        pass


def least_for(store: RedisStore) -> Callable[..., list[bytes]]:
    """The least replay, on ``store``'s own script call (the lean path on redis-py)."""
    sha, evalsha = store._scripts["claim"].sha, store._evalsha
    lease_ms, ttl_ms = store.policy.lease_ms, store.policy.ttl_ms

    def least(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        key = environ["HTTP_IDEMPOTENCY_KEY"]
        body = environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))
        record = record_for(_PREFIX, NO_CREDENTIALS, "POST", "/orders", key)
        sent = fingerprint("POST", "/orders", "", environ["CONTENT_TYPE"], body)
        reply = evalsha(sha, (record.record_key, sent, new_owner(), lease_ms, ttl_ms, 0, 0, "0"))
        if reply[0] != _REPLAY:
            raise SystemExit(f"least: the claim did not replay: {reply!r:.100}")
        stored = _DECODER.decode(memoryview(reply[1])[1:])
        start_response(
            f"{stored.status} Created", [*stored.headers, ("Idempotent-Replayed", "true")]
        )
        return [stored.body]

    return least


_JUNK = bytearray(1 << 20)


def checks_for(store: RedisStore) -> Callable[..., list[bytes]]:
    """idemkey's replay without its layers: every check the middleware makes on a replay,
    each through idemkey's own function (the key's grammar, the default scope, the record's
    name, the bounded body, the fingerprint as the policy says, the owner and the origin, the
    claim reply's and the stored response's decoding, the replay's headers, the WSGI status
    line), written as one function: no ``Exchange``, no transitions, no driver, no
    ``store.claim``. What ``idemkey`` costs over it is the layers'; what it costs over
    ``least`` is the checks'."""
    return wsgi_probe(store, _not_a_replay)


def _not_a_replay(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    raise SystemExit("checks: the request did not replay (its body refused, or its claim won)")


def _disturb() -> None:
    junk = _JUNK
    for i in range(0, len(junk), 64):
        junk[i] = (junk[i] + 1) & 255
    sorted(str(i) for i in range(500))


def stages(policy: Policy) -> dict[str, Callable[[dict[str, Any]], object]]:
    """The pieces ``--stages`` puts before the least replay, one row each."""
    return {
        "request_of": lambda environ: request_of(environ),
        "scope": lambda environ: credential_scope(request_of(environ)),
        "record_for": lambda environ: record_for(
            "stage", "scope", "POST", "/orders", environ["HTTP_IDEMPOTENCY_KEY"]
        ),
        "fingerprint": lambda environ: request_fingerprint(policy, request_of(environ), b"{}"),
        "begin": lambda environ: begin(policy, request_of(environ)),
    }


def _after(piece: Callable[[dict[str, Any]], object], app: Callable[..., Any]) -> Any:
    def staged(environ: dict[str, Any], start_response: Any) -> Any:
        piece(environ)
        return app(environ, start_response)

    return staged


def measure(url: str, rounds: int, seed: int, with_stages: bool = False) -> dict[str, float]:
    """p50 us of each row, ``rounds`` interleaved rounds after 100 untimed ones."""
    client = redis.Redis.from_url(url)
    policy = Policy(prefix=_PREFIX, ttl=900.0, lease=30.0)
    store = RedisStore(client, policy)
    guarded = IdempotencyMiddleware(plain, store)
    _call(guarded)  # the record the rows replay
    sha = store._scripts["claim"].sha
    rows: dict[str, Callable[[], object]] = {
        "floor": lambda: client.execute_command(
            "EVALSHA", sha, 1, f"{_PREFIX}:floor", "fp", "owner", 30000, 900000
        ),
        "plain": lambda: _call(plain),
        "idemkey": lambda: _call(guarded),
    }
    least = least_for(store)
    rows["least"] = lambda: _call(least)
    if with_stages:
        checks = checks_for(store)
        rows["checks"] = lambda: _call(checks)
        for name, piece in stages(policy).items():
            staged = _after(piece, least)
            rows[f"+{name}"] = lambda staged=staged: _call(staged)
    samples: dict[str, list[int]] = {name: [] for name in rows}
    order = list(rows)
    rng = random.Random(seed)
    clock = time.perf_counter_ns
    for r in range(100 + rounds):
        rng.shuffle(order)
        for name in order:
            _disturb()
            t0 = clock()
            rows[name]()
            elapsed = clock() - t0
            if r >= 100:
                samples[name].append(elapsed)
    store.close()
    return {name: statistics.median(values) / 1000 for name, values in samples.items()}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.least", description=__doc__.split("\n")[0]
    )
    p.add_argument("--redis-url", help="use this Redis (default: start a private redis-server)")
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--stages", action="store_true", help="also time each piece alone")
    args = p.parse_args(argv)
    pieces = list(stages(Policy())) if args.stages else []
    with redis_url(args.redis_url) as url:
        checks = " checks: added x floor |" if args.stages else ""
        print("| run | floor us | app alone us | idemkey: added x floor | least: added x floor |"
              + checks + "".join(f" +{name} |" for name in pieces))  # fmt: skip
        print("|---:|---:|---:|---:|---:|" + "---:|" * (len(pieces) + bool(checks)))
        for run in range(1, args.runs + 1):
            p50 = measure(url, args.rounds, run, args.stages)
            floor, alone, least = p50["floor"], p50["plain"], p50["least"]
            added = "".join(f" {(p50['+' + name] - least) / floor:.3f} |" for name in pieces)
            if checks:
                added = f" {(p50['checks'] - alone) / floor:.2f} |" + added
            print(f"| {run} | {floor:.1f} | {alone:.1f} | {(p50['idemkey'] - alone) / floor:.2f} "
                  f"| {(least - alone) / floor:.2f} |{added}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
