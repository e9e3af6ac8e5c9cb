"""Cluster fixtures: one real 3-master, 3-replica Redis Cluster for the whole session.

``redis_cluster`` starts six ``redis-server`` processes on free ports (``tests/cluster/
_cluster.py``) the first time a test asks for it, and stops them at the end of the session.
Tests may move slots around but must leave every slot served and the cluster healthy; a test
that kills nodes starts its own :class:`ClusterProcesses` instead.

Without a server binary (``tests._servers.redis_server_executable``) the tests are skipped, or
fail when ``IDEMKEY_REQUIRE_REDIS=1`` (CI).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio
import redis

from tests.cluster._cluster import ClusterProcesses, running_cluster

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    import redis.asyncio.cluster
    import redis.cluster


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterProcesses]:
    """A healthy 3-master, 3-replica cluster (cluster-node-timeout 1500 ms), session-wide."""
    with running_cluster(masters=3, replicas=1) as cluster:
        yield cluster


@pytest.fixture
def cluster_client(redis_cluster: ClusterProcesses) -> Iterator[redis.cluster.RedisCluster]:
    """A ``RedisCluster`` client on the session cluster (bytes replies, 5 s socket timeout)."""
    client = redis_cluster.client()
    try:
        yield client
    finally:
        client.close()


@pytest_asyncio.fixture
async def async_cluster_client(
    redis_cluster: ClusterProcesses,
) -> AsyncIterator[redis.asyncio.cluster.RedisCluster]:
    """The asyncio ``RedisCluster`` twin of ``cluster_client``, initialized before use.

    redis-py 8.1's asyncio cluster client races with itself when many tasks send their first
    commands at once (one of them may get ``AttributeError`` from a connection torn down under
    it); ``await client.initialize()`` before concurrent use avoids it. docs/guarantees.md
    tells users the same.
    """
    client = redis_cluster.async_client()
    await client.initialize()
    try:
        yield client
    finally:
        with contextlib.suppress(redis.RedisError):
            await client.aclose()


def _valkey_py_cluster(cluster: ClusterProcesses, *, asyncio: bool) -> Any:
    """A valkey-py cluster client (``valkey.cluster.ValkeyCluster`` or its asyncio twin) with
    the options of ``ClusterProcesses.client``."""
    module: Any = pytest.importorskip("valkey.asyncio.cluster" if asyncio else "valkey.cluster")
    nodes = [module.ClusterNode(node.host, node.port) for node in cluster.nodes if node.running]
    return module.ValkeyCluster(
        startup_nodes=nodes, decode_responses=False, socket_timeout=5.0, socket_connect_timeout=2.0
    )


def _valkey_errors() -> tuple[type[Exception], ...]:
    try:
        import valkey
    except ImportError:
        return ()
    return (valkey.ValkeyError,)


@pytest.fixture(params=["redis-py", "valkey-py"])
def any_cluster_client(
    request: pytest.FixtureRequest, redis_cluster: ClusterProcesses
) -> Iterator[redis.cluster.RedisCluster]:
    """``cluster_client``, then the same through valkey-py (ids ``[redis-py]``, ``[valkey-py]``)."""
    client = (
        redis_cluster.client()
        if request.param == "redis-py"
        else _valkey_py_cluster(redis_cluster, asyncio=False)
    )
    try:
        yield client
    finally:
        client.close()


@pytest_asyncio.fixture(params=["redis-py", "valkey-py"])
async def any_async_cluster_client(
    request: pytest.FixtureRequest, redis_cluster: ClusterProcesses
) -> AsyncIterator[redis.asyncio.cluster.RedisCluster]:
    """``async_cluster_client``, then the same through valkey-py, initialized before use."""
    client = (
        redis_cluster.async_client()
        if request.param == "redis-py"
        else _valkey_py_cluster(redis_cluster, asyncio=True)
    )
    await client.initialize()
    try:
        yield client
    finally:
        # Closing may fail on a torn-down connection: redis-py's error, or valkey-py's twin.
        with contextlib.suppress(redis.RedisError, *_valkey_errors()):
            await client.aclose()
