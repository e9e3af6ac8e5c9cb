"""A store given the other kind of client (sync under AsyncRedisStore, asyncio under
RedisStore) refuses it at construction with a ConfigurationError naming the mix-up.

Before, either store took it, and the first call failed far from the cause: a sync client's
reply awaited (TypeError), or an asyncio client's coroutine read as a reply ("unexpected
reply"). Every library's clients here are real ones on the session's redis-server (the cluster
clients are in tests/cluster/test_cluster.py); fakeredis's derive from redis-py's and
valkey-py's, and are told apart the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
import valkey
import valkey.asyncio

from idemkey import AsyncRedisStore, ConfigurationError, Policy, RedisStore, aguard, guard

SYNC: dict[str, Callable[[str], Any]] = {
    "redis-py": redis.Redis.from_url,
    "valkey-py": valkey.Valkey.from_url,
    "fakeredis": lambda _: fakeredis.FakeRedis(),
    "fakeredis-valkey": lambda _: fakeredis.FakeValkey(),
}
pytestmark = pytest.mark.redis
ASYNC: dict[str, Callable[[str], Any]] = {
    "redis-py": redis.asyncio.Redis.from_url,
    "valkey-py": valkey.asyncio.Valkey.from_url,
    "fakeredis": lambda _: fakeredis.FakeAsyncRedis(),
    "fakeredis-valkey": lambda _: fakeredis.FakeAsyncValkey(),
}


@pytest.fixture
def url(request: pytest.FixtureRequest) -> str:
    # The session's real server for the real libraries; fakeredis needs none.
    if "fakeredis" in request.node.callspec.id:
        return "unused"
    return request.getfixturevalue("redis_url")  # type: ignore[no-any-return]


@pytest.mark.parametrize("make", list(SYNC.values()), ids=list(SYNC))
async def test_a_sync_client_under_async_redis_store_is_refused(
    make: Callable[[str], Any], url: str, prefix: str
) -> None:
    client = make(url)
    try:
        with pytest.raises(ConfigurationError) as refused:
            AsyncRedisStore(client)
        message = str(refused.value)
        assert "AsyncRedisStore needs an asyncio client, got a sync one" in message
        assert type(client).__qualname__ in message
        assert "use RedisStore with it" in message
        # The kind it names is the right one: the same client works under RedisStore.
        store = RedisStore(client, Policy(prefix=prefix))
        with guard(store, "k") as call:
            if not call.replayed:
                call.save(1)
        store.close()
    finally:
        client.delete(*client.keys(f"{prefix}:*") or [prefix])
        client.close()


@pytest.mark.parametrize("make", list(ASYNC.values()), ids=list(ASYNC))
async def test_an_asyncio_client_under_redis_store_is_refused(
    make: Callable[[str], Any], url: str, prefix: str
) -> None:
    client = make(url)
    try:
        with pytest.raises(ConfigurationError) as refused:
            RedisStore(client)
        message = str(refused.value)
        assert "RedisStore needs a sync client, got an asyncio one" in message
        assert type(client).__qualname__ in message
        assert "use AsyncRedisStore with it" in message
        store = AsyncRedisStore(client, Policy(prefix=prefix))
        async with aguard(store, "k") as call:
            if not call.replayed:
                call.save(1)
        await store.aclose()
    finally:
        await client.delete(*await client.keys(f"{prefix}:*") or [prefix])
        await client.aclose()
