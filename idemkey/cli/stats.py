"""``idemkey stats``: records by state, memory and TTLs, counted with SCAN (never KEYS)."""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Final

from .._core import LOCK_HINT, parse_record_name, record_pattern
from ..store._url import redacted
from ..store.diagnostics import _text as text
from ..store.status import (
    NAMED_FIELDS,
    lease_left_ms,
    pttl_ms,
    redirected,
    server_ms,
    status_fields,
)
from ._base import CliError, print_json
from ._progress import Progress
from ._redis import connect, key_count
from .readable import shown, size

HELP: Final = "records by state, memory and TTLs (SCAN, never KEYS)"

SCAN_COUNT: Final = 1000
#: When a prefix holds no record, stats looks for other prefixes in at most this many keys
#: per primary (SCAN pages of SCAN_COUNT), so the hint costs a bounded scan, never a full one.
OTHER_PREFIXES_SCAN: Final = 10_000
#: stats counts records per step name for at most this many names (names come from code, but a
#: name built from data would make one per record).
MAX_STEP_NAMES: Final = 50


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sample", type=int, default=1000, help="records measured with MEMORY USAGE per node"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress on stderr")


TTL_BUCKETS: Final = (
    ("< 1 min", 60_000),
    ("1 min - 1 h", 3_600_000),
    ("1 h - 6 h", 21_600_000),
    ("6 h - 24 h", 86_400_000),
    ("> 24 h", None),
)
STATES: Final = ("complete", "in_progress", "released", "other")


@dataclass
class Stats:
    prefix: str
    nodes: int = 0
    scanned: int = 0
    states: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATES, 0))
    lease_lapsed: int = 0
    ttl: dict[str, int] = field(
        default_factory=lambda: {**{name: 0 for name, _ in TTL_BUCKETS}, "no TTL": 0}
    )
    sampled: int = 0
    sampled_bytes: int = 0
    seconds: float = 0.0
    #: Only when no record is under ``prefix``: the prefixes of the records seen in a bounded
    #: scan, with their key counts, and how many keys that scan looked at.
    other_prefixes: dict[str, int] | None = None
    other_scanned: int = 0
    #: Records that keep finished steps (in progress, lapsed or released), how many steps they
    #: keep in all, and how many records keep each step name (at most MAX_STEP_NAMES names).
    with_steps: int = 0
    finished_steps: int = 0
    step_names: dict[str, int] = field(default_factory=dict)

    @property
    def mean_bytes(self) -> float:
        return self.sampled_bytes / self.sampled if self.sampled else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "nodes": self.nodes,
            "records": self.scanned,
            "states": self.states,
            "in_progress_lease_lapsed": self.lease_lapsed,
            "ttl": self.ttl,
            "memory": {
                "sampled": self.sampled,
                "mean_bytes": round(self.mean_bytes, 1),
                "total_bytes_estimate": round(self.mean_bytes * self.scanned),
            },
            "steps": {
                "records_with_steps": self.with_steps,
                "finished_steps": self.finished_steps,
                "names": self.step_names,
            },
            "seconds": round(self.seconds, 3),
            **(
                {
                    "other_prefixes": self.other_prefixes,
                    "other_prefixes_keys_scanned": self.other_scanned,
                }
                if self.other_prefixes is not None
                else {}
            ),
        }


def _bucket(ttl_ms: int) -> str:
    if ttl_ms < 0:
        return "no TTL"
    for name, upper in TTL_BUCKETS:
        if upper is None or ttl_ms < upper:
            return name
    raise AssertionError("unreachable")  # pragma: no cover


def collect_stats(
    nodes: Sequence[tuple[str, Any]],
    prefix: str,
    *,
    sample: int = 1000,
    progress: bool = True,
    rng: random.Random | None = None,
    cluster: Any = None,
) -> Stats:
    """Count records under ``prefix`` on every primary with SCAN (never KEYS).

    Memory is ``MEMORY USAGE`` of a uniform sample (reservoir) of at most ``sample`` records.
    ``cluster``: the cluster client of ``nodes``, which reads the keys a node redirects.
    """
    rng = rng or random.Random()
    stats = Stats(prefix, nodes=len(nodes))
    pattern = record_pattern(prefix)
    started = time.perf_counter()
    total = sum(key_count(client) for _, client in nodes)
    meter = Progress(total, progress)
    scanned_keys = 0
    for _, client in nodes:
        reservoir: list[bytes] = []
        seen_here = 0
        cursor = 0
        while True:
            cursor, keys = client.scan(cursor, match=pattern, count=SCAN_COUNT)
            # SCAN's COUNT is roughly the keys looked at (matching or not): progress is in those.
            scanned_keys += SCAN_COUNT
            if keys:
                _classify(client, keys, stats, cluster)
                for key in keys:
                    seen_here += 1
                    if len(reservoir) < sample:
                        reservoir.append(key)
                    else:
                        slot = rng.randrange(seen_here)
                        if slot < sample:
                            reservoir[slot] = key
            meter.update(min(scanned_keys, total), stats.scanned)
            if cursor == 0:
                break
        _measure(client, reservoir, stats)
    meter.done()
    if not stats.scanned:
        stats.other_prefixes, stats.other_scanned = other_prefixes(nodes)
    stats.seconds = time.perf_counter() - started
    return stats


def other_prefixes(
    nodes: Sequence[tuple[str, Any]], limit: int = OTHER_PREFIXES_SCAN, *, hints: bool = True
) -> tuple[dict[str, int], int]:
    """The prefixes of idemkey records among at most ``limit`` keys per primary (SCAN).

    Names are all it reads (``parse_record_name``): a record's hash and, unless not
    ``hints`` (``idemkey list``, which names prefixes that hold records), its hints.
    Returns the prefixes (most keys first) and the number of keys looked at.
    """
    found: dict[str, int] = {}
    looked = 0
    match = "*:{*}*" if hints else "*:{*}"
    for _, client in nodes:
        cursor, here = 0, 0
        while here < limit:
            cursor, keys = client.scan(cursor, match=match, count=SCAN_COUNT)
            here += SCAN_COUNT
            for key in keys:
                name = parse_record_name(key)
                if name is not None and (hints or not name.hint):
                    found[name.prefix] = found.get(name.prefix, 0) + 1
            if cursor == 0:
                break
        looked += min(here, key_count(client))
    return dict(sorted(found.items(), key=lambda item: (-item[1], item[0]))), looked


def _classify(client: Any, keys: Sequence[bytes], stats: Stats, cluster: Any = None) -> None:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, *NAMED_FIELDS)  # not the origin: stats counts, it shows no record
        pipe.pttl(key)
    pipe.execute_command("TIME")  # the lease is a deadline on the server's clock (claim.lua)
    replies = pipe.execute(raise_on_error=False)
    now_ms = server_ms(replies[-1])
    in_progress: list[bytes] = []
    stepped: list[bytes] = []
    elsewhere: list[bytes] = []  # ASK while their slot migrates, MOVED after a failover
    for i, key in enumerate(keys):
        reply, ttl = replies[2 * i], replies[2 * i + 1]
        if cluster is not None and redirected(reply, ttl):
            elsewhere.append(key)
            continue
        if not isinstance(reply, list) or isinstance(ttl, Exception):
            stats.states["other"] += 1  # not a hash's fields: a stranger's key under our prefix
            stats.scanned += 1
            continue
        if ttl == -2:
            continue  # expired between SCAN and now
        stats.scanned += 1
        fields = status_fields(reply)
        if fields.steps is not None:  # the count of finished steps (checkpoint.lua)
            stepped.append(key)
        state = text(fields.state)
        # "complete": written by idemkey before 0.2; reading 0.1 records: remove in 0.4.
        if state in ("complete", "in_progress"):
            stats.states[state] += 1
            if state == "in_progress" and fields.lease is not None:
                stats.lease_lapsed += lease_left_ms(fields.lease, -2, now_ms) <= 0
            elif state == "in_progress":
                in_progress.append(key)  # a claim written by 0.2: its lease is a lock string
        elif fields.fence is not None:
            stats.states["released"] += 1  # a released record keeps its fence
        elif fields.fingerprint is not None:
            stats.states["complete"] += 1  # only fp and resp: no state, no fence
        else:
            stats.states["other"] += 1
        stats.ttl[_bucket(pttl_ms(ttl))] += 1
    if in_progress:
        pipe = client.pipeline(transaction=False)
        for key in in_progress:  # reading 0.2 claims: remove in 0.4
            pipe.exists(key + LOCK_HINT.encode())
        stats.lease_lapsed += sum(1 for live in pipe.execute() if not live)
    if stepped:
        _count_steps(client, stepped, stats)
    if elsewhere:  # a cluster pipeline follows the redirects
        _classify(cluster, elsewhere, stats)


def _count_steps(client: Any, keys: Sequence[bytes], stats: Stats) -> None:
    """The finished steps of records that keep some, by name (HKEYS: names, not results)."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hkeys(key)
    for names in pipe.execute(raise_on_error=False):
        if not isinstance(names, list):
            continue
        steps = [text(name)[2:] for name in names if name[:2] == b"s:"]
        if not steps:
            continue
        stats.with_steps += 1
        stats.finished_steps += len(steps)
        for name in steps:
            if name in stats.step_names or len(stats.step_names) < MAX_STEP_NAMES:
                stats.step_names[name] = stats.step_names.get(name, 0) + 1


def _measure(client: Any, keys: Sequence[bytes], stats: Stats) -> None:
    if not keys:
        return
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.memory_usage(key, samples=0)  # every field, not an estimate from five
    for used in pipe.execute(raise_on_error=False):
        if isinstance(used, int):
            stats.sampled += 1
            stats.sampled_bytes += used


def _show_stats(stats: Stats, url: str, out: IO[str]) -> None:
    where = f"{stats.nodes} primaries" if stats.nodes > 1 else redacted(url)
    out.write(f'records under prefix "{stats.prefix}" on {where} ({stats.seconds:.2f} s)\n')
    for state, count in stats.states.items():
        if state == "other" and not count:
            continue
        note = ""
        if state == "in_progress" and stats.lease_lapsed:
            note = f"  ({stats.lease_lapsed} with a lapsed lease: crashed owners)"
        if state == "released":
            note = "  (only the fence left)"
        out.write(f"  {state:<12} {count:>9}{note}\n")
    out.write(f"  {'total':<12} {stats.scanned:>9}\n")
    if stats.sampled:
        out.write(f"memory (MEMORY USAGE of {stats.sampled} sampled records)\n")
        out.write(f"  {'mean':<12} {size(stats.mean_bytes):>9} per record\n")
        out.write(f"  {'total':<12} {size(stats.mean_bytes * stats.scanned):>9} (estimated)\n")
    if stats.with_steps:
        out.write(
            f"steps ({stats.with_steps} records keep {stats.finished_steps} finished steps)\n"
        )
        # Stored names (a field's, any writer's) and the prefixes below: printed escaped, as
        # inspect and list print them, so no escape sequence reaches the operator's terminal.
        for name, count in sorted(stats.step_names.items(), key=lambda item: -item[1]):
            out.write(f"  {shown(name):<12} {count:>9}\n")
    out.write("TTL left\n")
    for bucket, count in stats.ttl.items():
        if bucket == "no TTL" and not count:
            continue
        out.write(f"  {bucket:<12} {count:>9}\n")
    if stats.other_prefixes is not None:
        scanned = f"the {stats.other_scanned} keys scanned"
        if stats.other_prefixes:
            seen = ", ".join(
                f"{json.dumps(name)} ({n} keys)" for name, n in stats.other_prefixes.items()
            )
            out.write(
                f'no records under prefix "{stats.prefix}"; idemkey records under other prefixes '
                f"in {scanned}: {seen}; pass --prefix (Policy.prefix)\n"
            )
        else:
            where = f"in {scanned}" if stats.other_scanned else "(the database holds no key)"
            out.write(f"no idemkey records under any prefix {where}\n")


def run(args: argparse.Namespace, out: IO[str]) -> int:
    if args.sample < 0:
        raise CliError("--sample must be >= 0", 2)
    with connect(args.redis_url) as server:
        stats = collect_stats(
            server.nodes,
            args.prefix,
            sample=args.sample,
            progress=not args.no_progress,
            cluster=server.client if server.cluster else None,
        )
    if args.json:
        print_json(stats.as_dict(), out)
    else:
        _show_stats(stats, args.redis_url, out)
    return 0
