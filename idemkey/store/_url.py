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
import re
from typing import Any, Final
from urllib.parse import parse_qs, unquote, unquote_plus, urlsplit

from ..errors import ConfigurationError

__all__ = ["URL_CLIENT_OPTIONS", "URL_CLIENT_RETRIES", "client_from_url", "redacted"]

#: Seconds to open a connection, and to wait for each reply. Every script idemkey sends is a
#: few hash operations, answered in well under a millisecond by a healthy server; a blocking
#: wait for an in-flight claim keeps its reads under half of the read timeout (see _base).
URL_CLIENT_OPTIONS: Final = {"socket_connect_timeout": 1.0, "socket_timeout": 1.0}
#: Retries after a failed attempt, with no backoff (redis-py 8 defaults to 3 with backoff up
#: to 10 s). Safe: every script answers a re-send by its owner as it answered the first.
URL_CLIENT_RETRIES: Final = 1
#: Why a URL with an '@' after its host is refused. Quoting any of the URL could print the
#: password: the text before the '@' is the password's, or its tail.
UNENCODED_USER_INFORMATION: Final = (
    "the URL has an '@' after its host: a '/', '?' or '#' in a user name or password ends the "
    "host early, so they must be percent-encoded (urllib.parse.quote(password, safe='')); an "
    "'@' in the path or the query is written %40"
)
#: A query key whose value is a secret: redis-py's ``password`` and ``ssl_password`` (the
#: private key's passphrase), in any case and spelling, and keys no connection takes that are
#: printed in the refusal of the URL (``PASSWORD=``, ``token=``).
_SECRET_KEY: Final = re.compile(r"passw|secret|token", re.IGNORECASE)
#: Such a key and its '=', in a URL's text (the '@'-after-the-host case).
_SECRET_PAIR: Final = re.compile(r"(?:passw|secret|token)[^=&?#]*=", re.IGNORECASE)
#: Put in place of a port or database that is no number, in a URL with user information.
_NOT_SHOWN: Final = "the value is left out: the URL holds a user name or password"


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
        _check_user_information(url)
        _check_connection(url, pool.from_url(url, **options))
    except (TypeError, ValueError, redis.RedisError) as exc:  # no I/O yet: all configuration
        raise ConfigurationError(f"{source} cannot be used: {exc}") from exc
    try:
        return factory.from_url(url, **options)  # a cluster connects here: its errors are I/O's
    except ValueError as exc:
        raise ConfigurationError(f"{source} cannot be used: {exc}") from exc


def _check_user_information(url: str) -> None:
    """Refuse a URL with an '@' after its host: a password with an unencoded '/', '?' or '#'
    ends the host early, so redis-py reads part of it as the host, the port (and quotes it:
    ``Port could not be cast to integer value as 'Zm9v'``) or the database, or, after a '#',
    takes the URL and connects without it. With user information, urllib's message about a
    port that is no number (it quotes the value) is replaced."""
    if "@" not in url:
        return
    parts = urlsplit(url)
    if "@" in parts.path + parts.query + parts.fragment:
        raise ValueError(UNENCODED_USER_INFORMATION)
    try:
        parts.port  # noqa: B018 - read for its ValueError
    except ValueError as exc:
        out_of_range = "out of range" in str(exc)
    else:
        return
    # Raised outside the handler: no __context__ keeps urllib's message, which quotes the port.
    said = (
        "Port out of range 0-65535" if out_of_range else "Port could not be cast to integer value"
    )
    raise ValueError(f"{said} ({_NOT_SHOWN})")


def redacted(url: str) -> str:
    """``url`` with its password (``user:password@``) and the value of every query key that
    names a secret (redis-py's ``?password=`` and ``?ssl_password=``, in any case or
    percent-encoding, and any key with ``passw``, ``secret`` or ``token`` in it: one redis-py
    refuses is printed in the refusal) replaced by ``***``, for printing; with an '@' after the
    host (an unencoded password), all from ``://`` to the last '@'. Never raises: a port that
    is no port (``:99999``, ``:abc``) is a bad argument, printed as given once the password is
    gone."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if "@" in parts.path + parts.query + parts.fragment:
        head, _, tail = url.rpartition("@")
        scheme, sep, _ = head.partition("://")
        if not sep:  # no scheme: no URL redis-py takes, shown only to say where it went wrong
            return "***" if _SECRET_PAIR.search(unquote_plus(url)) else f"***@{tail}"
        if _SECRET_PAIR.search(unquote_plus(head)):  # the '@' may end a query password's tail
            return f"{scheme}://***"
        shown = redacted(f"{scheme}://{tail}")
        before, sep, after = shown.partition("://")
        return f"{before}://***@{after}" if sep else shown
    pairs = parts.query.split("&")
    hidden_pairs = [_hidden_pair(pair) for pair in pairs]
    if parts.password is None and hidden_pairs == pairs:
        return url  # nothing to hide: as given
    netloc = parts.netloc
    if parts.password is not None:
        # Host and port as written, not parsed (``parts.port`` raises on a bad one): the
        # netloc after its last "@", where the user information, and so the password, ends.
        netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
    query = f"?{'&'.join(hidden_pairs)}" if parts.query else ""
    fragment = f"#{parts.fragment}" if parts.fragment else ""
    return f"{parts.scheme}://{netloc}{parts.path}{query}{fragment}"  # "//" kept: unix:///p


def _hidden_pair(pair: str) -> str:
    """A query's ``key=value`` with the value hidden if its key names a secret, read as
    redis-py reads it (parse_qs: '+' a space, then percent-decoded); the key as written, so
    the URL still says where its password was."""
    key, equals, _ = pair.partition("=")
    return f"{key}=***" if equals and _SECRET_KEY.search(unquote_plus(key)) else pair


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
        got = _NOT_SHOWN if "@" in url else f"got {path!r}"
        raise ValueError(f"the database in the URL's path must be a number, {got}")
    db = kwargs.get("db", 0)
    if not 0 <= db < 2**31:
        got = _NOT_SHOWN if "@" in url else f"got {db!r}"
        raise ValueError(f"the database must be a number >= 0 and < 2**31, {got}")
    try:
        pool.connection_class(**kwargs)
    except TypeError as exc:
        raise ValueError(f"an option of the URL's query is not a connection's: {exc}") from exc
