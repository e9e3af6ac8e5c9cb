"""Connections for the commands that talk to Redis (a URL is printed without its password by
the store's ``redacted``, which the demo app, importing nothing of the command line, uses too)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..store._url import redacted
from ..store.diagnostics import _text as text
from ._base import URL_ENV, CliError
from .readable import shown

__all__ = ["Server", "connect", "explain_redis_error", "info", "key_count"]


@dataclass
class Server:
    """The client for a URL and, on a cluster, one plain client per primary."""

    url: str
    client: Any
    nodes: list[tuple[str, Any]]  # (host:port, redis.Redis) for every primary
    cluster: bool

    def close(self) -> None:
        self.client.close()


@contextmanager
def connect(url: str | None) -> Iterator[Server]:
    """Connect to ``url`` (or ``$IDEMKEY_REDIS_URL``); a cluster gets a ``RedisCluster``."""
    import redis

    from ..store._url import client_from_url

    if not url:
        raise CliError(f"no Redis to talk to: pass --redis-url or set {URL_ENV}", 2)
    try:
        probe = client_from_url(url, source="--redis-url")
    except ValueError as exc:
        raise CliError(f"bad --redis-url {redacted(url)}: {exc.__cause__ or exc}", 2) from exc
    try:
        cluster = text(info(probe, "cluster").get("cluster_enabled")) == "1"
    except redis.ResponseError:
        cluster = False  # INFO denied by an ACL: inspect and forget still work
    except BaseException:
        probe.close()
        raise
    if not cluster:
        server = Server(url, probe, [(_address(probe), probe)], False)
    else:
        probe.close()
        client = client_from_url(url, cluster=True, source="--redis-url")
        primaries = client.get_primaries()
        nodes = [(f"{n.host}:{n.port}", n.redis_connection) for n in primaries]
        server = Server(url, client, nodes, True)
    try:
        yield server
    finally:
        server.close()


def _address(client: Any) -> str:
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def info(client: Any, section: str | None = None) -> dict[str, Any]:
    reply: dict[str, Any] = client.info(section) if section else client.info()
    return reply


def key_count(client: Any) -> int:
    """How many keys the server of ``client`` holds (``DBSIZE``). An answer that is no count
    (``"²"``, which ``int`` refuses; no Redis sends one) raises ``InvalidResponse``: a Redis
    error, one line and exit 3, not an internal error."""
    import redis

    reply = client.dbsize()
    if isinstance(reply, int):
        return reply
    raise redis.exceptions.InvalidResponse(f"DBSIZE answered {reply!r:.40}, not a count of keys")


def explain_redis_error(exc: BaseException) -> str:
    """``exc`` in words: its type and first line (escaped: a server's error text is bound for
    the operator's terminal), and what a reply that is not RESP means."""
    import redis

    message = shown(str(exc).splitlines()[0]) if str(exc) else type(exc).__name__
    if isinstance(exc, redis.exceptions.InvalidResponse):
        # redis-py: 'Protocol error, got "<" as reply type byte': something answered, not Redis.
        first = message.rsplit('got "', 1)[-1][:1] if 'got "' in message else ""
        guess = {"H": "an HTTP response", "<": "an HTML page", "\x15": "a TLS alert"}.get(first)
        seen = f" (it sent {guess})" if guess else ""
        return (
            f"this is not a Redis server: its answer is not the Redis protocol{seen}; check "
            f"the host and port, which may belong to another service ({message})"
        )
    return f"{type(exc).__name__}: {message}"
