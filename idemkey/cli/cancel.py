"""``idemkey cancel KEY ... [--abandon] [--yes]``: give up a record's run on purpose, fenced.

An in-progress record (a job stuck, or running what must not finish) loses its owner: that
executor's later checkpoints, renewals and completion are refused (cancel.lua), and its fence
is raised. A released record with finished steps is released again. Without ``--abandon`` the
finished steps stay, and the next executor of the key resumes after them; with it they go,
and the next executor runs the job from the start.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO, Final

from ..store._base import SCRIPTS
from ._base import CliError, confirm, print_json
from ._records import add_record_options, record_candidates
from ._redis import connect
from .inspect import find_one_held

HELP: Final = "cancel an in-progress or half-done record (its owner can no longer complete it)"


def configure(parser: argparse.ArgumentParser) -> None:
    add_record_options(parser)
    parser.add_argument(
        "--abandon",
        action="store_true",
        help="also drop the finished steps: the next run starts from the first step",
    )
    parser.add_argument("--yes", "-y", action="store_true", help="do not ask on a terminal")


def run(args: argparse.Namespace, out: IO[str]) -> int:
    candidates = record_candidates(args)
    with connect(args.redis_url) as server:
        client = server.client
        held, view = find_one_held(client, args, candidates, nothing="nothing cancelled")
        record = held.record
        if view.state == "complete":
            raise CliError(
                f"record {record.record_key} is complete: nothing to cancel (forget deletes it)"
            )
        if not args.yes and sys.stdin.isatty():
            what = "cancel and abandon" if args.abandon else "cancel"
            if not confirm(f"{what} {view.state} record {record.record_key}?"):
                raise CliError("not confirmed; nothing cancelled")
        script = client.register_script(SCRIPTS["cancel"])
        reply = script(keys=[record.record_key], args=["1" if args.abandon else "0"])
    if not reply or reply[0] == 0:
        raise CliError(
            f"nothing to cancel in record {record.record_key} ({view.state or 'released'} "
            "without finished steps: a retry runs afresh anyway)"
        )
    was = "in_progress" if reply[0] == 1 else "released"
    steps = "dropped" if args.abandon else "kept"
    fence = int(reply[1])
    if args.json:
        print_json({"record": record.record_key, "was": was, "steps": steps, "fence": fence}, out)
    else:
        out.write(
            f"cancelled {was} record {record.record_key} (fence now {fence}; finished steps "
            f"{steps}: the next run {'starts afresh' if args.abandon else 'resumes after them'})\n"
        )
    return 0
