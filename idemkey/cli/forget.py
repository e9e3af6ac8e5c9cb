"""``idemkey forget KEY ... [--yes] [--force]``: delete one record.

The delete is ``store.forget()`` (forget.lua, the one the console's button runs too): the
record, its expiry tombstone, a 0.2 lock string and its wake-up stream, in one script that
keeps a record a live claim holds unless ``--force``.
"""

from __future__ import annotations

import argparse
from typing import IO, Final

from .._core import Record
from ._base import YES_HELP, CliError, print_json
from ._records import RecordView, add_record_options
from .inspect import change_one, shown_state
from .readable import duration

__all__ = ["HELP", "YES_HELP", "configure", "run"]  # YES_HELP: where cancel imported it from

HELP: Final = "delete one record"
NOTHING: Final = "nothing deleted"


def configure(parser: argparse.ArgumentParser) -> None:
    add_record_options(parser)
    parser.add_argument("--yes", "-y", action="store_true", help=YES_HELP)
    parser.add_argument(
        "--force", action="store_true", help="delete a record a live claim holds too"
    )


def _refused(lease_ms: int) -> CliError:
    lease = "lease unknown" if lease_ms <= 0 else f"lease {duration(lease_ms)}"
    return CliError(
        f"refusing to forget an in-progress record ({lease}): a request may be running it "
        "right now; pass --force to delete it anyway"
    )


def _ask(args: argparse.Namespace, record: Record, view: RecordView) -> str:
    state = shown_state(view)
    if state == "in_progress" and not args.force:
        raise _refused(view.lease_ms)  # before asking: the answer could not change it
    return f"forget {state} record {record.record_key}?"


def run(args: argparse.Namespace, out: IO[str]) -> int:
    record, view, found = change_one(
        args,
        verb="forget",
        nothing="nothing deleted",
        ask=lambda record, view: _ask(args, record, view),
        # What was confirmed, checked where it is deleted: a retry may take a lapsed record
        # over while the prompt is open, and complete it (the answer its next retry replays).
        act=lambda store, record, shown: store.forget(
            record, force=args.force, seen=(shown.state, shown.fence)
        ),
    )
    if found.held:
        raise CliError("the record was claimed meanwhile; nothing deleted (--force deletes it)")
    if found.changed and found.state:
        was = shown_state(view)
        if found.state == was:  # the same state under another fence: claimed again since
            raise CliError(f"the {was} record was claimed again since you confirmed; {NOTHING}")
        raise CliError(
            f"the record is {found.state} now, not the {was} record you confirmed; {NOTHING}"
        )
    if not found.forgotten:
        raise CliError(f"no record {record.record_key} any more; nothing deleted")
    if args.json:
        print_json(
            {"record": record.record_key, "deleted": found.deleted, "state": found.state}, out
        )
    else:
        out.write(
            f"forgot {found.state} record {record.record_key} ({found.deleted} keys deleted)\n"
        )
    return 0
