"""Where the demo runs: its store (a real Redis, or an embedded fakeredis with Lua) and a
threaded werkzeug server on a real port."""

from __future__ import annotations

import importlib.util
import secrets
import shlex
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING

from ..._core import record_for
from ...errors import StoreError
from ...policy import Policy
from ...store import RedisStore
from ...store._url import client_from_url, redacted
from . import payments
from .errors import ListenError, MissingPackageError
from .flask_app import create_app
from .payments import DEFAULT_ACCOUNT

if TYPE_CHECKING:
    from flask import Flask
    from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler

__all__ = ["open_store", "running", "serve"]


def open_store(redis_url: str | None, prefix: str) -> tuple[RedisStore, str, Callable[[], None]]:
    """A store on ``redis_url``, or on an embedded fakeredis server (with Lua) when None.

    Returns the store, a description of where it is (the URL without its password, as it may
    be printed), and a function that closes it.
    """
    policy = payments.demo_policy(prefix)
    if redis_url:
        client = client_from_url(redis_url, source="--redis-url")
        client.ping()  # fail now, with one line, rather than inside the first request
        where = redacted(redis_url)
    else:
        # fakeredis without lupa starts, then answers every EVALSHA with an error: check now.
        if (
            importlib.util.find_spec("fakeredis") is None
            or importlib.util.find_spec("lupa") is None
        ):
            raise MissingPackageError(
                "the embedded store needs fakeredis with Lua (lupa): "
                "pip install 'idemkey-redis[demo]', or pass --redis-url"
            )
        import fakeredis

        client = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=False)
        where = "embedded fakeredis (Lua scripts, in this process)"
    store = RedisStore(client, policy)

    def close() -> None:
        store.close()
        client.close()

    if redis_url:
        try:
            _scripts_run(store, where)
        except BaseException:
            close()
            raise
    return store, where, close


def _scripts_run(store: RedisStore, where: str) -> None:
    """Run one script now, as every request will: a Redis that cannot (a read-only replica, an
    ACL without EVALSHA) fails here with one line, not in each step of the story (a 503 each,
    for a minute). forget.lua on a record no request makes (a random key) writes nothing."""
    import redis

    record = record_for(store.policy.prefix, "", "POST", "/demo-check", secrets.token_hex(16))
    try:
        store.forget(record)
    except StoreError as exc:
        cause = exc.__cause__
        if not isinstance(cause, redis.ResponseError):
            raise  # unreachable or timing out: said as such
        # The server's text: the command line escapes the error it prints (IdemkeyError).
        message = str(cause).splitlines()[0] if str(cause) else ""
        raise StoreError(
            f"{where} cannot run idemkey's scripts ({type(cause).__name__}: {message}); "
            "give --redis-url a primary whose user may run EVALSHA"
        ) from None


@contextmanager
def running(
    app: Flask, host: str = "127.0.0.1", port: int = 0, quiet: bool = True
) -> Iterator[str]:
    """Serve ``app`` on a real port in a thread (threaded server); yields its base URL."""
    from werkzeug.serving import WSGIRequestHandler

    class Quiet(WSGIRequestHandler):
        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            pass

    server = _make_server(host, port, app, Quiet if quiet else None)
    thread = threading.Thread(target=server.serve_forever, name="idemkey-demo", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.socket.getsockname()[1]}"
    finally:
        server.shutdown()
        thread.join(5)
        server.server_close()


def _make_server(
    host: str, port: int, app: Flask, handler: type[WSGIRequestHandler] | None = None
) -> BaseWSGIServer:
    """A threaded werkzeug server on a socket we bind ourselves.

    werkzeug prints a message and calls ``sys.exit(1)`` when it cannot bind; binding first
    turns a busy port into one clear line.
    """
    from werkzeug.serving import make_server

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        listener = socket.create_server((host, port), family=family)
    except OSError as exc:
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    with listener:  # werkzeug works on a duplicate of the descriptor
        return make_server(
            host, port, app, threaded=True, request_handler=handler, fd=listener.fileno()
        )


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    redis_url: str | None = None,
    prefix: str = "idemkey",
    out: IO[str] | None = None,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Run the demo app until interrupted, printing curl commands to try it."""
    out = out if out is not None else sys.stdout
    store, where, close = open_store(redis_url, prefix)
    try:
        server = _make_server(host, port, create_app(store))
        base = f"http://{host}:{server.socket.getsockname()[1]}"
        key = "order-" + secrets.token_hex(3)
        out.write(
            f"idemkey demo app on {base} (store: {where}); Ctrl-C stops it\n\n"
            f"  curl -i -X POST {base}/charges -H 'Idempotency-Key: {key}' \\\n"
            "       -H 'Content-Type: application/json' "
            """-d '{"amount": 1000, "currency": "eur"}'\n"""
            "  # the same again: the stored 201, Idempotent-Replayed: true, no new charge\n"
            "  # -d with another amount: 422; add -H 'Demo-Delay: 5' and send twice: 409\n"
            f"  curl -s {base}/charges\n"
            f"{_inspect_line(key, prefix, redis_url)}\n\n"
        )
        out.flush()
        if ready is not None:
            ready(base)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    finally:
        close()


def _inspect_line(key: str, prefix: str, redis_url: str | None) -> str:
    """The ``idemkey inspect`` command for the curl's record, runnable as printed."""
    if not redis_url:
        return "  # `idemkey inspect` needs a real Redis: start the app with --redis-url"
    words = ["idemkey", "inspect", key, "--scope", DEFAULT_ACCOUNT, "--route", "/charges"]
    if prefix != Policy().prefix:
        words += ["--prefix", prefix]
    if redacted(redis_url) == redis_url:  # nothing hidden in it: the URL runs as printed
        return "  " + shlex.join([*words, "--redis-url", redis_url])
    # A password is never printed, and a redacted URL would not authenticate: inspect reads
    # $IDEMKEY_REDIS_URL when --redis-url is left out (serve never does).
    return (
        "  # with IDEMKEY_REDIS_URL set to your --redis-url (its password is not printed here):\n"
        "  " + shlex.join(words)
    )
