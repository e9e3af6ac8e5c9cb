"""``idemkey inspect KEY --scope S --route /charges``: one record, decoded."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import IO, Final

from ._base import print_json
from ._records import add_record_options, read_record, record_named, show_record
from ._redis import connect

HELP: Final = "show one record, decoded"


def configure(parser: argparse.ArgumentParser) -> None:
    add_record_options(parser)


def run(args: argparse.Namespace, out: IO[str]) -> int:
    record = record_named(args)
    guard = True if args.guard else (None if args.digest else False)
    with connect(args.redis_url) as server:
        view = read_record(server.client, record, guard=guard)
    if args.json:
        print_json(asdict(view), out)
    elif view.exists:
        show_record(view, out)
    if not view.exists:
        if not args.json:
            out.write(f"no record {record.record_key}\n")
        return 1
    return 0
