"""``idemkey bench -- ARGS``: the benchmark suite of a source checkout."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import IO, Final

from ._base import CliError

HELP: Final = (
    "run the benchmark suite (python -m benchmarks; a private redis-server unless "
    "--redis-url is given)"
)

REDIS_URL_HELP: Final = (
    "a Redis to benchmark against (default: a private redis-server the suite starts; "
    "$IDEMKEY_REDIS_URL is not used)"
)
JSON_HELP: Final = (
    "idemkey's errors as one JSON object on stderr; the suite's own messages are text (its "
    "--json PATH, after --, writes the results)"
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the suite")


def run(args: argparse.Namespace, out: IO[str]) -> int:
    # The suite lives in a source checkout (top-level `benchmarks/`), not in the wheel: import it
    # by name at run time.
    # (Never import benchmarks.__main__: it runs the suite at import.)
    try:
        suite: Callable[[list[str]], object] | None = getattr(
            importlib.import_module("benchmarks"), "main", None
        )
    except ImportError:
        suite = None
    if suite is None:
        raise CliError(
            "the benchmark suite is not importable: run `idemkey bench` (or "
            "`python -m benchmarks`) from a source checkout",
            2,
        )
    rest = list(args.rest)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if args.redis_url and "--redis-url" not in rest:
        rest = ["--redis-url", args.redis_url, *rest]  # else the suite starts its own server
    result = suite(rest)
    return result if isinstance(result, int) else 0
