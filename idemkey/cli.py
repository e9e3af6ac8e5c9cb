"""The ``idemkey`` command: the demo, and the tools an operator needs around the records.

::

    idemkey demo                      play the retry story against the demo payments app
    idemkey serve [--port N]          run the demo app for curl
    idemkey inspect KEY --scope S --route /charges     one record, decoded
    idemkey forget KEY ... [--yes] [--force]           delete one record
    idemkey stats                     records by state, memory, TTLs (SCAN, never KEYS)
    idemkey doctor                    is this Redis fit to hold idempotency records?
    idemkey bench -- ARGS             the benchmark suite (source checkouts)

Exit codes: 0 success; 1 a check failed (doctor FAIL, a demo step misbehaved, no such
record, forget refused); 2 bad arguments; 3 Redis unreachable or erroring; 70 a bug in
idemkey (``IDEMKEY_DEBUG=1`` shows its traceback); 130 interrupted.
Every error is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import IO, Any, Final, NoReturn
from urllib.parse import urlsplit, urlunsplit

from . import diagnostics
from ._codec import StoredResponse, decode_response, decode_value
from ._core import Record, parse_key, record_for
from .errors import IdemkeyError, InvalidKeyError, RecordFormatError

__all__ = ["CliError", "main"]

URL_ENV: Final = "IDEMKEY_REDIS_URL"
DEBUG_ENV: Final = "IDEMKEY_DEBUG"
GUARD_METHOD: Final = "GUARD"  # guard() records: method "GUARD", route "" (see guard.py)
PREVIEW_BYTES: Final = 120

#: stats prints progress on stderr when the database holds at least this many keys.
PROGRESS_THRESHOLD = 10_000
PROGRESS_EVERY = 10_000
PROGRESS_LOG_SECONDS = 2.0
SCAN_COUNT: Final = 1000

# Deletes one record and its lock atomically, so an in-progress record cannot be claimed between
# the check and the delete. An operator tool, off the hot path: inline rather than package data.
# KEYS[1] record hash, KEYS[2] lock; ARGV[1] "1" deletes an in-progress record too.
# Reply: {deleted keys, state} ({-1, state} when refused); state "" when the hash has none.
_FORGET_LUA: Final = """
local state = redis.call("HGET", KEYS[1], "state") or ""
if state == "in_progress" and ARGV[1] ~= "1" then
  return {-1, state}
end
return {redis.call("DEL", KEYS[1], KEYS[2]), state}
"""


class CliError(Exception):
    """An error the command reports as one line, with its exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so errors stay one line."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: {message} (see --help)")


# --------------------------------------------------------------------------------------------
# Connections
# --------------------------------------------------------------------------------------------


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***``, for printing."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass
class Server:
    """The client for a URL and, on a cluster, one plain client per primary."""

    url: str
    client: Any
    nodes: list[tuple[str, Any]]  # (host:port, redis.Redis) for every primary
    cluster: bool

    def close(self) -> None:
        self.client.close()


def _client_options() -> dict[str, Any]:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # Fail fast: redis-py's default retries would make an unreachable server hang for seconds.
    return {
        "socket_connect_timeout": 3.0,
        "socket_timeout": 15.0,
        "retry": Retry(NoBackoff(), 0),
        "decode_responses": False,
    }


@contextmanager
def connect(url: str | None) -> Iterator[Server]:
    """Connect to ``url`` (or ``$IDEMKEY_REDIS_URL``); a cluster gets a ``RedisCluster``."""
    import redis
    from redis.cluster import RedisCluster

    if not url:
        raise CliError(f"no Redis to talk to: pass --redis-url or set {URL_ENV}", 2)
    try:
        probe = redis.Redis.from_url(url, **_client_options())
    except ValueError as exc:
        raise CliError(f"bad --redis-url {redact(url)}: {exc}", 2) from exc
    try:
        cluster = _text(_info(probe, "cluster").get("cluster_enabled")) == "1"
    except redis.ResponseError:
        cluster = False  # INFO denied by an ACL: inspect and forget still work
    except BaseException:
        probe.close()
        raise
    if not cluster:
        server = Server(url, probe, [(_address(probe), probe)], False)
    else:
        probe.close()
        options = _client_options()
        options.pop("retry")  # RedisCluster handles its own retries across nodes
        client = RedisCluster.from_url(url, **options)
        primaries = client.get_primaries()  # type: ignore[no-untyped-call]
        nodes = [(f"{n.host}:{n.port}", n.redis_connection) for n in primaries]
        server = Server(url, client, nodes, True)
    try:
        yield server
    finally:
        server.close()


def _address(client: Any) -> str:
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def _info(client: Any, section: str | None = None) -> dict[str, Any]:
    info: dict[str, Any] = client.info(section) if section else client.info()
    return info


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def _print_json(data: object, out: IO[str]) -> None:
    json.dump(data, out, indent=2, sort_keys=False, default=str)
    out.write("\n")


def _duration(ms: int) -> str:
    """A PTTL as ``1d 2h 3m 4.5s``; negative answers mean none / no TTL."""
    if ms == -2:
        return "none"
    if ms == -1:
        return "no TTL (never expires)"
    seconds = ms / 1000
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            parts.append(f"{int(seconds // size)}{unit}")
            seconds %= size
    parts.append(f"{seconds:.1f}s" if not parts else f"{int(seconds)}s")
    return " ".join(parts)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def _preview(body: bytes, limit: int = PREVIEW_BYTES) -> str:
    """The start of a body: text when it decodes as UTF-8, escaped bytes otherwise."""
    head = body[:limit]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = repr(head)[2:-1]
    else:
        text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text + ("..." if len(body) > limit else "")


def _shorten(owner: str) -> str:
    return owner[:8] + "..." if len(owner) > 8 else owner


# --------------------------------------------------------------------------------------------
# inspect / forget
# --------------------------------------------------------------------------------------------


def _record(args: argparse.Namespace) -> Record:
    """The record named on the command line: by digest, or by key, scope, method and route."""
    prefix = args.prefix
    if args.digest:
        digest = args.digest.strip().lower()
        if not (len(digest) == 32 and all(c in "0123456789abcdef" for c in digest)):
            raise CliError("--digest must be the 32 hex digits inside the record's braces", 2)
        if args.key is not None:
            raise CliError("give either KEY or --digest, not both", 2)
        name = f"{prefix}:{{{digest}}}"
        return Record(digest, name, name + ":lock")
    if args.key is None:
        raise CliError("give the idempotency KEY (or --digest D)", 2)
    if args.guard:
        return record_for(prefix, args.scope, GUARD_METHOD, "", args.key)
    if not args.route:
        raise CliError("give --route (the route template, e.g. /charges) or --guard", 2)
    try:
        # The header value as the client sent it: "abc" (sf-string) and abc name one record.
        key = parse_key(args.key)
    except InvalidKeyError as exc:
        raise CliError(f"not a valid Idempotency-Key: {exc.reason}", 2) from None
    return record_for(prefix, args.scope, args.method.upper(), args.route, key)


@dataclass
class RecordView:
    """What ``inspect`` shows of a record."""

    record: str
    digest: str
    exists: bool
    state: str = ""
    owner: str = ""
    fence: int | None = None
    lease_ms: int = -2
    ttl_ms: int = -2
    at: str = ""
    kind: str = ""  # "response", "result", or "" when nothing is stored
    status: int | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    body_size: int | None = None
    body_kept: bool | None = None
    preview: str = ""
    error: str = ""


def read_record(client: Any, record: Record, *, guard: bool | None = None) -> RecordView:
    """Read one record (hash, PTTLs) in one pipeline and decode what it stores.

    ``guard``: True for a guard() record (msgpack value), False for an HTTP response, None to
    try the response format first (when only the digest is known).
    """
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(record.key)
    pipe.pttl(record.key)
    pipe.pttl(record.lock)
    fields, ttl_ms, lease_ms = pipe.execute()
    view = RecordView(record.key, record.digest, bool(fields), lease_ms=lease_ms, ttl_ms=ttl_ms)
    if not fields:
        return view
    get = {_text(k): v for k, v in fields.items()}.get
    state = _text(get("state"))
    view.state = state or "released"
    view.owner = _text(get("owner"))
    fence = _text(get("fence"))
    view.fence = int(fence) if fence.isdigit() else None
    at = _text(get("at"))
    if at.isdigit():
        stamp = datetime.fromtimestamp(int(at) / 1000, tz=timezone.utc)
        view.at = stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    stored = get("resp")
    if isinstance(stored, bytes) and stored:
        _decode_stored(view, stored, guard)
    return view


def _decode_stored(view: RecordView, stored: bytes, guard: bool | None) -> None:
    response: StoredResponse | None = None
    if guard is not True:
        try:
            response = decode_response(stored)
        except RecordFormatError as exc:
            if guard is False:
                view.error = str(exc)
                return
    if response is not None:
        view.kind = "response"
        view.status = response.status
        view.headers = [(n, v) for n, v in response.headers]
        view.body_size = len(response.body)
        view.body_kept = response.body_kept
        view.preview = _preview(response.body)
        return
    try:
        value: object = decode_value(stored)
    except RecordFormatError as exc:
        view.error = str(exc)
        return
    view.kind = "result"
    view.body_size = len(stored) - 1
    text = repr(value)
    view.preview = text[:PREVIEW_BYTES] + ("..." if len(text) > PREVIEW_BYTES else "")


def _show_record(view: RecordView, out: IO[str]) -> None:
    rows: list[tuple[str, str]] = [("record", view.record), ("state", view.state)]
    rows.append(("owner", _shorten(view.owner) if view.owner else "-"))
    rows.append(("fence", str(view.fence) if view.fence is not None else "-"))
    lease = "none (no live claim)" if view.lease_ms == -2 else _duration(view.lease_ms) + " left"
    rows.append(("lease", lease))
    rows.append(("ttl", _duration(view.ttl_ms) + (" left" if view.ttl_ms >= 0 else "")))
    if view.at:
        rows.append(("updated", view.at))
    if view.kind == "response":
        assert view.status is not None
        rows.append(("status", str(view.status)))
        kept = "" if view.body_kept else " (body not kept: too large or streamed)"
        rows.append(("body", f"{view.body_size} bytes{kept}"))
    elif view.kind == "result":
        rows.append(("result", f"{view.body_size} bytes (guard result, msgpack)"))
    if view.error:
        rows.append(("stored", f"unreadable: {view.error}"))
    for name, value in rows:
        out.write(f"{name:<9} {value}\n")
    if view.kind == "response":
        out.write(f"{'headers':<9} {len(view.headers)}\n")
        for name, value in view.headers:
            out.write(f"  {name}: {value}\n")
    if view.preview:
        out.write(f"preview   {view.preview}\n")


def cmd_inspect(args: argparse.Namespace, out: IO[str]) -> int:
    record = _record(args)
    guard = True if args.guard else (None if args.digest else False)
    with connect(args.redis_url) as server:
        view = read_record(server.client, record, guard=guard)
    if args.json:
        _print_json(asdict(view), out)
    elif view.exists:
        _show_record(view, out)
    if not view.exists:
        if not args.json:
            out.write(f"no record {record.key}\n")
        return 1
    return 0


def _confirm(question: str) -> bool:
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def cmd_forget(args: argparse.Namespace, out: IO[str]) -> int:
    record = _record(args)
    with connect(args.redis_url) as server:
        client = server.client
        view = read_record(client, record, guard=True if args.guard else None)
        if not view.exists:
            raise CliError(f"no record {record.key}")
        if view.state == "in_progress" and not args.force:
            lease = "no live lease" if view.lease_ms < 0 else f"lease {_duration(view.lease_ms)}"
            raise CliError(
                f"refusing to forget an in-progress record ({lease}): a request may be running "
                "it right now; pass --force to delete it anyway"
            )
        if not args.yes and sys.stdin.isatty():
            question = f"forget {view.state} record {record.key}?"
            if not _confirm(question):
                raise CliError("not confirmed; nothing deleted")
        script = client.register_script(_FORGET_LUA)
        deleted, state = script(keys=[record.key, record.lock], args=["1" if args.force else "0"])
    state = _text(state)
    if deleted == -1:
        raise CliError("the record became in progress meanwhile; nothing deleted (--force)")
    if args.json:
        _print_json({"record": record.key, "deleted": deleted, "state": state or "released"}, out)
    else:
        out.write(f"forgot {state or 'released'} record {record.key} ({deleted} keys deleted)\n")
    return 0


# --------------------------------------------------------------------------------------------
# stats
# --------------------------------------------------------------------------------------------

TTL_BUCKETS: Final = (
    ("< 1 min", 60_000),
    ("1 min - 1 h", 3_600_000),
    ("1 h - 6 h", 21_600_000),
    ("6 h - 24 h", 86_400_000),
    ("> 24 h", None),
)
STATES: Final = ("complete", "in_progress", "released", "other")


def glob_escape(text: str) -> str:
    """``text`` as a literal inside a Redis MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


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
            "seconds": round(self.seconds, 3),
        }


def _bucket(ttl_ms: int) -> str:
    if ttl_ms < 0:
        return "no TTL"
    for name, upper in TTL_BUCKETS:
        if upper is None or ttl_ms < upper:
            return name
    raise AssertionError("unreachable")  # pragma: no cover


class _Progress:
    """Progress lines on stderr, only for large keyspaces; ``\\r`` on a terminal."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.enabled = enabled and total >= PROGRESS_THRESHOLD
        self.total = total
        self.tty = sys.stderr.isatty()
        self.next = PROGRESS_EVERY
        self.last = -1e9

    def update(self, scanned: int, records: int) -> None:
        if not self.enabled or scanned < self.next:
            return
        now = time.monotonic()
        if not self.tty and now - self.last < PROGRESS_LOG_SECONDS:
            return  # a log file gets a line every few seconds, not one per SCAN page
        self.next, self.last = scanned + PROGRESS_EVERY, now
        line = f"idemkey stats: scanned {scanned}/{self.total} keys, {records} records"
        sys.stderr.write(("\r" + line) if self.tty else line + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")


def collect_stats(
    nodes: Sequence[tuple[str, Any]],
    prefix: str,
    *,
    sample: int = 1000,
    progress: bool = True,
    rng: random.Random | None = None,
) -> Stats:
    """Count records under ``prefix`` on every primary with SCAN (never KEYS).

    Memory is ``MEMORY USAGE`` of a uniform sample (reservoir) of at most ``sample`` records.
    """
    rng = rng or random.Random()
    stats = Stats(prefix, nodes=len(nodes))
    pattern = f"{glob_escape(prefix)}:{{*}}"
    started = time.perf_counter()
    total = sum(int(client.dbsize()) for _, client in nodes)
    meter = _Progress(total, progress)
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
                _classify(client, keys, stats)
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
    stats.seconds = time.perf_counter() - started
    return stats


def _classify(client: Any, keys: Sequence[bytes], stats: Stats) -> None:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, "state", "fence")
        pipe.pttl(key)
    replies = pipe.execute(raise_on_error=False)
    in_progress: list[bytes] = []
    for i, key in enumerate(keys):
        fields, ttl = replies[2 * i], replies[2 * i + 1]
        if isinstance(fields, Exception) or isinstance(ttl, Exception):
            stats.states["other"] += 1  # not a hash: a stranger's key under our prefix
            stats.scanned += 1
            continue
        if ttl == -2:
            continue  # expired between SCAN and now
        stats.scanned += 1
        state = _text(fields[0])
        if state in ("complete", "in_progress"):
            stats.states[state] += 1
            if state == "in_progress":
                in_progress.append(key)
        elif fields[1] is not None:
            stats.states["released"] += 1
        else:
            stats.states["other"] += 1
        stats.ttl[_bucket(int(ttl))] += 1
    if in_progress:
        pipe = client.pipeline(transaction=False)
        for key in in_progress:
            pipe.exists(key + b":lock")
        stats.lease_lapsed += sum(1 for live in pipe.execute() if not live)


def _measure(client: Any, keys: Sequence[bytes], stats: Stats) -> None:
    if not keys:
        return
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.memory_usage(key, samples=0)  # all six fields, not an estimate from five
    for used in pipe.execute(raise_on_error=False):
        if isinstance(used, int):
            stats.sampled += 1
            stats.sampled_bytes += used


def _show_stats(stats: Stats, url: str, out: IO[str]) -> None:
    where = f"{stats.nodes} primaries" if stats.nodes > 1 else redact(url)
    out.write(f'records under prefix "{stats.prefix}" on {where} ({stats.seconds:.2f} s)\n')
    for state, count in stats.states.items():
        if state == "other" and not count:
            continue
        note = ""
        if state == "in_progress" and stats.lease_lapsed:
            note = f"  ({stats.lease_lapsed} with a lapsed lease: crashed owners)"
        if state == "released":
            note = "  (only the fence counter left)"
        out.write(f"  {state:<12} {count:>9}{note}\n")
    out.write(f"  {'total':<12} {stats.scanned:>9}\n")
    if stats.sampled:
        out.write(f"memory (MEMORY USAGE of {stats.sampled} sampled records)\n")
        out.write(f"  {'mean':<12} {_size(stats.mean_bytes):>9} per record\n")
        out.write(f"  {'total':<12} {_size(stats.mean_bytes * stats.scanned):>9} (estimated)\n")
    out.write("TTL left\n")
    for bucket, count in stats.ttl.items():
        if bucket == "no TTL" and not count:
            continue
        out.write(f"  {bucket:<12} {count:>9}\n")


def cmd_stats(args: argparse.Namespace, out: IO[str]) -> int:
    if args.sample < 0:
        raise CliError("--sample must be >= 0", 2)
    with connect(args.redis_url) as server:
        stats = collect_stats(
            server.nodes, args.prefix, sample=args.sample, progress=not args.no_progress
        )
    if args.json:
        _print_json(stats.as_dict(), out)
    else:
        _show_stats(stats, args.redis_url, out)
    return 0


# --------------------------------------------------------------------------------------------
# doctor
# --------------------------------------------------------------------------------------------


def _config(client: Any, name: str) -> str | None:
    """One ``CONFIG GET`` value, or None when CONFIG is disabled (managed services)."""
    import redis

    try:
        reply = client.config_get(name)
    except redis.ResponseError:
        return None
    values = {_text(k): _text(v) for k, v in reply.items()}
    return values.get(name)


def diagnose_node(client: Any, pings: int) -> list[diagnostics.Check]:
    """Every doctor check on one server."""
    from redis.exceptions import ResponseError

    from .store import SCRIPTS

    info = _info(client)
    checks = [diagnostics.check_version(info), diagnostics.check_mode(info)]
    if diagnostics.mode(info) == "sentinel":
        return checks  # a Sentinel answers none of the rest
    checks.append(diagnostics.check_role(info))
    policy = _config(client, "maxmemory-policy")
    memory = {"maxmemory_policy": policy, "maxmemory": info.get("maxmemory")}
    if policy is None:
        memory["maxmemory_policy"] = info.get("maxmemory_policy")
    checks.append(diagnostics.check_eviction(memory))
    checks.append(
        diagnostics.check_persistence(_config(client, "save"), _config(client, "appendonly"))
    )
    loaded: dict[str, str | None] = {}
    for name, text in SCRIPTS.items():
        try:
            loaded[name] = _text(client.script_load(text))
        except ResponseError:
            loaded[name] = None
    checks.append(diagnostics.check_scripts(loaded))
    samples = []
    for _ in range(pings):
        started = time.perf_counter()
        client.ping()
        samples.append(time.perf_counter() - started)
    checks.append(diagnostics.check_round_trip(samples))
    return checks


def _merge(
    per_node: list[tuple[str, list[diagnostics.Check]]],
) -> list[tuple[str, diagnostics.Check]]:
    """One line per check when every primary agrees, else one per primary."""
    if len(per_node) == 1:
        return [("", check) for check in per_node[0][1]]
    merged: list[tuple[str, diagnostics.Check]] = []
    names = list(dict.fromkeys(c.name for _, checks in per_node for c in checks))
    for name in names:
        rows = [(node, c) for node, checks in per_node for c in checks if c.name == name]
        same = {(c.verdict, c.detail) for _, c in rows}
        if len(same) == 1 and name != "round trip":
            merged.append((f"all {len(rows)} primaries", rows[0][1]))
        else:
            merged.extend(rows)
    return merged


def cmd_doctor(args: argparse.Namespace, out: IO[str]) -> int:
    if args.pings < 1:
        raise CliError("--pings must be >= 1", 2)
    with connect(args.redis_url) as server:
        per_node = [(node, diagnose_node(client, args.pings)) for node, client in server.nodes]
        mode_line = None
        if server.cluster:
            state = _text(server.client.cluster_info().get("cluster_state", ""))
            verdict: diagnostics.Verdict = "OK" if state == "ok" else "FAIL"
            detail = f"cluster_state {state}, {len(server.nodes)} primaries"
            mode_line = diagnostics.Check("cluster", verdict, detail)
    lines = _merge(per_node)
    if mode_line is not None:
        lines.insert(0, ("", mode_line))
    verdict_all = diagnostics.worst([c for _, c in lines])
    if args.json:
        _print_json(
            {
                "url": redact(args.redis_url),
                "verdict": verdict_all,
                "checks": [{"node": node, **asdict(c)} for node, c in lines],
            },
            out,
        )
    else:
        out.write(f"idemkey doctor: {redact(args.redis_url)}\n")
        for node, check in lines:
            where = f"  [{node}]" if node else ""
            out.write(f"{check.verdict:<5} {check.name:<17} {check.detail}{where}\n")
        out.write(f"verdict: {verdict_all}\n")
    return 1 if verdict_all == "FAIL" else 0


# --------------------------------------------------------------------------------------------
# demo / serve / bench
# --------------------------------------------------------------------------------------------


def _demo_module() -> Any:
    try:
        import flask  # noqa: F401
        import werkzeug  # noqa: F401
    except ImportError as exc:
        raise CliError(f"the demo app needs {exc.name}: pip install 'idemkey[demo]'", 2) from None
    from . import demo

    return demo


def cmd_demo(args: argparse.Namespace, out: IO[str]) -> int:
    demo = _demo_module()

    ok = demo.run_story(redis_url=args.redis_url, prefix=args.prefix, out=out, as_json=args.json)
    return 0 if ok else 1


def cmd_serve(args: argparse.Namespace, out: IO[str]) -> int:
    if not 0 <= args.port <= 65535:
        raise CliError("--port must be between 0 and 65535", 2)
    demo = _demo_module()
    demo.serve(
        host=args.host, port=args.port, redis_url=args.redis_url, prefix=args.prefix, out=out
    )
    return 0


def cmd_bench(args: argparse.Namespace, out: IO[str]) -> int:
    # The suite lives in a source checkout (top-level `benchmarks/`), not in the wheel: import it
    # by name at run time.
    # (Never import benchmarks.__main__: it runs the suite at import.)
    try:
        run: Callable[[list[str]], object] | None = getattr(
            importlib.import_module("benchmarks"), "main", None
        )
    except ImportError:
        run = None
    if run is None:
        raise CliError(
            "the benchmark suite is not importable: run `idemkey bench` (or "
            "`python -m benchmarks`) from a source checkout",
            2,
        )
    rest = list(args.rest)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if args.redis_url and "--redis-url" not in rest:
        rest = ["--redis-url", args.redis_url, *rest]  # else the suite starts its own server
    result = run(rest)
    return result if isinstance(result, int) else 0


# --------------------------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------------------------


def _global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    # Added to the main parser and to every subcommand, so `idemkey inspect K --json` works as
    # well as `idemkey --json inspect K`; subcommands SUPPRESS defaults so they do not override.
    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--redis-url",
        default=default(None),
        metavar="URL",
        help=f"redis://, rediss:// or unix:// URL (default: ${URL_ENV})",
    )
    parser.add_argument(
        "--prefix",
        default=default("idemkey"),
        help="key prefix of the records (Policy.prefix; default: idemkey)",
    )
    parser.add_argument(
        "--json", action="store_true", default=default(False), help="machine-readable output"
    )


def _record_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key", nargs="?", metavar="KEY", help="the Idempotency-Key value")
    parser.add_argument("--scope", default="", help="the tenant scope (Policy.scope's answer)")
    parser.add_argument("--method", default="POST", help="HTTP method (default: POST)")
    parser.add_argument("--route", default="", help="route template, e.g. /charges")
    parser.add_argument("--guard", action="store_true", help="a guard()/@idempotent record")
    parser.add_argument("--digest", help="name the record by its digest (from logs, events)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="idemkey",
        description="Idempotency keys backed by Redis: demo and operator tools.",
        epilog="exit codes: 0 ok, 1 check failed, 2 bad arguments, 3 Redis error",
    )
    _global_options(parser, defaults=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def add(name: str, run: Callable[..., int], help: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help, description=help)
        _global_options(command, defaults=False)
        command.set_defaults(run=run)
        return command

    add(
        "demo",
        cmd_demo,
        "play the retry story against the demo payments app (embedded store unless "
        "--redis-url is given; $IDEMKEY_REDIS_URL is not used)",
    )
    serve = add("serve", cmd_serve, "run the demo payments app for curl (store: as for demo)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)

    inspect = add("inspect", cmd_inspect, "show one record, decoded")
    _record_options(inspect)
    forget = add("forget", cmd_forget, "delete one record (record and lock)")
    _record_options(forget)
    forget.add_argument("--yes", "-y", action="store_true", help="do not ask on a terminal")
    forget.add_argument("--force", action="store_true", help="delete an in-progress record too")

    stats = add("stats", cmd_stats, "records by state, memory and TTLs (SCAN, never KEYS)")
    stats.add_argument(
        "--sample", type=int, default=1000, help="records measured with MEMORY USAGE per node"
    )
    stats.add_argument("--no-progress", action="store_true", help="no progress on stderr")

    doctor = add("doctor", cmd_doctor, "check that a Redis server is fit to hold records")
    doctor.add_argument("--pings", type=int, default=20, help="PINGs for the round-trip median")

    bench = add(
        "bench",
        cmd_bench,
        "run the benchmark suite (python -m benchmarks; a private redis-server unless "
        "--redis-url is given)",
    )
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the suite")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    parser = build_parser()
    out = sys.stdout
    try:
        args = parser.parse_args(argv)
    except _UsageError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    # demo, serve and bench write records of their own: only into a Redis named on the command
    # line, never into whatever $IDEMKEY_REDIS_URL points at (maybe production).
    if args.redis_url is None and args.command not in ("demo", "serve", "bench"):
        args.redis_url = os.environ.get(URL_ENV) or None
    return _run(args, out)


def _run(args: argparse.Namespace, out: IO[str]) -> int:
    import redis

    try:
        code: int = args.run(args, out)
        return code
    except CliError as exc:
        sys.stderr.write(f"idemkey {args.command}: {exc}\n")
        return exc.code
    except BrokenPipeError:
        # `idemkey stats | head`: the reader left; say nothing more, as shell tools do.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - stays open until exit
        return 141
    except (redis.RedisError, OSError) as exc:
        where = redact(args.redis_url) if args.redis_url else "Redis"
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        sys.stderr.write(f"idemkey {args.command}: {where}: {type(exc).__name__}: {message}\n")
        return 3
    except IdemkeyError as exc:
        sys.stderr.write(f"idemkey {args.command}: {type(exc).__name__}: {exc}\n")
        return 3
    except KeyboardInterrupt:
        sys.stderr.write(f"idemkey {args.command}: interrupted\n")
        return 130
    except Exception as exc:
        # A bug of ours: still one line, unless asked for the traceback.
        if os.environ.get(DEBUG_ENV):
            raise
        message = str(exc).splitlines()[0] if str(exc) else ""
        sys.stderr.write(
            f"idemkey {args.command}: internal error: {type(exc).__name__}: {message} "
            f"(set {DEBUG_ENV}=1 for the traceback)\n"
        )
        return 70
