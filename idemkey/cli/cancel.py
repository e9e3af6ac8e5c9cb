"""``idemkey cancel KEY ... [--abandon] [--yes]``: give up a record's run on purpose, fenced.

An in-progress record (a job stuck, or running what must not finish) loses its owner: that
executor's later checkpoints, renewals and completion are refused (cancel.lua), and its fence
is raised. A released record with finished steps is released again. Without ``--abandon`` the
finished steps stay, and the next executor of the key resumes after them; with it they go,
and the next executor runs the job from the start.
"""

from __future__ import annotations

import argparse
from typing import IO, Final

from .._core import Record
from ._base import YES_HELP, CliError, print_json
from ._records import FOREIGN, RecordView, add_record_options
from .inspect import change_one, shown_state

HELP: Final = "cancel an in-progress or half-done record (its owner can no longer complete it)"
NOTHING: Final = "nothing cancelled"


def configure(parser: argparse.ArgumentParser) -> None:
    add_record_options(parser)
    parser.add_argument(
        "--abandon",
        action="store_true",
        help="also drop the finished steps: the next run starts from the first step",
    )
    parser.add_argument("--yes", "-y", action="store_true", help=YES_HELP)


def _ask(args: argparse.Namespace, record: Record, view: RecordView) -> str:
    if view.state == "complete":
        raise CliError(
            f"record {record.record_key} is complete: nothing to cancel (forget deletes it)"
        )
    if view.state == FOREIGN:  # a key of another type: cancel.lua would fail on it (exit 3)
        raise CliError(
            f"{record.record_key} is not an idemkey record: nothing to cancel (forget deletes it)"
        )
    what = "cancel and abandon" if args.abandon else "cancel"
    return f"{what} {view.state} record {record.record_key}?"


def run(args: argparse.Namespace, out: IO[str]) -> int:
    record, view, cancelled = change_one(
        args,
        verb="cancel",
        nothing=NOTHING,
        ask=lambda record, view: _ask(args, record, view),
        # What was confirmed, checked where it is cancelled: a retry may take a lapsed claim
        # over while the prompt is open, and the new owner's run is not the one to stop.
        act=lambda store, record, shown: store.cancel(
            record, abandon=args.abandon, seen=(shown.state, shown.fence)
        ),
    )
    if cancelled is not None and cancelled.changed:
        was, now = shown_state(view), cancelled.was
        if now == view.state:  # the same state under another fence: claimed again since
            raise CliError(f"the record was claimed again since you confirmed; {NOTHING}")
        if not now:
            raise CliError(f"no record {record.record_key} any more; {NOTHING}")
        raise CliError(f"the record is {now} now, not the {was} record you confirmed; {NOTHING}")
    if cancelled is None:
        raise CliError(
            f"nothing to cancel in record {record.record_key} ({view.state or 'released'} "
            "without finished steps: a retry runs afresh anyway)"
        )
    steps = "dropped" if args.abandon else "kept"
    was, fence = cancelled.was, cancelled.fence
    if args.json:
        print_json({"record": record.record_key, "was": was, "steps": steps, "fence": fence}, out)
    else:
        out.write(
            f"cancelled {was} record {record.record_key} (fence now {fence}; finished steps "
            f"{steps}: the next run {'starts afresh' if args.abandon else 'resumes after them'})\n"
        )
    return 0
