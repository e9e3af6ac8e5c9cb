"""``idemkey forget KEY ... [--yes] [--force]``: delete one record."""

from __future__ import annotations

import argparse
import sys
from typing import IO, Final

from ..store.diagnostics import _text as text
from ._base import CliError, confirm, print_json
from ._format import duration
from ._records import add_record_options, record_candidates
from ._redis import connect
from .inspect import find_one_held

HELP: Final = "delete one record"

# Deletes one record atomically, so an in-progress record cannot be claimed between the check
# and the delete. An operator tool, off the hot path: inline rather than package data.
# KEYS[1] record hash, the only key; ARGV[1] "1" deletes an in-progress record too. An expired
# key's tombstone (KEYS[1] .. ":gone", Policy.expired_grace) goes too: a forgotten key runs
# again; and the lock string of a claim written by 0.2 (KEYS[1] .. ":lock"; remove in 0.4).
# Both with pcall: keys of the same slot that a node serving a migrating slot may not hold.
# Reply: {deleted keys, state} ({-1, state} when refused); state "" when the hash has none.
_FORGET_LUA: Final = """
local state = redis.call("HGET", KEYS[1], "state")
if not state then  -- a completed record has no state field, only fp and resp
  state = redis.call("HEXISTS", KEYS[1], "resp") == 1 and "complete" or ""
end
if state == "in_progress" and ARGV[1] ~= "1" then
  return {-1, state}
end
local deleted = redis.call("DEL", KEYS[1])
for _, suffix in ipairs({":gone", ":lock"}) do
  local found = redis.pcall("DEL", KEYS[1] .. suffix)
  if type(found) == "number" then
    deleted = deleted + found
  end
end
return {deleted, state}
"""


def configure(parser: argparse.ArgumentParser) -> None:
    add_record_options(parser)
    parser.add_argument("--yes", "-y", action="store_true", help="do not ask on a terminal")
    parser.add_argument("--force", action="store_true", help="delete an in-progress record too")


def run(args: argparse.Namespace, out: IO[str]) -> int:
    candidates = record_candidates(args)
    with connect(args.redis_url) as server:
        client = server.client
        held, view = find_one_held(client, args, candidates, nothing="nothing deleted")
        record = held.record
        if view.state == "in_progress" and not args.force:
            lease = "no live lease" if view.lease_ms < 0 else f"lease {duration(view.lease_ms)}"
            raise CliError(
                f"refusing to forget an in-progress record ({lease}): a request may be running "
                "it right now; pass --force to delete it anyway"
            )
        if not args.yes and sys.stdin.isatty():
            question = f"forget {view.state} record {record.record_key}?"
            if not confirm(question):
                raise CliError("not confirmed; nothing deleted")
        script = client.register_script(_FORGET_LUA)
        deleted, state = script(keys=[record.record_key], args=["1" if args.force else "0"])
    state = text(state)
    if deleted == -1:
        raise CliError("the record became in progress meanwhile; nothing deleted (--force)")
    if args.json:
        print_json(
            {"record": record.record_key, "deleted": deleted, "state": state or "released"}, out
        )
    else:
        out.write(
            f"forgot {state or 'released'} record {record.record_key} ({deleted} keys deleted)\n"
        )
    return 0
