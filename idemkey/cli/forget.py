"""``idemkey forget KEY ... [--yes] [--force]``: delete one record.

The delete is ``store.forget()`` (forget.lua, the one the console's button runs too): the
record, its expiry tombstone, a 0.2 lock string and its wake-up stream, in one script that
keeps a record a live claim holds unless ``--force``.
"""

from __future__ import annotations

import argparse
from typing import IO, Final

from ..policy import Policy
from ..store import RedisStore
from ._base import CliError, consent, print_json
from ._records import add_record_options, record_candidates
from ._redis import connect
from .inspect import find_one_held
from .readable import duration

HELP: Final = "delete one record"
YES_HELP: Final = "act without asking (needed when stdin is not a terminal: cron, pipes, CI)"


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


def run(args: argparse.Namespace, out: IO[str]) -> int:
    candidates = record_candidates(args)
    with connect(args.redis_url) as server:
        held, view = find_one_held(server.client, args, candidates, nothing="nothing deleted")
        record = held.record
        state = view.state
        if state == "in_progress" and view.lease_ms == -2:
            state = "lapsed"
        if state == "in_progress" and not args.force:
            raise _refused(view.lease_ms)  # before asking: the answer could not change it
        question = f"forget {state} record {record.record_key}?"
        consent(args.yes, question, verb="forget", nothing="nothing deleted")
        store = RedisStore(server.client, Policy(prefix=args.prefix))
        try:
            found = store.forget(record, force=args.force)
        finally:
            store.close()
    if found.held:
        raise CliError("the record was claimed meanwhile; nothing deleted (--force deletes it)")
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
