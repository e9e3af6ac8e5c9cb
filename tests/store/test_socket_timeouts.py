"""The read timeout the store plans around is the one the client's connections use.

``Replicas(timeout=...)`` must end within it (a WAIT the read cuts short leaves a claim applied
and unanswered), and a waiter's XREAD BLOCK must end well within it (else every block is a
failed read). redis-py 8.2 reads with 5 s by default but writes no ``socket_timeout`` into the
pool's arguments of a client made with ``from_url``: the store saw none, so ``Replicas(1, 4.9)``
was accepted on ``from_url(url)`` and refused on ``from_url(url + "?socket_timeout=5")``, and
waiters blocked 5 s on a 5 s read. On redis-py 5 (the floor) such a client has no timeout, and
the store must still see none.

Each case compares the store's view with the timeout of a real connection to the session Redis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio

from idemkey import AsyncRedisStore, ConfigurationError, Policy, RedisStore
from idemkey.policy import Replicas
from idemkey.store._url import client_from_url


def _socket_read_timeout(client: redis.Redis) -> float | None:
    """The timeout on the socket of a connection the client's pool makes, once connected."""
    connection = client.connection_pool.make_connection()
    try:
        connection.connect()
        return connection._sock.gettimeout()  # type: ignore[attr-defined, no-any-return]
    finally:
        connection.disconnect()


async def _async_read_timeout(client: redis.asyncio.Redis) -> float | None:
    """The timeout an asyncio connection of the client's pool reads with, once connected."""
    connection = client.connection_pool.make_connection()
    try:
        await connection.connect()
        return connection.socket_timeout  # type: ignore[no-any-return]
    finally:
        await connection.disconnect()


def _expected_block_cap(timeout: float | None) -> float:
    """A block ends 200 ms and half the read timeout before it: at most 5 s."""
    if timeout is None:
        return 5.0
    return min(5.0, timeout - 0.2, timeout / 2)


def _address(url: str) -> dict[str, Any]:
    """The keyword arguments of ``url`` a client made without a URL takes: no timeout."""
    parsed = redis.connection.parse_url(url)
    return {k: v for k, v in parsed.items() if k in ("host", "port", "username", "password")}


SYNC_CLIENTS: dict[str, Callable[[str], Any]] = {
    "from_url": lambda url: redis.Redis.from_url(url),
    "from_url, ?socket_timeout=2": lambda url: redis.Redis.from_url(url + "?socket_timeout=2"),
    "Redis(host, port)": lambda url: redis.Redis(**_address(url)),
    "Redis(socket_timeout=None)": lambda url: redis.Redis.from_url(url, socket_timeout=None),
    "idemkey's from a URL": client_from_url,
}


@pytest.mark.parametrize("make", SYNC_CLIENTS.values(), ids=SYNC_CLIENTS)
def test_the_store_plans_around_the_read_timeout_its_connections_use(
    redis_url: str, make: Callable[[str], Any]
) -> None:
    client = make(redis_url)
    try:
        timeout = _socket_read_timeout(client)
        accepted = _check_replicas_bound(lambda policy: RedisStore(client, policy), timeout)
        store = RedisStore(client, Policy())
        try:
            assert store._block_cap == pytest.approx(_expected_block_cap(timeout))
        finally:
            for made in (store, accepted):
                made.close()
    finally:
        client.close()


ASYNC_CLIENTS: dict[str, Callable[[str], Any]] = {
    "from_url": lambda url: redis.asyncio.Redis.from_url(url),
    "from_url, ?socket_timeout=2": lambda url: redis.asyncio.Redis.from_url(
        url + "?socket_timeout=2"
    ),
    "idemkey's from a URL": lambda url: client_from_url(url, asyncio=True),
}


@pytest.mark.parametrize("make", ASYNC_CLIENTS.values(), ids=ASYNC_CLIENTS)
async def test_the_async_store_plans_around_the_read_timeout_its_connections_use(
    redis_url: str, make: Callable[[str], Any]
) -> None:
    client = make(redis_url)
    try:
        timeout = await _async_read_timeout(client)
        accepted = _check_replicas_bound(lambda policy: AsyncRedisStore(client, policy), timeout)
        store = AsyncRedisStore(client, Policy())
        try:
            assert store._block_cap == pytest.approx(_expected_block_cap(timeout))
        finally:
            for made in (store, accepted):
                await made.aclose()
    finally:
        await client.aclose()


def _check_replicas_bound(make_store: Callable[[Policy], Any], timeout: float | None) -> Any:
    """``Replicas(timeout=t)`` is refused when ``t`` + 200 ms reaches the read timeout (and
    only then); with no read timeout, never. Returns the store made (the caller closes it)."""
    if timeout is None:
        return make_store(Policy(durability=Replicas(1, 30.0)))
    with pytest.raises(ConfigurationError, match=f"socket_timeout \\({timeout:g} s\\)"):
        make_store(Policy(durability=Replicas(1, timeout - 0.15)))
    return make_store(Policy(durability=Replicas(1, timeout - 0.25)))
