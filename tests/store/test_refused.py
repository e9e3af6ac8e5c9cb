"""A refused connection costs what the client's own retries cost, no more.

The store sends a script once more when its connection closed under it (a restarted server,
see test_event_loops.py). A connection that could not be made at all is not that: nothing
reached Redis, and the client has already retried as its ``retry=`` says. Sending again would
run the client's whole retry schedule a second time (a default redis-py 8 client: about 4 s
more before the 503).
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.retry
from redis.backoff import NoBackoff
from redis.retry import Retry

from idemkey import AsyncRedisStore, Policy, RedisStore, StoreError
from idemkey._core import record_for
from tests._servers import free_port

RETRIES = 2  # the connections' own retries, whatever they make of them
RECORD = record_for("refused", "s", "POST", "/charges", "k")


class CountingConnection(redis.Connection):
    attempts = 0

    def connect(self, *args: Any, **kwargs: Any) -> None:
        type(self).attempts += 1
        super().connect(*args, **kwargs)


class AsyncCountingConnection(redis.asyncio.Connection):
    attempts = 0

    async def connect(self, *args: Any, **kwargs: Any) -> None:
        type(self).attempts += 1
        await super().connect(*args, **kwargs)


def _attempts_of_one_command(port: int) -> int:
    """What the client alone makes of one command on the refused port."""
    CountingConnection.attempts = 0
    pool = redis.ConnectionPool(
        port=port, connection_class=CountingConnection, retry=Retry(NoBackoff(), RETRIES)
    )
    client = redis.Redis(connection_pool=pool)
    with pytest.raises(redis.ConnectionError):
        client.ping()
    client.close()
    return CountingConnection.attempts


def test_a_refused_claim_is_not_sent_again() -> None:
    port = free_port()  # nothing listens there: every connect is refused
    expected = _attempts_of_one_command(port)
    CountingConnection.attempts = 0
    pool = redis.ConnectionPool(
        port=port, connection_class=CountingConnection, retry=Retry(NoBackoff(), RETRIES)
    )
    store = RedisStore(redis.Redis(connection_pool=pool), Policy(prefix="refused"))
    with pytest.raises(StoreError):
        store.claim(RECORD, b"fp")
    store.close()
    assert CountingConnection.attempts == expected


async def test_a_refused_asyncio_claim_is_not_sent_again() -> None:
    port = free_port()
    expected = _attempts_of_one_command(port)
    AsyncCountingConnection.attempts = 0
    pool = redis.asyncio.ConnectionPool(
        port=port,
        connection_class=AsyncCountingConnection,
        retry=redis.asyncio.retry.Retry(NoBackoff(), RETRIES),
    )
    store = AsyncRedisStore(redis.asyncio.Redis(connection_pool=pool), Policy(prefix="refused"))
    with pytest.raises(StoreError):
        await store.claim(RECORD, b"fp")
    await store.aclose()
    assert AsyncCountingConnection.attempts == expected
