"""What every command shares: the CLI's error type, the argument parser, JSON output."""

from __future__ import annotations

import argparse
import json
import sys
from typing import IO, Final, NoReturn

__all__ = [
    "DEBUG_ENV",
    "URL_ENV",
    "CliError",
    "Parser",
    "UsageError",
    "YES_HELP",
    "confirm",
    "consent",
    "print_json",
]

URL_ENV: Final = "IDEMKEY_REDIS_URL"
DEBUG_ENV: Final = "IDEMKEY_DEBUG"
#: The help of ``--yes``, the option of every command that asks for :func:`consent`.
YES_HELP: Final = "act without asking (needed when stdin is not a terminal: cron, pipes, CI)"


class CliError(Exception):
    """An error a command reports as one line on stderr, with its exit code.

    Raised only by the command modules of :mod:`idemkey.cli`; the demo app has its own error
    type (:class:`idemkey.cli.demo_app.DemoError`), which the demo commands translate.
    """

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class UsageError(Exception):
    """A command line argparse refused: one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so errors stay one line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see --help)")


def confirm(question: str) -> bool:
    """Ask a yes/no question on stderr; only ``y`` or ``yes`` on stdin says yes."""
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def consent(yes: bool, question: str, *, verb: str, nothing: str) -> None:
    """Go on only with the operator's consent to a change of records: ``--yes``, or ``y`` to
    ``question`` on a terminal. Without a terminal (a cron job, a pipe, ``ssh host idemkey``,
    a CI step) nobody can answer, so the command refuses rather than acts unasked (as
    ``apt-get`` and ``git clean`` do): a CliError naming ``--yes``, exit status 2."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise CliError(
            f"stdin is not a terminal, so nobody can confirm: pass --yes to {verb} without "
            f"asking; {nothing}",
            2,
        )
    if not confirm(question):
        raise CliError(f"not confirmed; {nothing}")


def print_json(data: object, out: IO[str]) -> None:
    json.dump(data, out, indent=2, sort_keys=False, default=str)
    out.write("\n")
