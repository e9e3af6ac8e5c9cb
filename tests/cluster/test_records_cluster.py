"""store.records() on the real 3-master cluster: SCAN runs on every primary, and the records of
every state are found whichever master holds them, also while their slot migrates and after a
failover; 100 000 records are listed with bounded memory."""

from __future__ import annotations

import contextlib
import itertools
import json
import time
import tracemalloc
import uuid
from collections import Counter
from typing import TYPE_CHECKING

import pytest
from redis.crc import key_slot

from idemkey import AsyncRedisStore, Policy, RecordFormatError, RedisStore, aguard, guard
from idemkey._core import record_for, record_origin
from idemkey.cli import main
from tests._servers import wait_until
from tests.store.test_records import hold, seed

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis.asyncio.cluster
    import redis.cluster

    from tests.cluster._cluster import ClusterProcesses

pytestmark = [pytest.mark.cluster, pytest.mark.redis]


def _purge(client: redis.cluster.RedisCluster, prefix: str) -> None:
    for node in client.get_primaries():
        conn = node.redis_connection
        pipe = conn.pipeline(transaction=False)
        for key in conn.scan_iter(match=f"{prefix}*", count=1000):
            pipe.unlink(key)  # one key a command: a cluster refuses keys of several slots
        pipe.execute()


def _slot_of(prefix: str, key: str) -> int:
    return key_slot(record_for(prefix, "", "GUARD", "", key).record_key.encode())


def _keys_in_one_slot(prefix: str, count: int) -> tuple[int, list[str]]:
    """``count`` guard keys whose records share a slot (a few thousand digests to find them)."""
    by_slot: dict[int, list[str]] = {}
    for index in itertools.count():
        key = f"job-{index}"
        found = by_slot.setdefault(_slot_of(prefix, key), [])
        found.append(key)
        if len(found) == count:
            return _slot_of(prefix, key), found
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _half_migrated(cluster: ClusterProcesses, slot: int, moved: int) -> Iterator[None]:
    """``slot`` MIGRATING to another master with ``moved`` of its keys there already; the
    migration is finished on exit, so every slot stays served."""
    source = cluster.master_for_slot(slot)
    target = next(node for node in cluster.masters() if node is not source)
    cluster.begin_migration(slot, target)
    try:
        assert cluster.migrate_some(slot, source, target, moved) == moved
        yield
    finally:
        cluster.finish_migration(slot, source, target)


def test_records_of_a_slot_being_migrated_are_all_listed_and_counted(
    redis_cluster: ClusterProcesses,
    cluster_client: redis.cluster.RedisCluster,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prefix = "rc" + uuid.uuid4().hex[:8]
    store = RedisStore(cluster_client, Policy(prefix=prefix))
    slot, keys = _keys_in_one_slot(prefix, 6)
    url = f"redis://127.0.0.1:{redis_cluster.nodes[0].port}/0"
    try:
        for key in keys:
            with guard(store, key) as call:
                call.save(key)
        with _half_migrated(redis_cluster, slot, 3):  # 3 on the importing node, 3 not yet
            assert Counter(status.state for status in store.records()) == {"complete": 6}
            assert main(["stats", "--json", "--no-progress", "--redis-url", url,
                         "--prefix", prefix]) == 0  # fmt: skip
            stats = json.loads(capsys.readouterr().out)
            assert (stats["records"], stats["states"]["complete"]) == (6, 6)
            assert stats["states"]["other"] == 0
    finally:
        store.close()
        _purge(cluster_client, prefix)


async def test_async_records_of_a_slot_being_migrated_are_all_listed(
    redis_cluster: ClusterProcesses,
    async_cluster_client: redis.asyncio.cluster.RedisCluster,
) -> None:
    prefix = "rc" + uuid.uuid4().hex[:8]
    store = AsyncRedisStore(async_cluster_client, Policy(prefix=prefix))
    slot, keys = _keys_in_one_slot(prefix, 6)
    try:
        for key in keys:
            async with aguard(store, key) as call:
                call.save(key)
        with _half_migrated(redis_cluster, slot, 3):
            assert Counter([s.state async for s in store.records()]) == {"complete": 6}
    finally:
        await store.aclose()
        with redis_cluster.client() as client:
            _purge(client, prefix)


def test_a_long_lived_client_lists_every_record_after_a_failover(
    redis_cluster: ClusterProcesses, cluster_client: redis.cluster.RedisCluster
) -> None:
    prefix = "rc" + uuid.uuid4().hex[:8]
    store = RedisStore(cluster_client, Policy(prefix=prefix))
    keys = [f"k-{index}" for index in range(30)]
    try:
        for key in keys:
            with guard(store, key) as call:
                call.save(key)
        assert len(list(store.records())) == 30  # the client has its node map now
        slot = _slot_of(prefix, keys[0])
        master = redis_cluster.master_for_slot(slot)
        replica = redis_cluster.replicas_of(master)[0]
        redis_cluster.wait_replicas_synced()
        with redis_cluster.node_client(replica) as node:
            node.execute_command("CLUSTER", "FAILOVER")
        # No command of the store touches that shard: its node map stays as it was.
        wait_until(
            lambda: redis_cluster.master_for_slot(slot) is replica and redis_cluster.healthy(),
            30.0,
            "the replica to take over in a CLUSTER FAILOVER",
        )
        assert Counter(status.state for status in store.records()) == {"complete": 30}
        redis_cluster.wait_replica_attached(master, replica)  # the next tests' durability
    finally:
        store.close()
        with redis_cluster.client() as client:  # cluster_client may still be stale (unfixed)
            _purge(client, prefix)


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


def test_a_key_of_another_type_is_refused_shown_and_forgotten_on_every_master(
    redis_cluster: ClusterProcesses,
    cluster_client: redis.cluster.RedisCluster,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Strings where records should be, spread over the masters: every claim refuses the key as
    # unreadable (no "Redis failed"), inspect through the cluster client's pipeline says what
    # it is, and forget (the command and the store) deletes it.
    prefix = "rc" + uuid.uuid4().hex[:8]
    store = RedisStore(cluster_client, Policy(prefix=prefix, on_store_error="open"))
    url = f"redis://127.0.0.1:{redis_cluster.nodes[0].port}/0"
    by_master: dict[str, str] = {}  # one key on each master
    for index in itertools.count():
        key = f"other-{index}"
        name = record_for(prefix, "", "GUARD", "", key).key
        by_master.setdefault(cluster_client.get_node_from_key(name).name, key)
        if len(by_master) == 3:
            break
    keys = list(by_master.values())
    records = [record_for(prefix, "", "GUARD", "", key) for key in keys]
    try:
        for record in records:
            cluster_client.set(record.key, "not a hash")
        for key in keys:
            with (
                pytest.raises(RecordFormatError, match="not an idemkey record: a string"),
                guard(store, key),
            ):
                pytest.fail("the block ran beside a key idemkey cannot read")
        first, *rest = records
        at = ["--redis-url", url, "--prefix", prefix]
        assert main(["--json", "inspect", "--digest", first.digest, *at]) == 0
        view = json.loads(capsys.readouterr().out)
        assert (view["state"], view["error"]) == ("foreign", "not an idemkey record (a string)")
        assert main(["forget", "--digest", first.digest, "--yes", *at]) == 0
        assert cluster_client.exists(first.key) == 0
        assert {store.forget(record).state for record in rest} == {"foreign"}
        assert sum(cluster_client.exists(record.key) for record in records) == 0
    finally:
        store.close()
        _purge(cluster_client, prefix)


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
