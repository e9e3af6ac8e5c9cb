"""``idemkey demo``: play the retry story against the demo payments app on a real port."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import IO, Final

from ._base import CliError

HELP: Final = (
    "play the retry story against the demo payments app (embedded store unless "
    "--redis-url is given; $IDEMKEY_REDIS_URL is not used)"
)
#: The demo writes records only into a Redis named on its command line, never $IDEMKEY_REDIS_URL.
REDIS_URL_HELP: Final = (
    "a redis://, rediss:// or unix:// URL to keep the demo's records in (default: an embedded "
    "fakeredis; $IDEMKEY_REDIS_URL is not used: it may name production)"
)


def configure(parser: argparse.ArgumentParser) -> None:
    pass


def load_demo(*, story: bool = False) -> ModuleType:
    """The demo package, once Flask and werkzeug (and httpx, for the ``story`` that retries
    through idemkey.client) are known to be installed."""
    try:
        import flask  # noqa: F401
        import werkzeug  # noqa: F401
    except ImportError as exc:
        message = f"the demo app needs {exc.name}: pip install 'idemkey-redis[demo]'"
        raise CliError(message, 2) from None
    if story:
        try:
            import httpx  # noqa: F401
        except ImportError:
            raise CliError("the demo needs httpx: pip install 'idemkey-redis[demo]'", 2) from None
    from . import demo_app

    return demo_app


@contextmanager
def demo_errors() -> Iterator[None]:
    """The demo's errors as the CLI's: a missing package is a usage error (exit 2)."""
    from .demo_app import DemoError, MissingPackageError

    try:
        yield
    except MissingPackageError as exc:
        raise CliError(str(exc), 2) from None
    except DemoError as exc:
        raise CliError(str(exc)) from None


def run(args: argparse.Namespace, out: IO[str]) -> int:
    demo = load_demo(story=True)
    with demo_errors():
        ok = demo.run_story(
            redis_url=args.redis_url,
            prefix=args.prefix,
            out=out,
            as_json=args.json,
        )
    return 0 if ok else 1
