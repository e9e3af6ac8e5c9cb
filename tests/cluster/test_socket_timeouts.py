"""A cluster client made without a socket timeout reads with its connections' default (5 s on
redis-py 8.2, none on 5): the store plans its Replicas bound and its blocking reads around that
one, as on a standalone client (tests/store/test_socket_timeouts.py)."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio.cluster
import redis.cluster

from idemkey import AsyncRedisStore, ConfigurationError, Policy, RedisStore
from idemkey.policy import Replicas
from tests.cluster._cluster import ClusterProcesses

pytestmark = pytest.mark.cluster


def _refused_at(timeout: float | None) -> Replicas:
    """The Replicas the store must refuse (reaching past the read timeout), or one it must
    accept where there is no read timeout."""
    return Replicas(1, timeout - 0.15 if timeout is not None else 30.0)


def test_a_sync_cluster_from_a_url_plans_around_its_nodes_read_timeout(
    redis_cluster: ClusterProcesses,
) -> None:
    node = redis_cluster.startup_nodes[0]
    client = redis.cluster.RedisCluster.from_url(f"redis://{node.host}:{node.port}/0")
    try:
        pool = client.get_default_node().redis_connection.connection_pool
        connection = pool.make_connection()
        connection.connect()
        timeout = connection._sock.gettimeout()
        connection.disconnect()
        policy = Policy(durability=_refused_at(timeout))
        if timeout is None:
            RedisStore(client, policy).close()
        else:
            with pytest.raises(ConfigurationError, match=f"socket_timeout \\({timeout:g} s\\)"):
                RedisStore(client, policy)
    finally:
        client.close()


async def test_an_async_cluster_plans_around_its_read_timeout(
    redis_cluster: ClusterProcesses,
) -> None:
    node = redis_cluster.startup_nodes[0]
    client: Any = redis.asyncio.cluster.RedisCluster(host=node.host, port=node.port)
    try:
        await client.initialize()
        connection = client.get_default_node().acquire_connection()
        await connection.connect()
        timeout = connection.socket_timeout
        await connection.disconnect()
        policy = Policy(durability=_refused_at(timeout))
        if timeout is None:
            await AsyncRedisStore(client, policy).aclose()
        else:
            with pytest.raises(ConfigurationError, match=f"socket_timeout \\({timeout:g} s\\)"):
                AsyncRedisStore(client, policy)
    finally:
        await client.aclose()
