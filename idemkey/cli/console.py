"""``idemkey console``: serve the read-only web console of a prefix on 127.0.0.1."""

from __future__ import annotations

import argparse
from typing import IO, Final

from ..policy import Policy
from ..store import RedisStore
from ._base import CliError
from ._redis import connect, redact

HELP: Final = "serve a read-only web page of the records and uncertain outcomes (127.0.0.1)"
INSTALL: Final = "pip install 'idemkey-redis[console]'"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1 only)"
    )
    parser.add_argument("--port", type=int, default=8089, help="port (default: 8089)")
    parser.add_argument(
        "--refresh", type=float, default=3.0, help="seconds between refreshes (default: 3)"
    )
    parser.add_argument(
        "--allow-forget",
        action="store_true",
        help="let the page forget a lapsed or released record (after a confirmation)",
    )


def run(args: argparse.Namespace, out: IO[str]) -> int:
    if not 0 < args.port <= 65535:
        raise CliError("--port must be between 1 and 65535", 2)
    if not args.refresh >= 0.5:
        raise CliError("--refresh must be at least 0.5 seconds", 2)
    try:
        import uvicorn

        from ..console import create_app
    except ImportError as exc:
        raise CliError(
            f"the console needs Starlette, Jinja2 and uvicorn: {INSTALL} ({exc})", 2
        ) from None
    with connect(args.redis_url) as server:
        store = RedisStore(server.client, Policy(prefix=args.prefix))
        app = create_app(store, refresh=args.refresh, allow_forget=args.allow_forget)
        mode = "forget allowed" if args.allow_forget else "read-only"
        out.write(
            f"idemkey console for prefix {args.prefix!r} on {redact(args.redis_url)} ({mode}): "
            f"http://{args.host}:{args.port}/ (Ctrl-C to stop)\n"
        )
        out.flush()
        try:
            uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
        finally:
            store.close()
    return 0
