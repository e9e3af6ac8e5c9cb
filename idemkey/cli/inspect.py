"""``idemkey inspect KEY [--scope S] [--route /charges]``: one record, decoded.

A record's name is a one-way digest of scope, method, route and key. When the command line
names all of them (or ``--digest``), inspect reads that one record. When it leaves the scope
or the route out, inspect tries each name it can build, and says which held the key or, when
none did, every name it tried: the default scope of a request without credentials and the
empty scope (unless ``--scope`` or ``-H`` says), each ``--route`` given, and without
``--route`` the ``guard()`` records.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict
from typing import IO, Any, Final, NamedTuple, TypeVar

from .._core import Record
from .._core._stored import stored_int
from ..guard import GUARD_METHOD
from ..policy import Policy
from ..store import RedisStore
from ..store.diagnostics import _text as text
from ._base import CliError, consent, print_json
from ._records import (
    FOREIGN,
    NOT_SEARCHABLE,
    Candidate,
    RecordView,
    add_record_options,
    names_one_record,
    read_record,
    record_candidates,
    show_record,
)
from ._redis import connect

HELP: Final = "show one record, decoded (or say which names were tried)"

T = TypeVar("T")


class Shown(NamedTuple):
    """What the operator confirmed a change of: forget.lua's ``seen`` (state, fence)."""

    state: str  # "lapsed": in progress, its lease passed
    fence: Any  # the stored bytes, None for none (see _shown)


def configure(parser: argparse.ArgumentParser) -> None:
    add_record_options(parser)


def find(
    client: Any, candidates: list[Candidate], *, values: bool = True
) -> list[tuple[Candidate, RecordView]]:
    """Read every candidate (one EXISTS round trip for all, then the ones that exist);
    ``values=False``: without decoding their stored values (see :func:`read_record`)."""
    pipe = client.pipeline(transaction=False)
    for candidate in candidates:
        pipe.exists(candidate.record.record_key)
    present = [c for c, n in zip(candidates, pipe.execute(), strict=True) if n]
    if len(candidates) == 1 and not present:
        present = candidates  # one name: show it even when empty, as before
    # The stored value is a guard() result or an HTTP response; by digest, try both.
    decode = {GUARD_METHOD: True, "?": None}
    return [
        (c, read_record(client, c.record, guard=decode.get(c.method, False), value=values))
        for c in present
    ]


def find_one_held(
    client: Any, args: argparse.Namespace, candidates: list[Candidate], *, nothing: str
) -> tuple[Candidate, RecordView]:
    """The one record holding the key, for a command that changes it; else a CliError.

    ``nothing`` ends the message when more than one record holds the key ("nothing deleted").
    """
    # The state and the lease decide; the stored value is not read: one that does not decode
    # must not keep its record from being forgotten (the remedy for it) or cancelled.
    held = [(c, view) for c, view in find(client, candidates, values=False) if view.exists]
    if not held:
        if len(candidates) == 1 and names_one_record(args):
            raise CliError(f"no record {candidates[0].record.record_key}")
        tried = "; ".join(c.describe() for c in candidates)
        raise CliError(f"no record for key {args.key!r} under the names tried ({tried})")
    if len(held) > 1:
        where = "; ".join(c.describe() for c, _ in held)
        raise CliError(
            f"the key is held by {len(held)} records ({where}): give --scope and --route "
            f"to name one; {nothing}"
        )
    return held[0]


def change_one(
    args: argparse.Namespace,
    *,
    verb: str,
    nothing: str,
    ask: Callable[[Record, RecordView], str],
    act: Callable[[RedisStore, Record, Shown], T],
) -> tuple[Record, RecordView, T]:
    """What ``forget`` and ``cancel`` share: find the one record holding the key, ask
    ``ask(record, view)`` (which raises a CliError to refuse before asking), go on only with
    :func:`consent`, then ``act(store, record, shown)`` with a store on the same connection.

    ``shown`` is what the operator confirmed: the record can change while the prompt is open
    (a retry takes a lapsed one over and completes it), so ``act`` hands it to the script
    that checks it where it writes, and never acts on the record as it is by then."""
    candidates = record_candidates(args)
    with connect(args.redis_url) as server:
        held, view = find_one_held(server.client, args, candidates, nothing=nothing)
        shown = _shown(server.client, held.record, view, nothing)
        consent(args.yes, ask(held.record, view), verb=verb, nothing=nothing)
        store = RedisStore(server.client, Policy(prefix=args.prefix))
        try:
            return held.record, view, act(store, held.record, shown)
        finally:
            store.close()


def shown_state(view: RecordView) -> str:
    """The state ``view`` shows an operator: "lapsed" for an in-progress record without a lease."""
    return "lapsed" if view.state == "in_progress" and view.lease_ms == -2 else view.state


def _shown(client: Any, record: Record, view: RecordView, nothing: str) -> Shown:
    """The state and the fence ``view`` shows, the fence as stored (bytes; None: none).

    As stored, not as parsed: a fence no parser reads ("007", written by hand) must still
    compare equal to itself in forget.lua, or its record could not be forgotten (the remedy)."""
    state = shown_state(view)
    if view.state == FOREIGN:
        return Shown(state, None)  # a key of another type: no fence field to read
    fence = client.hget(record.record_key, "fence")
    if stored_int(text(fence)) != view.fence:  # claimed again between the two reads
        raise CliError(f"the record changed while it was read; look at it again; {nothing}")
    return Shown(state, fence)


def run(args: argparse.Namespace, out: IO[str]) -> int:
    candidates = record_candidates(args)
    with connect(args.redis_url) as server:
        found = find(server.client, candidates)
    held = [(c, view) for c, view in found if view.exists]
    if len(candidates) == 1 and names_one_record(args):
        # The command line named one record: its view (exists false when it is not there).
        view = found[0][1]
        if args.json:
            print_json(asdict(view), out)
        elif view.exists:
            show_record(view, out)
        else:
            out.write(f"no record {view.record}\n")
        return 0 if view.exists else 1
    tried = [
        {"scope": c.scope, "scope_note": c.scope_note, "method": c.method, "route": c.route,
         "record": c.record.record_key, "exists": any(h is c for h, _ in held)}
        for c in candidates
    ]  # fmt: skip
    if args.json:
        records = [
            {"scope": c.scope, "scope_note": c.scope_note, "method": c.method, "route": c.route,
             **asdict(view)}
            for c, view in held
        ]  # fmt: skip
        hint = None if held else NOT_SEARCHABLE
        print_json({"key": args.key, "records": records, "tried": tried, "hint": hint}, out)
        return 0 if held else 1
    if not held:
        out.write(
            f"no record for key {args.key!r} under any of the {len(candidates)} names tried:\n"
        )
        for c in candidates:
            out.write(f"  {c.describe():<60} {c.record.record_key}\n")
        out.write(f"{NOT_SEARCHABLE}\n")
        return 1
    for i, (c, view) in enumerate(held):
        if i:
            out.write("\n")
        out.write(f"found under {c.describe()}\n")
        show_record(view, out)
    if len(held) > 1:
        out.write(f"\nthe key is held by {len(held)} records: one per scope and route\n")
    return 0
