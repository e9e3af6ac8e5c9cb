"""store.check() / await store.acheck(): warn when the server can lose idempotency records.

Real servers with the settings under test; CONFIG (and INFO) renamed away, as managed Redis
does, to show the fallback; a dead server to show that the check never raises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import redis

from idemkey import AsyncRedisStore, RedisStore
from idemkey.store import server_warnings
from tests._servers import RedisServer, free_port, no_async_retry, no_retry

pytestmark = pytest.mark.redis

ON_DISK = ["--appendonly", "yes"]


def check(server: RedisServer) -> list[str]:
    client = server.client(socket_timeout=2, retry=no_retry())
    try:
        return RedisStore(client).check()
    finally:
        client.close()


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru", "volatile-ttl", "allkeys-lfu"])
def test_an_evicting_policy_is_reported(
    redis_server_factory: Callable[..., RedisServer], policy: str
) -> None:
    server = redis_server_factory([*ON_DISK, "--maxmemory-policy", policy])
    [warning] = check(server)
    assert f"maxmemory-policy is {policy}" in warning
    assert "noeviction" in warning


def test_a_safe_server_gives_no_warning(redis_server_factory: Callable[..., RedisServer]) -> None:
    server = redis_server_factory([*ON_DISK, "--maxmemory-policy", "noeviction"])
    assert check(server) == []


def test_nothing_on_disk_is_reported_and_logged(
    private_redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    # The test servers keep nothing on disk (--save "" --appendonly no).
    with caplog.at_level(logging.WARNING, logger="idemkey"):
        [warning] = check(private_redis_server)
    assert "neither RDB save points nor AOF" in warning
    assert warning in caplog.text


def test_without_config_it_falls_back_to_info(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory(
        ["--maxmemory-policy", "allkeys-lru", "--rename-command", "CONFIG", ""]
    )
    client = server.client(retry=no_retry())
    with pytest.raises(redis.ResponseError):
        client.config_get("maxmemory-policy")
    client.close()
    # INFO shows the policy; it cannot show save points, so persistence goes unmentioned.
    [warning] = check(server)
    assert "maxmemory-policy is allkeys-lru" in warning


def test_without_config_an_aof_server_is_fine(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory([*ON_DISK, "--rename-command", "CONFIG", ""])
    assert check(server) == []


def test_without_config_or_info_it_says_nothing(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory(
        ["--maxmemory-policy", "allkeys-lru", "--rename-command", "CONFIG", "",
         "--rename-command", "INFO", ""]
    )  # fmt: skip
    assert check(server) == []


def test_a_dead_server_is_not_an_error() -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=no_retry())
    assert RedisStore(client).check() == []
    client.close()


async def test_acheck(redis_server_factory: Callable[..., RedisServer]) -> None:
    server = redis_server_factory(["--maxmemory-policy", "volatile-lru"])
    client = server.async_client(socket_timeout=2, retry=no_async_retry())
    try:
        warnings = await AsyncRedisStore(client).acheck()
    finally:
        await client.aclose()
    assert len(warnings) == 2
    assert "volatile-lru" in warnings[0]
    assert "AOF" in warnings[1]


def test_server_warnings_is_pure() -> None:
    assert server_warnings({}) == []
    assert (
        server_warnings({"maxmemory-policy": "noeviction", "save": "", "appendonly": "yes"}) == []
    )
    [eviction] = server_warnings({"maxmemory-policy": "allkeys-random", "maxmemory": "1048576"})
    assert "allkeys-random" in eviction
    assert "1.0 MiB" in eviction or "1048576" in eviction or "MiB" in eviction
