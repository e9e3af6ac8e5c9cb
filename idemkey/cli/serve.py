"""``idemkey serve [--port N]``: run the demo payments app for curl."""

from __future__ import annotations

import argparse
from typing import IO, Final

from . import demo
from ._base import CliError
from .demo import demo_errors, load_demo

HELP: Final = (
    "run the demo payments app for curl until Ctrl-C (embedded store unless --redis-url is "
    "given; $IDEMKEY_REDIS_URL is not used)"
)
REDIS_URL_HELP: Final = demo.REDIS_URL_HELP
JSON_HELP: Final = "errors as one JSON object on stderr (the app's own output is text)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)"
    )
    parser.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0: any free)")


def run(args: argparse.Namespace, out: IO[str]) -> int:
    if not 0 <= args.port <= 65535:
        raise CliError("--port must be between 0 and 65535", 2)
    app = load_demo()
    with demo_errors():
        app.serve(
            host=args.host,
            port=args.port,
            redis_url=args.redis_url,
            prefix=args.prefix,
            out=out,
        )
    return 0
