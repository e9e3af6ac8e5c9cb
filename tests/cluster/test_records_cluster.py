"""store.records() on the real 3-master cluster: SCAN runs on every primary, and the records of
every state are found whichever master holds them; 100 000 records are listed with bounded
memory."""

from __future__ import annotations

import contextlib
import time
import tracemalloc
import uuid
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from idemkey import AsyncRedisStore, Policy, RedisStore, aguard, guard
from idemkey._core import record_for, record_origin
from tests.store.test_records import hold, seed

if TYPE_CHECKING:
    import redis.asyncio.cluster
    import redis.cluster

pytestmark = [pytest.mark.cluster, pytest.mark.redis]


def _purge(client: redis.cluster.RedisCluster, prefix: str) -> None:
    for node in client.get_primaries():
        conn = node.redis_connection
        pipe = conn.pipeline(transaction=False)
        for key in conn.scan_iter(match=f"{prefix}*", count=1000):
            pipe.unlink(key)  # one key a command: a cluster refuses keys of several slots
        pipe.execute()


def test_records_of_every_state_on_every_master(
    cluster_client: redis.cluster.RedisCluster,
) -> None:
    prefix = "rc" + uuid.uuid4().hex[:8]
    store = RedisStore(cluster_client, Policy(prefix=prefix))
    try:
        for index in range(12):  # many keys: the records land on every master
            with guard(store, f"done-{index}", payload=index) as call:
                call.save(index)
            with contextlib.suppress(RuntimeError), guard(store, f"failed-{index}") as call:
                call.step("charge", lambda: 1)
                raise RuntimeError("after a step")
            hold(lambda key=f"held-{index}": guard(store, key).__enter__().step("sent", lambda: 2))
            crashed = record_for(prefix, "", "GUARD", "", f"crashed-{index}")
            store.claim(crashed, "fp", lease_ms=50, heartbeat=False,
                        origin=record_origin("", "GUARD", ""))  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            states = Counter(status.state for status in store.records())
            if states["lapsed"] == 12:
                break
            time.sleep(0.05)
        assert states == {"complete": 12, "released": 12, "in_progress": 12, "lapsed": 12}
        masters = {cluster_client.get_node_from_key(s.key).name for s in store.records()}
        assert len(masters) == 3
        held = store.record("held-3")
        assert held is not None
        assert (held.state, held.steps) == ("in_progress", ("sent",))
        assert [s.steps for s in store.records(state="released", limit=1)] == [("charge",)]
    finally:
        store.close()
        _purge(cluster_client, prefix)


async def test_async_records_on_the_cluster(
    async_cluster_client: redis.asyncio.cluster.RedisCluster,
) -> None:
    prefix = "rc" + uuid.uuid4().hex[:8]
    store = AsyncRedisStore(async_cluster_client, Policy(prefix=prefix))
    try:
        for index in range(9):
            async with aguard(store, f"k-{index}", payload=index, scope="acct") as call:
                call.save(index)
        held = aguard(store, "held", scope="acct")
        await held.__aenter__()
        listed = [status async for status in store.records()]
        assert len(listed) == 10
        assert sorted({s.state for s in listed}) == ["complete", "in_progress"]
        assert [s.state async for s in store.records(scope="acct")] == ["in_progress"]
        found = await store.record("k-4", scope="acct")
        assert found is not None
        assert found.state == "complete"
        await held.__aexit__(None, None, None)
    finally:
        await store.aclose()


@pytest.mark.slow
def test_hundred_thousand_records_on_the_cluster(
    cluster_client: redis.cluster.RedisCluster,
) -> None:
    prefix = "rc" + uuid.uuid4().hex[:8]
    n = 100_000
    seed(cluster_client, prefix, n)
    store = RedisStore(cluster_client, Policy(prefix=prefix))
    try:
        tracemalloc.start()
        states = Counter(status.state for status in store.records())
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert states == {"complete": n - n // 1000, "in_progress": n // 1000}
        assert peak < 8_000_000, f"peak {peak} bytes"
    finally:
        store.close()
        _purge(cluster_client, prefix)
