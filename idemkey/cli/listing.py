"""``idemkey list``: the records under a prefix with their status (``store.records()``), or,
with ``--uncertain``, the outcomes an operator must check by hand (``store.uncertain()``).

SCAN with COUNT on every primary (never KEYS), one page in memory at a time; the output is
written as pages are read, and progress goes to stderr for large keyspaces.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
from dataclasses import asdict
from typing import IO, Any, Final

from .._core import record_from_digest
from .._core._origin import escape_key, printable_text
from ..policy import Policy
from ..store import STATES, RecordStatus, RedisStore
from ..store.uncertain import UncertainEntry, action_now
from . import stats
from ._base import CliError, print_json
from ._progress import Progress
from ._redis import connect, key_count
from .readable import NOT_A_DATE, compact_seconds, shown, utc_time

HELP: Final = "list records with their state, lease, age and steps (SCAN, never KEYS)"
SCAN_COUNT: Final = 1000
#: How many keys per server the hint of other prefixes looks at, at most (a bounded SCAN).
HINT_SCAN_KEYS: Final = 20_000


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state",
        action="append",
        choices=STATES,
        help="only records in this state (repeat for several)",
    )
    parser.add_argument("--route", help="only records of this route template (or function)")
    parser.add_argument("--scope", help="only records of this tenant scope (Policy.scope)")
    parser.add_argument("--method", help="only records of this HTTP method (GUARD: guard())")
    parser.add_argument("--limit", type=int, help="stop after this many records")
    parser.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    parser.add_argument(
        "--uncertain",
        action="store_true",
        help="the uncertain outcomes instead (newest first; --limit, default 100): work whose "
        "effect an operator must check by hand",
    )


COLUMNS: Final = (
    f"{'STATE':<12} {'AGE':>6} {'LEASE':>6} {'TTL':>6} {'FENCE':>16}  {'ORIGIN':<32} STEPS  RECORD"
    "  KEY"
)


def row(status: RecordStatus) -> str:
    """One line of ``idemkey list``: state, age, lease and TTL left, fence, origin, steps,
    record digest and the client's key (escaped: printable, no white space), "-" when not
    kept."""
    # Route and scope may come from a request (a path, a tenant header): printed escaped.
    origin = f"{escape_key(status.method)} {printable_text(status.route)}".strip() or "-"
    if status.scope:
        origin += f" [{printable_text(status.scope)[:12]}]"
    # A fence is the server clock in µs at least (16 digits): the column fits one.
    fence = str(status.fence) if status.fence is not None else "-"
    # Step names are the fields' names, any writer's: escaped as list --uncertain prints them.
    steps = shown(",".join(status.steps)) or "-"
    age, lease, ttl = (compact_seconds(s) for s in (status.age, status.lease_left, status.ttl_left))
    return (
        f"{status.state:<12} {age:>6} {lease:>6} "
        f"{ttl:>6} {fence:>16}  {origin:<32} {steps}  {status.digest}  {shown_key(status)}"
    )


def shown_key(status: RecordStatus) -> str:
    """The client's key as printed: escaped as kept, "..." after a cut one, "-" for none."""
    return status.client_key + ("..." if status.key_cut else "") if status.client_key else "-"


def _records(args: argparse.Namespace, store: RedisStore, progress: Progress) -> Any:
    return store.records(
        state=args.state,
        route=args.route,
        scope=args.scope,
        method=args.method,
        limit=args.limit,
        count=SCAN_COUNT,
        progress=progress.keys,
    )


def _when(at: float) -> str:
    """An entry's time (stored data) as ISO 8601 UTC, or :data:`NOT_A_DATE` padded to its
    width, past what a date holds (``--json`` keeps the number)."""
    stamp = utc_time(at)
    if stamp is None:
        return f"{NOT_A_DATE:<20}"
    return stamp.isoformat(timespec="seconds").replace("+00:00", "Z")


def states_now(store: RedisStore, entries: list[UncertainEntry]) -> dict[str, str]:
    """The state now of each entry's record, by digest (absent: gone), so the advice follows
    what happened since the entry was written, as the console's does (``action_now``)."""
    now: dict[str, str] = {}
    for digest in dict.fromkeys(entry.digest for entry in entries):
        status = store.record(record_from_digest(store.policy.prefix, digest))
        if status is not None:
            now[digest] = status.state
    return now


def show_uncertain(
    entries: list[UncertainEntry], prefix: str, out: IO[str], now: dict[str, str]
) -> None:
    if not entries:
        out.write(f'no uncertain outcome under prefix "{prefix}"\n')
        return
    for entry in entries:
        # Every field is stored data (a route may be a raw path, a detail an error's text):
        # printed through shown(), so no escape sequence reaches the operator's terminal.
        origin = shown(f"{entry.method} {entry.route}".strip()) or "-"
        fence = f" fence {entry.fence}" if entry.fence is not None else ""
        kind, digest = shown(entry.kind), shown(entry.digest)
        out.write(f"{_when(entry.at)}  {kind:<20} {origin}{fence}  {digest}\n")
        if entry.steps:
            out.write(f"    steps: {shown(', '.join(entry.steps))}\n")
        if entry.detail:
            out.write(f"    detail: {shown(entry.detail)}\n")
        action = action_now(entry.kind, now.get(entry.digest))
        out.write(f"    means: {entry.meaning}\n    do: {action}\n")


def other_prefixes(nodes: list[tuple[str, Any]], prefix: str) -> list[str]:
    """The prefixes other than ``prefix`` that hold records, sorted, from a SCAN of at most
    :data:`HINT_SCAN_KEYS` keys per server (so a large keyspace may hide some)."""
    found, _ = stats.other_prefixes(nodes, HINT_SCAN_KEYS, hints=False)
    found.pop(prefix, None)
    return sorted(found)


def _hint(prefixes: list[str]) -> str:
    if not prefixes:
        at_most = f"{HINT_SCAN_KEYS:,}".replace(",", " ")  # the bound the SCAN keeps
        return f"no other prefix holds records either (SCAN of at most {at_most} keys per server)\n"
    shown = ", ".join(json.dumps(p) for p in prefixes[:10])
    more = f" and {len(prefixes) - 10} more" if len(prefixes) > 10 else ""
    first = prefixes[0]  # stored data: printed quoted, no control character reaches a terminal
    named = shlex.quote(first) if first.isprintable() else json.dumps(first)
    return f"records are kept under other prefixes: {shown}{more} (idemkey --prefix {named} list)\n"


def _close_json(out: IO[str], count: int, hint: list[str] | None, *, complete: bool) -> None:
    """End the ``--json`` document whose records were streamed: ``complete`` is false when
    the listing stopped part way (the error on stderr, exit status not 0)."""
    extra = "" if hint is None else f', "other_prefixes": {json.dumps(hint)}'
    state = json.dumps(complete)
    out.write(f'{chr(10) if count else ""}], "count": {count}, "complete": {state}{extra}}}\n')


def run(args: argparse.Namespace, out: IO[str]) -> int:
    if args.limit is not None and args.limit < 1:
        raise CliError("--limit must be >= 1", 2)
    if args.uncertain:
        with connect(args.redis_url) as server:
            store = RedisStore(server.client, Policy(prefix=args.prefix))
            entries = store.uncertain(limit=args.limit or 100)
            now = states_now(store, entries)
        if args.json:
            rows = [
                {**asdict(e), "meaning": e.meaning, "action": action_now(e.kind, now.get(e.digest)),
                 "state_now": now.get(e.digest, "gone")}
                for e in entries
            ]  # fmt: skip
            print_json({"prefix": args.prefix, "uncertain": rows}, out)
        else:
            show_uncertain(entries, args.prefix, out, now)
        return 0
    with connect(args.redis_url) as server:
        store = RedisStore(server.client, Policy(prefix=args.prefix))
        total = sum(key_count(client) for _, client in server.nodes)
        progress = Progress(total, not args.no_progress, "list")
        count, hint = 0, None
        if args.json:
            out.write(f'{{"prefix": {json.dumps(args.prefix)}, "records": [')
        else:
            out.write(COLUMNS + "\n")
        try:
            for status in _records(args, store, progress):
                if args.json:
                    out.write(("\n  " if not count else ",\n  ") + json.dumps(asdict(status)))
                else:
                    out.write(row(status) + "\n")
                count += 1
            progress.done()
            # Nothing under the prefix at all (no filter hid them): name the prefixes that
            # hold records, as a Flask app's "payments" stays hidden behind the default prefix.
            filtered = args.state or args.route or args.scope or args.method
            hint = None if count or filtered else other_prefixes(server.nodes, args.prefix)
        except BaseException:
            # Redis failed mid-scan (or Ctrl-C): the error goes to stderr as for any command,
            # and the document streamed so far is closed, valid JSON marked incomplete, so a
            # script piping it into jq reads what was listed and can tell it is not all.
            if args.json:
                with contextlib.suppress(Exception):  # stdout itself may be what failed
                    _close_json(out, count, None, complete=False)
            raise
        if args.json:
            _close_json(out, count, hint, complete=True)
        elif not count:
            out.write(f'no record under prefix "{args.prefix}" matches\n')
            if hint is not None:
                out.write(_hint(hint))
    return 0
