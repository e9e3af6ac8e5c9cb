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

from typing import Any, Final

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
    unless the URL's query sets its own. A URL redis-py cannot read is a ConfigurationError
    naming ``source`` (where the URL came from)."""
    from redis.backoff import NoBackoff

    options: dict[str, Any] = dict(URL_CLIENT_OPTIONS)
    if asyncio:
        import redis.asyncio
        from redis.asyncio.retry import Retry as AsyncRetry

        factory: Any = redis.asyncio.Redis
        options["retry"] = AsyncRetry(NoBackoff(), URL_CLIENT_RETRIES)
    elif cluster:
        from redis.cluster import RedisCluster

        factory = RedisCluster  # retries across nodes on its own
    else:
        import redis
        from redis.retry import Retry

        factory = redis.Redis
        options["retry"] = Retry(NoBackoff(), URL_CLIENT_RETRIES)
    try:
        return factory.from_url(url, **options)
    except ValueError as exc:
        raise ConfigurationError(f"{source} cannot be used: {exc}") from exc
