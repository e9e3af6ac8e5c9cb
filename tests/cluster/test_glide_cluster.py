"""AsyncRedisStore on a valkey-glide ``GlideClusterClient`` on the real 3-master cluster.

The asyncio contract of test_cluster.py runs as it is on glide; then what the facade adds on a
cluster: scripts routed by their first key to the slot's master (and loaded there on
NOSCRIPT), SCAN and acheck() on every primary it reads from CLUSTER NODES, and waiters.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio
from redis.crc import key_slot

from idemkey import AsyncRedisStore, Policy
from idemkey._core import Claimed, Replay, record_for
from tests.cluster.test_cluster import keys_on_node
from tests.cluster.test_cluster import (
    test_async_store_and_aguard_on_cluster as async_contract,
)

if TYPE_CHECKING:
    from tests.cluster._cluster import ClusterProcesses

pytestmark = [pytest.mark.cluster, pytest.mark.redis]

glide = pytest.importorskip("glide", reason="valkey-glide is not installed (idemkey[glide])")


@pytest_asyncio.fixture
async def glide_cluster(redis_cluster: ClusterProcesses) -> AsyncIterator[Any]:
    addresses = [glide.NodeAddress(node.host, node.port) for node in redis_cluster.masters()]
    config = glide.GlideClusterClientConfiguration(addresses, request_timeout=5000)
    client = await glide.GlideClusterClient.create(config)
    try:
        yield client
    finally:
        await client.close()


async def test_the_asyncio_contract_on_a_glide_cluster_client(
    glide_cluster: Any, prefix: str
) -> None:
    await async_contract(glide_cluster, prefix)


async def test_records_spread_over_every_master_and_are_all_listed(
    redis_cluster: ClusterProcesses, glide_cluster: Any, prefix: str
) -> None:
    store = AsyncRedisStore(glide_cluster, Policy(prefix=prefix))
    try:
        records = [record_for(prefix, "s", "POST", "/r", f"key-{i}") for i in range(60)]
        for record in records:
            claim = await store.claim(record, "fp", heartbeat=False)
            assert isinstance(claim, Claimed)
            assert await store.complete(record, claim.owner, record.digest.encode())
        # Each record is on its slot's master: glide routed the script by its first key.
        by_port: dict[int, set[str]] = {}
        for record in records:
            master = redis_cluster.master_for_slot(key_slot(record.key.encode()))
            by_port.setdefault(master.port, set()).add(record.key)
        assert len(by_port) == 3
        for port, keys in by_port.items():
            found = {key.decode() for key in keys_on_node(redis_cluster, port, f"{prefix}:*")}
            assert keys <= found
        listed = [status async for status in store.records(count=7)]
        assert sorted(status.key for status in listed) == sorted(r.key for r in records)
        assert {status.state for status in listed} == {"complete"}
        for record in records[:5]:
            assert await store.claim(record, "fp") == Replay(record.digest.encode())
    finally:
        await store.aclose()


async def test_a_master_that_never_saw_the_scripts_loads_them_on_glide(
    redis_cluster: ClusterProcesses, glide_cluster: Any, prefix: str
) -> None:
    store = AsyncRedisStore(glide_cluster, Policy(prefix=prefix))
    record = record_for(prefix, "", "POST", "/x", "noscript")
    node = redis_cluster.node_client(redis_cluster.master_for_slot(key_slot(record.key.encode())))
    try:
        node.script_flush()
        sha = store._scripts["claim"].sha
        assert node.script_exists(sha) == [False]
        decision = await store.claim(record, "fp", heartbeat=False)
        assert isinstance(decision, Claimed)
        assert node.script_exists(sha) == [True]
        assert await store.complete(record, decision.owner, b"done")
        assert await store.claim(record, "fp") == Replay(b"done")
    finally:
        node.close()
        await store.aclose()


async def test_acheck_looks_at_every_primary_on_glide(
    redis_cluster: ClusterProcesses, glide_cluster: Any
) -> None:
    warnings = await AsyncRedisStore(glide_cluster).acheck()
    assert len(warnings) == 3
    assert {w.split(":")[1] for w in warnings} == {str(port) for port in redis_cluster.topology()}
    assert all("neither RDB save points nor AOF" in w for w in warnings)


async def test_waiters_on_a_glide_cluster_wake_at_the_completion(
    glide_cluster: Any, prefix: str
) -> None:
    store = AsyncRedisStore(glide_cluster, Policy(prefix=prefix))
    try:
        record = record_for(prefix, "", "POST", "/w", "waited")
        first = await store.claim(record, "fp", lease_ms=30_000, heartbeat=False)
        assert isinstance(first, Claimed)
        waiters = [
            asyncio.ensure_future(store.claim(record, "fp", wait=5.0, heartbeat=False))
            for _ in range(10)
        ]
        await asyncio.sleep(0)
        assert not any(waiter.done() for waiter in waiters)
        assert await store.complete(record, first.owner, b"done")
        answers = await asyncio.wait_for(asyncio.gather(*waiters), 6.0)
        assert answers == [Replay(b"done")] * 10
    finally:
        await store.aclose()
