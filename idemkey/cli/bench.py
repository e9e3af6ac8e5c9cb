"""``idemkey bench -- ARGS``: the benchmark suite of a source checkout.

The suite is not in the wheel: it is the top-level ``benchmarks/`` package beside the
``idemkey/`` package that is running, and only that one. A ``benchmarks`` package found
elsewhere on the path (the current directory, another project) is never imported.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Final

from ._base import CliError

HELP: Final = (
    "run the benchmark suite of a source checkout (python -m benchmarks; a private "
    "redis-server unless --redis-url is given)"
)

REDIS_URL_HELP: Final = (
    "a Redis to benchmark against (default: a private redis-server the suite starts; "
    "$IDEMKEY_REDIS_URL is not used)"
)
JSON_HELP: Final = (
    "idemkey's errors as one JSON object on stderr; the suite's own messages are text (its "
    "--json PATH, after --, writes the results)"
)


#: What an installed idemkey says, where no checkout holds the suite.
NOT_A_CHECKOUT: Final = (
    "idemkey bench runs the benchmark suite of a source checkout, and this idemkey is installed "
    "from a package ({where}): clone the repository and run `python -m benchmarks` "
    "or `idemkey bench` from it"
)


def checkout() -> Path | None:
    """The source checkout the running ``idemkey`` package sits in, if it holds the suite."""
    root = Path(__file__).resolve().parent.parent.parent
    return root if (root / "benchmarks" / "__init__.py").is_file() else None


def suite_of(root: Path) -> Callable[[list[str]], object]:
    """``benchmarks.main`` of the checkout at ``root``; never another ``benchmarks``.

    benchmarks.__main__ is never imported: it runs the suite at import.
    """
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        loaded = importlib.import_module("benchmarks")
    except ImportError as exc:
        raise CliError(f"the benchmark suite in {root} is not importable: {exc}", 2) from None
    where = Path(getattr(loaded, "__file__", "") or "").resolve().parent
    if where != root / "benchmarks":
        raise CliError(
            f"the `benchmarks` package imported is {where}, not this checkout's "
            f"({root / 'benchmarks'}): run `python -m benchmarks` from {root}",
            2,
        )
    suite: Callable[[list[str]], object] = loaded.main
    return suite


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the suite")


def _options(parser: argparse.ArgumentParser) -> dict[str, bool]:
    """Each option string of ``parser`` -> whether it takes a value."""
    return {
        name: action.nargs != 0
        for action in parser._actions  # argparse keeps no public list of them
        for name in action.option_strings
    }


def suite_arguments(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` with ``--`` put where the suite's arguments begin after ``bench``: at its first
    argument that is none of bench's own options, so ``idemkey bench --quick`` is
    ``idemkey bench -- --quick`` (argparse would refuse ``--quick`` as bench's own). Any other
    command line comes back as it was."""
    top, i = _options(parser), 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        i += 2 if top.get(argv[i]) else 1  # a global option, and its value if it takes one
    if i >= len(argv) or argv[i] != "bench":
        return argv
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    own, j = _options(sub.choices["bench"]), i + 1
    while j < len(argv) and argv[j] != "--":
        name = argv[j].split("=", 1)[0]
        if name not in own:
            return [*argv[:j], "--", *argv[j:]]
        j += 2 if own[name] and "=" not in argv[j] else 1
    return argv


def run(args: argparse.Namespace, out: IO[str]) -> int:
    root = checkout()
    if root is None:
        raise CliError(NOT_A_CHECKOUT.format(where=Path(__file__).resolve().parent.parent), 2)
    suite = suite_of(root)
    rest = list(args.rest)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if args.redis_url and "--redis-url" not in rest:
        rest = ["--redis-url", args.redis_url, *rest]  # else the suite starts its own server
    result = suite(rest)
    return result if isinstance(result, int) else 0
