"""``idemkey serve [--port N]``: run the demo payments app for curl."""

from __future__ import annotations

import argparse
from typing import IO, Final

from ._base import CliError
from .demo import demo_errors, load_demo, shown

HELP: Final = "run the demo payments app for curl (store: as for demo)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)


def run(args: argparse.Namespace, out: IO[str]) -> int:
    if not 0 <= args.port <= 65535:
        raise CliError("--port must be between 0 and 65535", 2)
    demo = load_demo()
    with demo_errors():
        demo.serve(
            host=args.host,
            port=args.port,
            redis_url=args.redis_url,
            prefix=args.prefix,
            out=out,
            shown_url=shown(args.redis_url),
        )
    return 0
