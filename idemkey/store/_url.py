"""The clients idemkey makes from a URL: Flask's ``IDEMKEY_REDIS_URL``, Django's
``IDEMKEY["REDIS_URL"]``, the CLI's ``--redis-url`` and the demo apps.

redis-py 5 (the floor pyproject allows) waits for a reply forever by default, so a server
that accepts connections and never answers would hang a request for good, even one whose
handler already ran (its completion is written before the response goes out). Every client
made here has a connect timeout, a read timeout and one immediate retry; a URL that sets its
own (``?socket_timeout=5&socket_connect_timeout=2``) wins, since redis-py applies the URL's
options over the keyword arguments.
"""

from __future__ import annotations

import math
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

from ..errors import ConfigurationError

__all__ = ["URL_CLIENT_OPTIONS", "URL_CLIENT_RETRIES", "client_from_url"]

#: Seconds to open a connection, and to wait for each reply. Every script idemkey sends is a
#: few hash operations, answered in well under a millisecond by a healthy server; a blocking
#: wait for an in-flight claim keeps its reads under half of the read timeout (see _base).
URL_CLIENT_OPTIONS: Final = {"socket_connect_timeout": 1.0, "socket_timeout": 1.0}
#: Retries after a failed attempt, with no backoff (redis-py 8 defaults to 3 with backoff up
#: to 10 s). Safe: every script answers a re-send by its owner as it answered the first.
URL_CLIENT_RETRIES: Final = 1


def client_from_url(
    url: str, *, asyncio: bool = False, cluster: bool = False, source: str = "the Redis URL"
) -> Any:
    """A ``redis.Redis`` (``redis.asyncio.Redis`` with ``asyncio=True``; a
    ``redis.cluster.RedisCluster`` with ``cluster=True``) for ``url``, with the timeouts above
    unless the URL's query sets its own. A URL redis-py cannot read, or whose options no
    connection can use, is a ConfigurationError naming ``source`` (where the URL came from),
    raised here without connecting: not at the first request."""
    import redis
    from redis.backoff import NoBackoff

    if not isinstance(url, str):
        raise ConfigurationError(
            f"{source} cannot be used: expected a URL string such as "
            f"'redis://localhost:6379/0', got {type(url).__name__}"
        )
    options: dict[str, Any] = dict(URL_CLIENT_OPTIONS)
    pool: Any = redis.ConnectionPool
    if asyncio:
        import redis.asyncio
        from redis.asyncio.retry import Retry as AsyncRetry

        factory: Any = redis.asyncio.Redis
        pool = redis.asyncio.ConnectionPool
        options["retry"] = AsyncRetry(NoBackoff(), URL_CLIENT_RETRIES)
    elif cluster:
        from redis.cluster import RedisCluster

        factory = RedisCluster  # retries across nodes on its own
    else:
        from redis.retry import Retry

        factory = redis.Redis
        options["retry"] = Retry(NoBackoff(), URL_CLIENT_RETRIES)
    try:
        _check_connection(url, pool.from_url(url, **options))
    except (TypeError, ValueError, redis.RedisError) as exc:  # no I/O yet: all configuration
        raise ConfigurationError(f"{source} cannot be used: {exc}") from exc
    try:
        return factory.from_url(url, **options)  # a cluster connects here: its errors are I/O's
    except ValueError as exc:
        raise ConfigurationError(f"{source} cannot be used: {exc}") from exc


def _check_connection(url: str, pool: Any) -> None:
    """Make (not open) the connection ``pool`` would, so an option no connection takes (a
    typo such as ``?sockettimeout=2``, ``?protocol=9``) fails now, and refuse what redis-py
    lets through to fail later or never: a negative, zero or infinite timeout (0 makes the
    socket non-blocking: every connect and read fails), a database that is no number (redis-py
    drops ``/abc`` and uses database 0) or out of range."""
    kwargs = pool.connection_kwargs
    for name in ("socket_timeout", "socket_connect_timeout"):
        value = kwargs.get(name)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    parts = urlsplit(url)
    path = unquote(parts.path).replace("/", "")
    if parts.scheme.lower() == "unix":
        if not kwargs.get("path"):
            raise ValueError("a unix:// URL needs the socket's path: unix:///run/redis.sock")
    elif path and "db" not in parse_qs(parts.query) and "db" not in kwargs:
        raise ValueError(f"the database in the URL's path must be a number, got {path!r}")
    db = kwargs.get("db", 0)
    if not 0 <= db < 2**31:
        raise ValueError(f"the database must be a number >= 0 and < 2**31, got {db!r}")
    try:
        pool.connection_class(**kwargs)
    except TypeError as exc:
        raise ValueError(f"an option of the URL's query is not a connection's: {exc}") from exc
