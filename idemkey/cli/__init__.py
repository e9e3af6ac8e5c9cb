"""The ``idemkey`` command: the demo, the probe, and the tools an operator needs around records.

::

    idemkey demo                      play the retry story against the demo payments app
    idemkey serve [--port N]          run the demo app for curl
    idemkey probe URL [--data BODY]   check any endpoint's retry behaviour over HTTP
    idemkey inspect KEY --scope S --route /charges     one record, decoded (without --scope:
                                      the default scope of no credentials, and the empty one)
    idemkey list [--state S] [--route R] [--uncertain] records with state, lease, age, steps
    idemkey forget KEY ... [--yes] [--force]           delete one record
    idemkey cancel KEY ... [--abandon] [--yes]         stop a run: its owner cannot complete it
    idemkey stats                     records by state, memory, TTLs (SCAN, never KEYS)
    idemkey console [--allow-forget]  a read-only web page of the records (loopback only)
    idemkey doctor                    is this Redis fit to hold idempotency records?
    idemkey bench -- ARGS             the benchmark suite (source checkouts)
    idemkey --version                 the installed version

One module per command (``idemkey/cli/<command>.py``, ``listing.py`` for ``list``: ``HELP``,
``configure(parser)``, ``run(args, out)``); the demo app lives in :mod:`idemkey.cli.demo_app`,
and ``readable.py`` holds the formats the console's page shares (durations, sizes, times).

Exit codes: 0 success; 1 a check failed (doctor FAIL, a probe check failed, a demo step
misbehaved, no such record, forget refused); 2 bad arguments (a ``--prefix`` Policy refuses,
a ``--redis-url`` that cannot be parsed, and a change of records without ``--yes`` when stdin
is not a terminal, a console port in use or a non-loopback ``--host`` without
``--unsafe-expose``); 3 Redis (or, for probe, the
endpoint) unreachable or erroring; 4 a probe was inconclusive (no check failed, but one could
not tell a replay from a second execution); 70 a bug in idemkey (``IDEMKEY_DEBUG=1`` shows
its traceback); 130 interrupted (143 for bench: SIGTERM). Every error is one line on stderr,
never a traceback; with ``--json``, one JSON object (``command``, ``error``, ``exit_code``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import IO, Final

from .. import _DISTRIBUTION, __version__
from ..errors import ConfigurationError, IdemkeyError
from ..policy import Policy
from ..store._url import redacted
from . import bench, cancel, console, demo, doctor, forget, inspect, listing, probe, serve, stats
from ._base import DEBUG_ENV, URL_ENV, CliError, Parser, UsageError
from ._redis import explain_redis_error
from .readable import shown

__all__ = ["CliError", "build_parser", "main"]

#: The commands in the order --help lists them.
COMMANDS: Final[dict[str, ModuleType]] = {
    "demo": demo,
    "serve": serve,
    "probe": probe,
    "inspect": inspect,
    "list": listing,
    "forget": forget,
    "cancel": cancel,
    "stats": stats,
    "console": console,
    "doctor": doctor,
    "bench": bench,
}
#: Commands that never read $IDEMKEY_REDIS_URL: the demo and the benchmarks write records of
#: their own only into a Redis named on the command line (never into what may be production),
#: and probe talks HTTP, not Redis.
NO_REDIS_FROM_ENV: Final = frozenset({"demo", "serve", "bench", "probe"})


def _global_options(
    parser: argparse.ArgumentParser, *, defaults: bool, redis: bool, module: ModuleType | None
) -> None:
    # Added to the main parser and to every subcommand, so `idemkey inspect K --json` works as
    # well as `idemkey --json inspect K`; subcommands SUPPRESS defaults so they do not override.
    # A command may say what its --redis-url and --json mean (REDIS_URL_HELP, JSON_HELP): the
    # demo, serve and bench never read $IDEMKEY_REDIS_URL.
    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    if redis:
        parser.add_argument(
            "--redis-url",
            default=default(None),
            metavar="URL",
            help=getattr(module, "REDIS_URL_HELP", None)
            or f"redis://, rediss:// or unix:// URL (default: ${URL_ENV}"
            + (", which demo, serve and bench never read)" if module is None else ")"),
        )
        parser.add_argument(
            "--prefix",
            default=default("idemkey"),
            help="key prefix of the records (Policy.prefix; default: idemkey)",
        )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help=getattr(
            module, "JSON_HELP", "machine-readable output; errors as one JSON object on stderr"
        ),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="idemkey",
        description="Idempotency keys backed by Redis: demo, probe and operator tools.",
        epilog="exit codes: 0 ok, 1 check failed, 2 bad arguments (a --prefix or --redis-url "
        "that cannot work too), 3 Redis (or the probed endpoint) unreachable or erroring, "
        "4 probe inconclusive, 70 a bug in idemkey, 130 interrupted",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"idemkey {__version__} (the {_DISTRIBUTION} distribution)",
        help="print the installed version and exit",
    )
    _global_options(parser, defaults=True, redis=True, module=None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for name, module in COMMANDS.items():
        command = sub.add_parser(
            name,
            help=module.HELP,
            description=getattr(module, "DESCRIPTION", module.HELP),
            epilog=getattr(module, "EPILOG", None),
            formatter_class=getattr(module, "FORMATTER", argparse.HelpFormatter),
        )
        _global_options(command, defaults=False, redis=name != "probe", module=module)
        module.configure(command)
        command.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    parser = build_parser()
    out = sys.stdout
    argv = bench.suite_arguments(parser, list(sys.argv[1:] if argv is None else argv))
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        # No parsed --json to read: a usage error is JSON when --json is on the line at all.
        command = next((a for a in argv if a in COMMANDS), None)
        if command is None and "--json" not in argv and "required: COMMAND" in str(exc):
            # A bare `idemkey` (or options only): the commands it offers, then the error, as
            # argparse prints its usage before its error.
            sys.stderr.write(parser.format_help() + "\n")
        return _error(command, str(exc), 2, as_json="--json" in argv, prefixed=True)
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    try:
        # Checked once, here, by Policy's own converter: every command that takes a prefix
        # (stats, doctor and inspect --digest build no Policy, and read nothing under a bad one).
        Policy(prefix=args.prefix)
    except ConfigurationError as exc:
        return _error(args.command, f"bad --prefix: {exc}", 2, as_json=args.json)
    if args.redis_url is None and args.command not in NO_REDIS_FROM_ENV:
        args.redis_url = os.environ.get(URL_ENV) or None
    return _run(args, out)


def _error(
    command: str | None, message: str, code: int, *, as_json: bool, prefixed: bool = False
) -> int:
    """Report one error on stderr: one line of text, or one JSON object under ``--json``."""
    if as_json:
        text = message.split(": ", 1)[1] if prefixed and ": " in message else message
        line = json.dumps({"command": command, "error": text, "exit_code": code})
    else:
        line = message if prefixed else f"idemkey {command}: {message}"
    sys.stderr.write(line + "\n")
    return code


def _run(args: argparse.Namespace, out: IO[str]) -> int:
    import redis

    def fail(message: str, code: int) -> int:
        return _error(args.command, message, code, as_json=args.json)

    def raised_reading_a_reply(exc: ValueError) -> bool:
        # Raised inside redis-py's reply parsing (redis._parsers: the parsers and the
        # per-command callbacks) it says what the server sent; raised by idemkey's own code it
        # is a bug (exit 70). The innermost frame tells which.
        import redis._parsers

        innermost = exc.__traceback__
        while innermost is not None and innermost.tb_next is not None:
            innermost = innermost.tb_next
        if innermost is None:
            return False
        where = os.path.dirname(os.path.abspath(innermost.tb_frame.f_code.co_filename))
        return where == os.path.dirname(os.path.abspath(redis._parsers.__file__))

    try:
        code: int = args.run(args, out)
        return code
    except CliError as exc:
        return fail(str(exc), exc.code)
    except BrokenPipeError:
        # `idemkey stats | head`: the reader left; say nothing more, as shell tools do.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - stays open until exit
        return 141
    except (redis.RedisError, OSError) as exc:
        where = redacted(args.redis_url) if args.redis_url else "Redis"
        return fail(f"{where}: {explain_redis_error(exc)}", 3)
    except ConfigurationError as exc:  # an option that cannot work: a bad argument, not Redis
        return fail(f"{type(exc).__name__}: {exc}", 2)
    except IdemkeyError as exc:  # a StoreError quotes Redis's text: escaped for the terminal
        return fail(f"{type(exc).__name__}: {shown(str(exc))}", 3)
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except Exception as exc:
        message = str(exc).splitlines()[0] if str(exc) else ""
        if isinstance(exc, ValueError) and raised_reading_a_reply(exc):
            # redis-py's reply callbacks convert as they read (TIME: int() of each part): a
            # server that sends what Redis never does (a "²") gets a ValueError, not a RedisError.
            where = redacted(args.redis_url) if args.redis_url else "Redis"
            return fail(
                f"{where}: an answer idemkey cannot read, not what Redis sends "
                f"(ValueError: {shown(message)}); check the host and port",
                3,
            )
        # A bug of ours: still one line, unless asked for the traceback.
        if os.environ.get(DEBUG_ENV):
            raise
        return fail(
            f"internal error: {type(exc).__name__}: {message} "
            f"(set {DEBUG_ENV}=1 for the traceback)",
            70,
        )
