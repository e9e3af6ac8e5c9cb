"""``idemkey console``: serve the read-only web console of a prefix on 127.0.0.1.

The console answers only requests whose ``Host`` names the address it serves (DNS rebinding,
see ``idemkey/console/_guard.py``), and listens on a loopback address unless the operator
passes ``--unsafe-expose``: it has no authentication. The port is bound before anything is
printed, so a port in use is one line and exit status 2, not a banner and a crash.
"""

from __future__ import annotations

import argparse
import errno
import socket
import sys
from typing import IO, Final

from ..errors import ConfigurationError
from ..policy import Policy
from ..store import RedisStore
from ..store._url import redacted
from ._base import CliError
from ._redis import connect
from ._refresh import MAX_REFRESH, MIN_REFRESH, refresh_seconds

HELP: Final = "serve a read-only web page of the records and uncertain outcomes (127.0.0.1)"
DESCRIPTION: Final = (
    HELP + ". It answers only requests whose Host names the address it listens on (127.0.0.1, "
    "localhost, [::1] with --port, and each --allow-host): a web site that rebinds a name of its "
    "own to 127.0.0.1 gets a 400. With --allow-forget, a forget must come from the console's "
    "own page (its Origin and a token made afresh by each console process). The console has no "
    "authentication: it listens on loopback only unless --unsafe-expose."
)
INSTALL: Final = "pip install 'idemkey-redis[console]'"
UNSAFE: Final = (
    "the console has no authentication: anyone who reaches {where} reads every record's "
    "route, scope, steps and error texts{forget}"
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="loopback address to listen on (default: 127.0.0.1; localhost and ::1 too; any "
        "other needs --unsafe-expose)",
    )
    parser.add_argument("--port", type=int, default=8089, help="port (default: 8089)")
    parser.add_argument(
        "--refresh",
        type=float,
        default=3.0,
        help=f"seconds between refreshes, {MIN_REFRESH:g} to {MAX_REFRESH:g} (a day; default: 3)",
    )
    parser.add_argument(
        "--allow-forget",
        action="store_true",
        help="let the page forget a lapsed or released record (after a confirmation)",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME[:PORT]",
        help="also answer requests for this Host (an SSH tunnel's localhost:9000, this "
        "machine's name); by default only 127.0.0.1, localhost and [::1] with --port",
    )
    parser.add_argument(
        "--unsafe-expose",
        action="store_true",
        help="UNSAFE: allow a --host that is not loopback (0.0.0.0 serves the network) for a "
        "console that has NO authentication: whoever reaches the port reads every record",
    )


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound and listening now: a port in use is a CliError before any
    banner."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        sock.bind((host.strip("[]"), port))
        # Listening takes the port: Linux lets two SO_REUSEADDR sockets bind one address while
        # neither listens, so a second console started while this one still connects to Redis
        # was not refused here (uvicorn listened only later, and one of them failed then).
        sock.listen(2048)  # uvicorn's default backlog
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise CliError(
                f"port {port} on {host} is in use (another console?): choose another with --port",
                2,
            ) from None
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", 2) from None
    sock.set_inheritable(True)
    return sock


def run(args: argparse.Namespace, out: IO[str]) -> int:
    if not 0 < args.port <= 65535:
        raise CliError("--port must be between 1 and 65535", 2)
    try:
        refresh = refresh_seconds(args.refresh, "--refresh")
    except ConfigurationError as exc:
        raise CliError(str(exc), 2) from None
    try:
        import uvicorn

        from ..console import create_app, is_loopback
    except ImportError as exc:
        raise CliError(
            f"the console needs Starlette, Jinja2 and uvicorn: {INSTALL} ({exc})", 2
        ) from None
    exposed = not is_loopback(args.host)
    forget = ", and forgets records" if args.allow_forget else ""
    if exposed and not args.unsafe_expose:
        where = f"{args.host}:{args.port}"
        raise CliError(
            f"refusing to listen on {args.host}, which is not a loopback address: "
            + UNSAFE.format(where=where, forget=forget)
            + " (pass --unsafe-expose to do it anyway, or use an SSH tunnel to 127.0.0.1)",
            2,
        )
    sock = _bind(args.host, args.port)
    try:
        with connect(args.redis_url) as server:
            store = RedisStore(server.client, Policy(prefix=args.prefix))
            app = create_app(
                store,
                refresh=refresh,
                allow_forget=args.allow_forget,
                host=args.host,
                port=args.port,
                allow_hosts=args.allow_host,
            )
            mode = "forget allowed" if args.allow_forget else "read-only"
            if exposed:
                where = f"port {args.port} on {args.host}"
                sys.stderr.write(
                    f"WARNING: {UNSAFE.format(where=where, forget=forget)} "
                    "(--unsafe-expose; unauthenticated)\n"
                )
            on = redacted(args.redis_url)
            out.write(
                f"idemkey console for prefix {args.prefix!r} on {on} ({mode}): "
                f"http://{_url_host(args.host)}:{args.port}/ (Ctrl-C to stop)\n"
            )
            out.flush()
            config = uvicorn.Config(app, log_level="warning")
            try:
                uvicorn.Server(config).run(sockets=[sock])
            finally:
                store.close()
    finally:
        sock.close()
    return 0


def _url_host(host: str) -> str:
    return f"[{host.strip('[]')}]" if ":" in host else host
