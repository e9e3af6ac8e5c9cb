"""``python -m benchmarks`` / ``nox -s bench`` / ``idemkey bench``: the latency-budget suite.

::

    python -m benchmarks                      # full run on a private redis-server
    python -m benchmarks --quick              # core cases, 300 rounds: a few seconds, for CI
    python -m benchmarks --quick --effects    # and fenced SQL effects, effects= on and off
    python -m benchmarks --redis-url redis://127.0.0.1:6379/0 --json out.json --plot out.png
    python -m benchmarks --quick --budget 'miss<=1.15xfloor,replay<=1.15xfloor,replay:p99<=2ms'

Exit status: 0 all budgets held, 1 a budget was exceeded (or its case not measured), 2 bad
arguments or no Redis, 130 interrupted (SIGINT, Ctrl-C), 143 terminated (SIGTERM): either
stops the run at once and leaves no redis-server and no temporary directory behind. All cases
run in one interleaved run (see ``runner.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from types import FrameType
from typing import Any

import redis
import redis.asyncio

import idemkey

from .budget import Budget, BudgetError, check_budgets, parse_budgets
from .cases import Case, Context, core_cases, naive_cases
from .extra import memory_per_record, throughput
from .httpcases import HttpBench
from .peers import idemkit_cases, powertools_cases
from .report import build_cases, check_scale_targets, check_targets, format_report, plot
from .roundtrips import count_round_trips, counting_clients
from .runner import STOP, Interrupted, prepare_all, run_interleaved
from .servers import ServerError, redis_url

__all__ = ["Interrupted", "interruptible", "main"]

QUICK_ROUNDS = 300
FULL_ROUNDS = 3000
ROUND_TRIP_CALLS = 20


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="idemkey latency-budget suite: every case in one interleaved run.",
    )
    p.add_argument("--redis-url", help="use this Redis (default: start a private redis-server)")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"core cases only, {QUICK_ROUNDS} rounds (a few seconds; for CI)",
    )
    p.add_argument("--rounds", type=int, help=f"timed rounds (default {FULL_ROUNDS})")
    p.add_argument("--warmup", type=int, help="untimed rounds first (default rounds/10, >= 30)")
    p.add_argument("--budget", action="append", default=[], metavar="BUDGETS",
                   help="e.g. 'miss<=1.15xfloor,replay<=1.15xfloor' or 'replay:p99<=2ms'; "
                        "repeatable; exit 1 when one is exceeded")  # fmt: skip
    p.add_argument(
        "--effects",
        action="store_true",
        help="also time fenced SQL effects (SQLite) with effects= on and off (needs [sql])",
    )
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of the latency distributions")
    p.add_argument(
        "--no-http-servers",
        action="store_true",
        help="skip the gunicorn/uvicorn cases (in-process adapter cases still run)",
    )
    p.add_argument("--throughput-seconds", type=float, default=1.0,
                   help="length of one throughput slice (5 slices per app)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="seed of the per-round case order")
    return p


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into :class:`Interrupted`, raised at once, for this block.

    Without it the first Ctrl-C only cancels asyncio.run's main task, which any library that
    swallows one cancellation (a timeout racing the reply) ignores; and SIGTERM kills Python
    before a finally block runs, leaving the private redis-server and its directory behind.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread; a caller elsewhere keeps its own
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        STOP.signum = signum
        if not STOP.deferred:  # the interleaved rounds raise it themselves, between rounds
            raise Interrupted(signum)

    STOP.signum = None

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _progress(total: int) -> Callable[[int], None]:
    """A line on stderr each time another tenth of the ``total`` rounds is done."""
    shown = 0

    def show(done: int) -> None:
        nonlocal shown
        tenth = done * 10 // total
        if tenth > shown:
            shown = tenth
            print(f"  round {done} of {total} ({tenth * 10}%)", file=sys.stderr, flush=True)

    return show


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite; returns the exit status (see the module docstring)."""
    try:
        with interruptible():
            return _main(argv)
    except Interrupted as exc:  # every finally has run: servers stopped, keys purged
        print(f"interrupted by {exc}: stopped", file=sys.stderr)
        return 128 + exc.signum


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    argv = list(argv) if argv is not None else sys.argv[1:]
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed by argparse
        return int(exc.code or 0)
    budgets: list[Budget] = []
    try:
        for text in args.budget:
            budgets += parse_budgets(text)
    except BudgetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else FULL_ROUNDS)
    if rounds < 1 or (args.warmup is not None and args.warmup < 0):
        print("error: --rounds must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    warmup = args.warmup if args.warmup is not None else max(30, rounds // 10)

    try:
        with redis_url(args.redis_url) as url:
            try:
                doc, samples, cases = asyncio.run(_run(args, url, rounds, warmup))
                doc["meta"]["command"] = command_line(argv, args.redis_url)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                print(f"error: cannot reach Redis at {_redact(url)}: {exc}", file=sys.stderr)
                return 2
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    # Own CPU in a warm loop: outside the event loop (the async paths run one of their own).
    # Imported here: `python -m benchmarks.profile` must not find it imported by the package.
    from .profile import warm_cpu

    doc["cpu_warm"] = warm_cpu(2_000 if args.quick else 10_000, 3 if args.quick else 7)
    doc["targets"] = check_targets(doc["cases"], doc["skipped"], doc["cpu_warm"])
    doc["targets"] += check_scale_targets(doc)
    verdicts = check_budgets(budgets, doc["cases"], doc["skipped"])
    doc["budgets"] = [
        {"budget": v.budget.text, "check": v.budget.describe(), "ok": v.ok, "detail": v.detail}
        for v in verdicts
    ]
    print(format_report(doc))
    if args.plot:
        why = plot(args.plot, samples, cases)
        if why:
            print(f"plot skipped: {why}", file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
    return 0 if all(v.ok for v in verdicts) else 1


def command_line(argv: Sequence[str], redis_url: str | None) -> str:
    """The command line as the results file keeps it, ``--redis-url``'s password as ``***``:
    the file is made to be kept and shared. ``redis_url``: the value argparse read, found
    again as its own word or after ``=`` (``--redis-url=URL``, or a prefix argparse accepts:
    ``--redis URL``)."""
    words = ["python -m benchmarks"]
    for word in argv:
        option, equals, value = word.partition("=")
        if redis_url is not None and word == redis_url:
            word = _redact(word)
        elif redis_url is not None and equals and option.startswith("--") and value == redis_url:
            word = f"{option}={_redact(value)}"
        words.append(word)
    return " ".join(words)


def _redact(url: str) -> str:
    """``url`` as the idemkey commands print it, password hidden (the CLI's own function;
    imported here, not with the package: the apps the suite serves import it too)."""
    from idemkey.store._url import redacted

    return redacted(url)


async def _run(
    args: argparse.Namespace, url: str, rounds: int, warmup: int
) -> tuple[dict[str, Any], dict[str, list[int]], list[Case]]:
    prefix = "idemkey-bench-" + secrets.token_hex(4)
    total = ROUND_TRIP_CALLS + 1 + warmup + rounds
    admin = redis.Redis.from_url(url)
    client = redis.Redis.from_url(url)
    aclient = redis.asyncio.Redis.from_url(url)
    ctx = Context(client, aclient, prefix, total)
    http: HttpBench | None = None
    glide_client: Any = None
    skipped: dict[str, str] = {}
    try:
        admin.ping()
        # 1. Round trips and commandstats, on counting clients, before any timing.
        cclient, caclient, _ = counting_clients(url)
        cctx = Context(cclient, caclient, prefix, total)
        counted = core_cases(cctx) if args.quick else core_cases(cctx) + naive_cases(cctx)
        if not args.quick:
            counted += _peers(cctx, {})
        counted = [c for c in counted if c.group != "cpu"]
        await prepare_all(counted)
        cclient.ping()
        await caclient.ping()
        round_trips = await count_round_trips(counted, admin, ROUND_TRIP_CALLS)
        await cctx.close()
        cclient.close()
        await caclient.aclose()

        # 2. The interleaved run.
        cases = core_cases(ctx)
        if not args.quick:
            cases += naive_cases(ctx)
            cases += _peers(ctx, skipped)
            http = HttpBench(ctx, url, real_http=not args.no_http_servers)
            cases += await http.cases()
            skipped.update(http.skipped)
            # Imported here: `python -m benchmarks.glide_bench` must not find it imported.
            from .glide_bench import glide_cases

            found, glide_client, why = await glide_cases(ctx, url)
            cases += found
            if why is not None:
                skipped["glide"] = why
        if args.effects:
            from .effects import effects_cases

            cases += effects_cases(ctx)
        await prepare_all(cases)
        print(f"running {warmup} + {rounds} rounds of {len(cases)} cases...", file=sys.stderr)
        samples = await run_interleaved(
            cases,
            rounds,
            warmup=warmup,
            first_index=ROUND_TRIP_CALLS + 1,
            seed=args.seed,
            progress=_progress(warmup + rounds),
        )
        if http is not None:
            http.close()
            http = None

        # 3. Throughput and memory (full runs only).
        tp: dict[str, Any] | str | None = None
        memory: list[dict[str, Any]] = []
        compressed: dict[str, Any] | None = None
        cost: dict[str, Any] | None = None
        if not args.quick:
            tp = await throughput(ctx, url, slices=5, seconds=args.throughput_seconds)
            if isinstance(tp, str):
                skipped["throughput"] = tp
                tp = None
            memory = memory_per_record(ctx, client)
            from .compression import compression  # not at the top: see report.py

            compressed = compression(client, prefix)
            if args.redis_url is None:  # CONFIG RESETSTAT: only on the suite's own server
                # Imported here: `python -m benchmarks.record_cost` must not find it imported.
                from .record_cost import server_time

                cost = server_time(admin, prefix)

        doc_cases = build_cases(cases, samples, round_trips)
        doc: dict[str, Any] = {
            "meta": _meta(admin, url, args, rounds, warmup, exact=args.redis_url is None),
            "cases": doc_cases,
            "skipped": skipped,
            "throughput": tp,
            "memory": memory,
            "compression": compressed,
            "server_time": cost,
        }
        return doc, samples, cases
    finally:
        if http is not None:
            http.close()
        await ctx.close()
        if glide_client is not None:
            await glide_client.close()
        _purge(admin, prefix)
        admin.close()
        client.close()
        await aclient.aclose()


def _peers(ctx: Context, skipped: dict[str, str]) -> list[Case]:
    cases: list[Case] = []
    for name, build in (("powertools", powertools_cases), ("idemkit", idemkit_cases)):
        found, why = build(ctx)
        if why is not None:
            skipped[name] = why
        cases += found
    return cases


def _purge(admin: redis.Redis, prefix: str) -> None:
    """Delete every key this run wrote (they all contain its prefix); best effort."""
    try:
        batch: list[bytes] = []
        for key in admin.scan_iter(match=f"*{prefix}*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                admin.unlink(*batch)
                batch.clear()
        if batch:
            admin.unlink(*batch)
    except redis.RedisError:
        pass


def _meta(
    admin: redis.Redis, url: str, args: argparse.Namespace, rounds: int, warmup: int, exact: bool
) -> dict[str, Any]:
    try:
        import hiredis

        hiredis_version: str | None = hiredis.__version__
    except ImportError:
        hiredis_version = None
    server_info = admin.info("server")
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "idemkey": idemkey.__version__,
        "python": platform.python_version(),
        "redis_py": redis.__version__,
        "hiredis": hiredis_version,
        "redis_version": server_info.get("redis_version"),
        "redis": "private redis-server" if exact else "external (--redis-url)",
        "commandstats_exact": exact,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "rounds": rounds,
        "warmup": warmup,
        "quick": bool(args.quick),
    }
