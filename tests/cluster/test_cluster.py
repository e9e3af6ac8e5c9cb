"""RedisStore / AsyncRedisStore on a real Redis Cluster (3 masters, 3 replicas).

Every behaviour of the core contract holds when records are spread over all masters, no
script ever gets CROSSSLOT, a master that never saw the scripts loads them on NOSCRIPT, and
requests keep being answered while a busy slot migrates between masters under them.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
import redis
import redis.asyncio.cluster
from redis.crc import key_slot

from idemkey import (
    AsyncRedisStore,
    ConfigurationError,
    KeyReuseError,
    Policy,
    RedisStore,
    Replicas,
    RequestInFlightError,
    StoreError,
    aguard,
    guard,
)
from idemkey._core import Claimed, Expired, InFlight, Mismatch, Record, Replay, record_for
from tests._servers import WAKE_BOUND, async_wait_until, wait_until

if TYPE_CHECKING:
    import redis.cluster

    from tests.cluster._cluster import ClusterProcesses

pytestmark = [pytest.mark.cluster, pytest.mark.redis]


def busy_records(prefix: str, tag: str, count: int) -> list[Record]:
    """``count`` records that all live in the slot of ``{tag}``: one busy slot."""
    return [
        Record(f"{tag}-{i}", f"{prefix}:{{{tag}}}:{i}", f"{prefix}:{{{tag}}}:{i}:lock")
        for i in range(count)
    ]


def asking_calls(cluster: ClusterProcesses, node: Any) -> int:
    """How many ASKING commands ``node`` has served: requests redirected to it by ASK."""
    client = cluster.node_client(node)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return int(stats.get("cmdstat_asking", {}).get("calls", 0))


def keys_on_node(cluster: ClusterProcesses, port: int, pattern: str) -> list[bytes]:
    client = cluster.node_client(cluster.node_by_port(port))
    try:
        return list(client.scan_iter(match=pattern, count=1000))
    finally:
        client.close()


# ---------------------------------------------------------------------------------------------
# Spread, routing, scripts
# ---------------------------------------------------------------------------------------------


def test_thousands_of_keys_spread_over_every_master_and_replay(
    redis_cluster: ClusterProcesses, cluster_client: redis.cluster.RedisCluster, prefix: str
) -> None:
    store = RedisStore(cluster_client, Policy(prefix=prefix))
    n = 3000
    for i in range(n):
        with guard(store, f"order-{i}", payload=i) as call:
            assert not call.replayed
            call.save({"order": i})
    # Each record is one hash on the master that serves its slot (locks are gone once complete).
    per_master = {
        port: len(keys_on_node(redis_cluster, port, f"{prefix}:*"))
        for port in redis_cluster.topology()
    }
    assert sum(per_master.values()) == n, per_master
    assert len(per_master) == 3
    assert all(count > n // 6 for count in per_master.values()), per_master
    for i in range(n):
        with guard(store, f"order-{i}", payload=i) as call:
            assert call.replayed
            assert call.result == {"order": i}


def test_a_claimed_record_is_one_key_on_the_master_of_its_slot(
    redis_cluster: ClusterProcesses, cluster_client: redis.cluster.RedisCluster, prefix: str
) -> None:
    store = RedisStore(cluster_client, Policy(prefix=prefix))
    for i in range(50):
        record = record_for(prefix, "tenant", "POST", "/charges", f"k{i}")
        slot = key_slot(record.key.encode())
        assert key_slot(f"{record.key}:done".encode()) == slot  # its hints share the slot
        decision = store.claim(record, "fp", heartbeat=False)
        assert isinstance(decision, Claimed)
        # The script ran on the master of that slot: the record, its lease a field of it, is
        # there, and no other key of it is anywhere.
        master = redis_cluster.master_for_slot(slot)
        node = redis_cluster.node_client(master)
        try:
            assert node.keys(f"{record.key}*") == [record.key.encode()]
            assert node.hexists(record.key, "lease")
        finally:
            node.close()
        assert store.release(record, decision.owner)


def test_an_expired_keys_tombstone_lives_with_its_record_on_cluster(
    redis_cluster: ClusterProcesses, cluster_client: redis.cluster.RedisCluster, prefix: str
) -> None:
    # Policy.expired_grace: complete.lua writes {prefix}:{<d>}:gone next to the record, in its
    # slot (no CROSSSLOT), and claim.lua answers Expired from it once the record is gone.
    store = RedisStore(cluster_client, Policy(prefix=prefix))
    try:
        for i in range(20):
            record = record_for(prefix, "tenant", "POST", "/charges", f"gone-{i}")
            claim = store.claim(record, b"f" * 16, heartbeat=False)
            assert isinstance(claim, Claimed)
            assert store.complete(record, claim.owner, b"resp", grace_ms=60_000)
            tombstone = record.key + ":gone"
            assert key_slot(tombstone.encode()) == key_slot(record.key.encode())
            cluster_client.delete(record.key)  # the record's expiry, brought forward
            decision = store.claim(record, b"f" * 16, heartbeat=False, expired=True)
            assert isinstance(decision, Expired)
            assert isinstance(store.claim(record, b"g" * 16, expired=True), Mismatch)
    finally:
        store.close()


def test_a_master_that_never_saw_the_scripts_loads_them(
    redis_cluster: ClusterProcesses, cluster_client: redis.cluster.RedisCluster, prefix: str
) -> None:
    store = RedisStore(cluster_client, Policy(prefix=prefix))
    record = record_for(prefix, "", "POST", "/x", "noscript")
    master = redis_cluster.master_for_slot(key_slot(record.key.encode()))
    node = redis_cluster.node_client(master)
    try:
        node.script_flush()
        sha = store._scripts["claim"].sha
        assert node.script_exists(sha) == [False]
        decision = store.claim(record, "fp", heartbeat=False)
        assert isinstance(decision, Claimed)
        assert node.script_exists(sha) == [True]
        assert store.complete(record, decision.owner, b"done")
        assert store.claim(record, "fp") == Replay(b"done")
    finally:
        node.close()


def test_check_looks_at_every_primary(
    redis_cluster: ClusterProcesses, cluster_client: redis.cluster.RedisCluster
) -> None:
    warnings = RedisStore(cluster_client).check()
    # The test cluster keeps nothing on disk: one warning per primary, naming it.
    assert len(warnings) == 3
    ports = {str(port) for port in redis_cluster.topology()}
    assert {w.split(":")[1] for w in warnings} == ports
    assert all("neither RDB save points nor AOF" in w for w in warnings)


async def test_acheck_looks_at_every_primary(
    async_cluster_client: redis.asyncio.cluster.RedisCluster,
) -> None:
    warnings = await AsyncRedisStore(async_cluster_client).acheck()
    assert len(warnings) == 3


# ---------------------------------------------------------------------------------------------
# The core contract, sync
# ---------------------------------------------------------------------------------------------


def test_store_contract_on_cluster(
    any_cluster_client: redis.cluster.RedisCluster, prefix: str
) -> None:
    store = RedisStore(any_cluster_client, Policy(prefix=prefix))
    try:
        records = [record_for(prefix, "s", "POST", "/r", f"key-{i}") for i in range(30)]
        for record in records:
            first = store.claim(record, "fp-a", lease_ms=5000, heartbeat=False)
            assert isinstance(first, Claimed)
            assert first.fence > 10**15  # the server's clock in microseconds, at least
            assert not first.takeover
            # Same owner again (a re-sent command): claimed again, same fence.
            assert store.claim(record, "fp-a", owner=first.owner, heartbeat=False) == first
            # Another request while the first runs: in flight, with the lease left.
            busy = store.claim(record, "fp-a", heartbeat=False)
            assert isinstance(busy, InFlight)
            assert 0 < busy.retry_after <= 5
            # Other payload: mismatch, record untouched.
            assert isinstance(store.claim(record, "fp-b", heartbeat=False), Mismatch)
            assert store.renew(record, first.owner, lease_ms=5000)
            assert not store.renew(record, "not-the-owner")
            assert not store.complete(record, "not-the-owner", b"forged")
            assert store.complete(record, first.owner, b"response-bytes")
            assert store.complete(record, first.owner, b"response-bytes")  # twice: still ok
            assert store.claim(record, "fp-a") == Replay(b"response-bytes")
            assert isinstance(store.claim(record, "fp-b"), Mismatch)
            assert not store.release(record, first.owner)  # a completed record stays

        # Release: a retry starts afresh.
        released = record_for(prefix, "s", "POST", "/r", "released")
        first = store.claim(released, "fp", heartbeat=False)
        assert isinstance(first, Claimed)
        assert store.release(released, first.owner)
        again = store.claim(released, "fp", heartbeat=False)
        assert isinstance(again, Claimed)
        assert not again.takeover
        assert store.release(released, again.owner)
    finally:
        store.close()


def test_takeover_after_a_lapsed_lease_on_cluster(
    cluster_client: redis.cluster.RedisCluster, prefix: str
) -> None:
    store = RedisStore(cluster_client, Policy(prefix=prefix))
    record = record_for(prefix, "s", "POST", "/r", "crashed")
    crashed = store.claim(record, "fp", lease_ms=150, heartbeat=False)
    assert isinstance(crashed, Claimed)

    def taken_over() -> Claimed | None:
        decision = store.claim(record, "fp", heartbeat=False)
        return decision if isinstance(decision, Claimed) else None

    successor = wait_until(taken_over, 5, "the lease to lapse and the record to be taken over")
    assert successor.takeover
    assert successor.fence > crashed.fence
    # The crashed owner wakes up: it can neither complete nor release, nothing is overwritten.
    assert not store.complete(record, crashed.owner, b"stale")
    assert not store.release(record, crashed.owner)
    assert store.complete(record, successor.owner, b"fresh")
    assert store.claim(record, "fp") == Replay(b"fresh")


def test_guard_on_cluster(any_cluster_client: redis.cluster.RedisCluster, prefix: str) -> None:
    store = RedisStore(any_cluster_client, Policy(prefix=prefix))
    runs = 0
    for _ in range(3):
        with guard(store, "charge:inv_42", payload=b"body") as call:
            if not call.replayed:
                runs += 1
                call.save({"charged": 42})
        assert call.result == {"charged": 42}
    assert runs == 1
    with pytest.raises(KeyReuseError), guard(store, "charge:inv_42", payload=b"other"):
        pass
    with pytest.raises(ValueError, match="boom"), guard(store, "fails", payload=b"") as call:
        raise ValueError("boom")
    with guard(store, "fails", payload=b"") as call:
        assert not call.replayed  # released by the failure: runs again
        with pytest.raises(RequestInFlightError), guard(store, "fails", payload=b""):
            pass
        call.save("second time")
    store.close()


# ---------------------------------------------------------------------------------------------
# The core contract, asyncio
# ---------------------------------------------------------------------------------------------


async def test_async_store_and_aguard_on_cluster(
    any_async_cluster_client: redis.asyncio.cluster.RedisCluster, prefix: str
) -> None:
    store = AsyncRedisStore(any_async_cluster_client, Policy(prefix=prefix))
    try:
        record = record_for(prefix, "s", "POST", "/a", "k")
        first = await store.claim(record, "fp", lease_ms=5000)
        assert isinstance(first, Claimed)
        assert isinstance(await store.claim(record, "fp"), InFlight)
        assert isinstance(await store.claim(record, "other"), Mismatch)
        assert await store.renew(record, first.owner)
        assert await store.complete(record, first.owner, b"resp")
        assert await store.claim(record, "fp") == Replay(b"resp")

        crashed_record = record_for(prefix, "s", "POST", "/a", "crashed")
        crashed = await store.claim(crashed_record, "fp", lease_ms=150, heartbeat=False)
        assert isinstance(crashed, Claimed)
        successor = await store.claim(crashed_record, "fp", wait=5.0, heartbeat=False)
        # wait= polls an in-flight record until it is answerable: here, the lapsed lease.
        assert isinstance(successor, Claimed)
        assert successor.takeover
        assert successor.fence > crashed.fence
        assert not await store.complete(crashed_record, crashed.owner, b"stale")

        results = []
        for i in range(200):
            async with aguard(store, f"job-{i}", payload=i) as call:
                if not call.replayed:
                    call.save(i * 2)
            results.append(call.result)
        for i in range(200):
            async with aguard(store, f"job-{i}", payload=i) as call:
                assert call.replayed
                assert call.result == i * 2
        assert results == [i * 2 for i in range(200)]
    finally:
        await store.aclose()


async def test_durable_writes_on_the_asyncio_cluster_client(
    redis_cluster: ClusterProcesses,
    any_async_cluster_client: redis.asyncio.cluster.RedisCluster,
    prefix: str,
) -> None:
    """EVALSHA + WAIT on one connection of the slot's master (ClusterNode.execute_pipeline)."""
    store = AsyncRedisStore(
        any_async_cluster_client, Policy(prefix=prefix, durability=Replicas(1, 0.5))
    )
    try:
        for i in range(30):
            record = record_for(prefix, "", "POST", "/d", f"k{i}")

            async def confirmed(record: Record = record) -> Claimed | None:
                # A replica takes its first ACK up to a second after it synced: until then a
                # durable claim fails closed (and is released), so try again.
                try:
                    decision = await store.claim(record, "fp", heartbeat=False)
                except StoreError:
                    return None
                return decision if isinstance(decision, Claimed) else None

            claim = await async_wait_until(confirmed, 20, "a replica to confirm the claim")
            assert await store.complete(record, claim.owner, b"kept")
            # Acknowledged means on the replica of the slot's master, already.
            master = redis_cluster.master_for_slot(key_slot(record.key.encode()))
            [replica] = redis_cluster.replicas_of(master)
            node = redis_cluster.node_client(replica)
            try:
                node.execute_command("READONLY")
                assert node.hexists(record.key, "resp")  # complete
            finally:
                node.close()
    finally:
        await store.aclose()


async def test_a_connection_torn_down_under_a_task_is_sent_again(
    any_async_cluster_client: redis.asyncio.cluster.RedisCluster,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both asyncio cluster clients (valkey-py forked redis-py's) can close a connection another
    task is writing to while the topology changes; that task gets AttributeError, from the
    store's own send to the node and again from the client's (which the store hands a failed
    send to), and the store sends the script again, as for a moving slot."""
    store = AsyncRedisStore(any_async_cluster_client, Policy(prefix=prefix))
    record = record_for(prefix, "s", "POST", "/a", "torn")
    node_class = type(any_async_cluster_client.get_node_from_key(record.record_key))
    send = node_class.execute_command
    torn = 0

    async def torn_down_twice(node: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal torn
        if args[0] == "EVALSHA" and torn < 2:
            torn += 1
            raise AttributeError("'NoneType' object has no attribute 'writelines'")
        return await send(node, *args, **kwargs)

    monkeypatch.setattr(node_class, "execute_command", torn_down_twice)
    try:
        assert isinstance(await store.claim(record, "fp", heartbeat=False), Claimed)
        assert torn == 2
    finally:
        await store.aclose()


def _closed_by_server(client: Any) -> type[Exception]:
    """The client library's ConnectionError (redis-py's or valkey-py's)."""
    module = type(client).__module__.split(".", 1)[0]
    error: type[Exception] = importlib.import_module(f"{module}.exceptions").ConnectionError
    return error


async def test_a_connection_closed_under_a_task_is_sent_again_until_slot_moving_wait(
    any_async_cluster_client: redis.asyncio.cluster.RedisCluster,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client's MOVED handling closes every connection, so a task can get "Connection
    closed by server" more than once in a row: the store sends again, as for a moving slot,
    not just once as after a server restart."""
    store = AsyncRedisStore(any_async_cluster_client, Policy(prefix=prefix))
    assert store._route is not None
    send, error = store._route.evalsha, _closed_by_server(any_async_cluster_client)
    torn = 0

    async def closed_three_times(sha: str, keys_and_args: tuple[Any, ...]) -> Any:
        nonlocal torn
        if torn < 3:
            torn += 1
            raise error("Connection closed by server.")
        return await send(sha, keys_and_args)

    monkeypatch.setattr(store, "_evalsha", closed_three_times)
    monkeypatch.setattr(store._route, "evalsha", closed_three_times)
    record = record_for(prefix, "s", "POST", "/a", "closed")
    try:
        assert isinstance(await store.claim(record, "fp", heartbeat=False), Claimed)
        assert torn == 3
    finally:
        await store.aclose()


async def test_a_connection_that_cannot_be_made_is_not_sent_again(
    any_async_cluster_client: redis.asyncio.cluster.RedisCluster,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refused connect reached nothing and the client retried it already: StoreError at once,
    no slot_moving_wait spent."""
    store = AsyncRedisStore(any_async_cluster_client, Policy(prefix=prefix))
    assert store._route is not None
    error = _closed_by_server(any_async_cluster_client)
    tries = 0

    async def refused(sha: str, keys_and_args: tuple[Any, ...]) -> Any:
        nonlocal tries
        tries += 1
        raise error("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    monkeypatch.setattr(store, "_evalsha", refused)
    monkeypatch.setattr(store._route, "evalsha", refused)
    record = record_for(prefix, "s", "POST", "/a", "refused")
    try:
        with pytest.raises(StoreError, match="connecting to"):
            await store.claim(record, "fp", heartbeat=False)
        assert tries == 1
    finally:
        await store.aclose()


class AppAsyncCluster(redis.asyncio.cluster.RedisCluster):
    """An application's own subclass of the asyncio cluster client."""


async def test_durable_writes_on_a_subclass_of_the_asyncio_cluster_client(
    redis_cluster: ClusterProcesses, prefix: str
) -> None:
    nodes = [redis.asyncio.cluster.ClusterNode(n.host, n.port) for n in redis_cluster.nodes]
    client = AppAsyncCluster(startup_nodes=nodes, socket_timeout=5.0)
    await client.initialize()
    store = AsyncRedisStore(client, Policy(prefix=prefix, durability=Replicas(1, 0.5)))
    record = record_for(prefix, "", "POST", "/d", "subclass")

    async def confirmed() -> Claimed | None:
        try:  # a replica takes its first ACK up to a second after it synced
            decision = await store.claim(record, "fp", heartbeat=False)
        except StoreError:
            return None
        return decision if isinstance(decision, Claimed) else None

    try:
        claim = await async_wait_until(confirmed, 20, "a replica to confirm the claim")
        assert await store.complete(record, claim.owner, b"kept")
    finally:
        await store.aclose()
        await client.aclose()


async def test_concurrent_aguards_on_one_key_run_once_on_cluster(
    any_async_cluster_client: redis.asyncio.cluster.RedisCluster, prefix: str
) -> None:
    store = AsyncRedisStore(any_async_cluster_client, Policy(prefix=prefix, wait=5.0))
    runs = 0

    async def one() -> object:
        nonlocal runs
        async with aguard(store, "same", payload=b"p") as call:
            if not call.replayed:
                runs += 1
                await asyncio.sleep(0)  # let the others arrive while we hold the claim
                call.save("the one result")
        return call.result

    answers = await asyncio.gather(*(one() for _ in range(50)))
    assert runs == 1
    assert set(answers) == {"the one result"}
    await store.aclose()


# ---------------------------------------------------------------------------------------------
# A busy slot migrating between masters while requests run
# ---------------------------------------------------------------------------------------------


class _CountingStore(RedisStore):
    """Counts the calls the cluster refused because their slot was moving."""

    slot_moving_retries = 0
    # The test holds that requests survive the move, not how fast a loaded box moves 550 keys
    # in batches of 10: two concurrent runs of tests/cluster on two cores outlasted the default
    # 2 s wait ("TTL exhausted") in both. A bounded wait well above that keeps it about the move.
    slot_moving_wait = 30.0

    def _eval_while_slot_moves(
        self, name: str, keys_and_args: tuple[str | bytes | int, ...]
    ) -> Any:
        self.slot_moving_retries += 1
        return super()._eval_while_slot_moves(name, keys_and_args)


def test_requests_survive_a_live_migration_of_a_busy_slot(
    redis_cluster: ClusterProcesses, cluster_client: redis.cluster.RedisCluster, prefix: str
) -> None:
    """MOVED, ASK and TRYAGAIN while a slot full of records moves, one small batch at a time.

    Every script touches one key, the record, so while the slot moves the source serves the
    records it still holds and redirects the others with ASK to the target, which serves them
    (redis-py's sync cluster client sends ASKING and the script on one connection): nothing is
    refused, nothing is retried. (0.2's scripts touched two keys and met TRYAGAIN until the
    slot had moved.)
    """
    store = _CountingStore(cluster_client, Policy(prefix=prefix))
    tag = "busy-" + prefix
    slot = key_slot(f"{{{tag}}}".encode())
    done = busy_records(prefix, tag, 150)
    for record in done:
        claim = store.claim(record, "fp", heartbeat=False)
        assert isinstance(claim, Claimed)
        assert store.complete(record, claim.owner, record.digest.encode())
    new_records = [
        Record(f"new-{i}", f"{prefix}:{{{tag}}}:new:{i}", f"{prefix}:{{{tag}}}:new:{i}:lock")
        for i in range(400)
    ]

    progress = 0
    failures: list[BaseException] = []
    stop = threading.Event()
    lock = threading.Lock()

    def worker(offset: int) -> None:
        nonlocal progress
        i = offset
        while not stop.is_set():
            try:
                # A replay of a completed record, and a new record claimed and completed.
                record = done[i % len(done)]
                assert store.claim(record, "fp") == Replay(record.digest.encode())
                new = new_records[i % len(new_records)]
                decision = store.claim(new, "fp", heartbeat=False)
                if isinstance(decision, Claimed):
                    assert store.complete(new, decision.owner, b"new")
                else:
                    assert decision == Replay(b"new")
            except BaseException as exc:  # reported to the main thread
                failures.append(exc)
                return
            with lock:
                progress += 1
            i += 4

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: progress > 20 or failures, 20, "requests before the migration")
        owner = redis_cluster.master_for_slot(slot)
        target = next(m for m in redis_cluster.masters() if m is not owner)
        source = redis_cluster.begin_migration(slot, target)
        # Requests must meet the migrating slot (and be redirected), not slip past it.
        asked = asking_calls(redis_cluster, target)
        moved = 0
        # Like `redis-cli --cluster reshard`: batches of 10 keys, back to back.
        while batch := redis_cluster.migrate_some(slot, source, target, 10):
            moved += batch
            wait_until(lambda: asking_calls(redis_cluster, target) > asked or failures, 20, "ASK")
        redis_cluster.finish_migration(slot, source, target)
        seen = progress
        wait_until(lambda: progress > seen + 20 or failures, 20, "requests after migration")
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert not failures, failures[:3]
    assert asking_calls(redis_cluster, target) > asked  # served through ASK during the move
    assert store.slot_moving_retries == 0  # ...and never refused
    assert moved >= len(done)
    assert redis_cluster.master_for_slot(slot) is target
    for record in done:
        assert store.claim(record, "fp") == Replay(record.digest.encode())


async def test_async_requests_survive_a_live_migration_of_a_busy_slot(
    redis_cluster: ClusterProcesses,
    async_cluster_client: redis.asyncio.cluster.RedisCluster,
    prefix: str,
) -> None:
    """The asyncio twin: tasks claim and replay in a slot while it moves between masters."""
    store = _AsyncCountingStore(async_cluster_client, Policy(prefix=prefix))
    tag = "abusy-" + prefix
    slot = key_slot(f"{{{tag}}}".encode())
    done = busy_records(prefix, tag, 100)
    for record in done:
        claim = await store.claim(record, "fp", heartbeat=False)
        assert isinstance(claim, Claimed)
        assert await store.complete(record, claim.owner, record.digest.encode())
    new_records = [
        Record(f"n{i}", f"{prefix}:{{{tag}}}:n:{i}", f"{prefix}:{{{tag}}}:n:{i}:lock")
        for i in range(300)
    ]
    progress = 0
    stop = asyncio.Event()

    async def worker(offset: int) -> None:
        nonlocal progress
        i = offset
        while not stop.is_set():
            record = done[i % len(done)]
            assert await store.claim(record, "fp") == Replay(record.digest.encode())
            new = new_records[i % len(new_records)]
            decision = await store.claim(new, "fp", heartbeat=False)
            if isinstance(decision, Claimed):
                assert await store.complete(new, decision.owner, b"new")
            else:
                assert decision == Replay(b"new")
            progress += 1
            i += 4

    tasks = [asyncio.ensure_future(worker(n)) for n in range(4)]
    try:
        await async_wait_until(lambda: progress > 20 or any(t.done() for t in tasks), 20, "load")
        owner = redis_cluster.master_for_slot(slot)
        target = next(m for m in redis_cluster.masters() if m is not owner)
        # The migration runs in a thread: its blocking calls must not stall the tasks.
        source = await asyncio.to_thread(redis_cluster.begin_migration, slot, target)
        asked = asking_calls(redis_cluster, target)
        while await asyncio.to_thread(redis_cluster.migrate_some, slot, source, target, 10):
            await async_wait_until(
                lambda: asking_calls(redis_cluster, target) > asked or any(t.done() for t in tasks),
                20,
                "an ASK",
            )
        await asyncio.to_thread(redis_cluster.finish_migration, slot, source, target)
        seen = progress
        await async_wait_until(
            lambda: progress > seen + 20 or any(t.done() for t in tasks), 20, "load after"
        )
    finally:
        stop.set()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
    assert [r for r in results if r is not None] == []
    assert asking_calls(redis_cluster, target) > asked  # served through ASK during the move
    assert redis_cluster.master_for_slot(slot) is target
    await store.aclose()


class _AsyncCountingStore(AsyncRedisStore):
    slot_moving_retries = 0

    async def _eval_while_slot_moves(
        self, name: str, keys_and_args: tuple[str | bytes | int, ...]
    ) -> Any:
        self.slot_moving_retries += 1
        return await super()._eval_while_slot_moves(name, keys_and_args)


# ---------------------------------------------------------------------------------------------
# Waiters (the done stream, see complete.lua)
# ---------------------------------------------------------------------------------------------


def blocked_on_master(client: redis.cluster.RedisCluster, record: Record) -> int:
    """Clients blocked on the master of the record's slot (where its done stream lives)."""
    node = client.get_node_from_key(record.key)
    return int(client.info("clients", target_nodes=node)["blocked_clients"])


def test_waiters_block_on_the_records_master_and_wake_at_the_completion(
    cluster_client: redis.cluster.RedisCluster, prefix: str
) -> None:
    store = RedisStore(cluster_client, Policy(prefix=prefix))
    record = record_for(prefix, "s", "POST", "/w", "sync")
    first = store.claim(record, "fp")
    assert isinstance(first, Claimed)
    answers: list[tuple[object, float]] = []

    def waiter() -> None:
        answers.append((store.claim(record, "fp", wait=10), time.monotonic()))

    threads = [threading.Thread(target=waiter) for _ in range(5)]
    for thread in threads:
        thread.start()
    wait_until(lambda: blocked_on_master(cluster_client, record), 10, "a blocked read")
    assert store.complete(record, first.owner, b"resp")
    completed = time.monotonic()
    for thread in threads:
        thread.join(10)
    assert [answer for answer, _ in answers] == [Replay(b"resp")] * 5
    assert max(woke for _, woke in answers) - completed < WAKE_BOUND
    store.close()


async def test_async_waiters_block_on_the_records_master_and_wake_at_the_completion(
    async_cluster_client: redis.asyncio.cluster.RedisCluster,
    cluster_client: redis.cluster.RedisCluster,
    prefix: str,
) -> None:
    store = AsyncRedisStore(async_cluster_client, Policy(prefix=prefix))
    record = record_for(prefix, "s", "POST", "/w", "async")
    try:
        first = await store.claim(record, "fp")
        assert isinstance(first, Claimed)
        waiters = [asyncio.create_task(store.claim(record, "fp", wait=10)) for _ in range(5)]
        await async_wait_until(
            lambda: blocked_on_master(cluster_client, record), 10, "a blocked read"
        )
        assert await store.complete(record, first.owner, b"resp")
        completed = time.monotonic()
        assert await asyncio.gather(*waiters) == [Replay(b"resp")] * 5
        assert time.monotonic() - completed < WAKE_BOUND
    finally:
        await store.aclose()


def test_a_cluster_client_takes_the_plain_script_path(
    cluster_client: redis.cluster.RedisCluster,
) -> None:
    """The lean path (tests/store/test_lean.py) knows nothing of slots and redirects: a cluster
    client's script calls go through its own execute_command, which routes them."""
    store = RedisStore(cluster_client, Policy(prefix="lean-check"))
    assert store._evalsha == store._plain_evalsha
    store.close()


async def test_an_asyncio_cluster_client_takes_the_stores_own_route(
    any_async_cluster_client: redis.asyncio.cluster.RedisCluster,
) -> None:
    """Not the lean path either: the store routes the script calls of both asyncio cluster
    clients itself, so that an ASK is followed on one connection (tests/cluster/test_ask.py)."""
    store = AsyncRedisStore(any_async_cluster_client, Policy(prefix="lean-check"))
    assert store._route is not None
    assert store._evalsha == store._route.evalsha
    await store.aclose()


def test_an_asyncio_cluster_client_under_redis_store_is_refused(
    any_async_cluster_client: Any,
) -> None:
    # tests/store/test_client_kinds.py for the standalone clients: named at construction, not
    # an "unexpected reply" at the first call.
    with pytest.raises(ConfigurationError, match="RedisStore needs a sync client, got an asyncio"):
        RedisStore(any_async_cluster_client)


async def test_a_sync_cluster_client_under_async_redis_store_is_refused(
    any_cluster_client: Any,
) -> None:
    with pytest.raises(ConfigurationError, match="AsyncRedisStore needs an asyncio client"):
        AsyncRedisStore(any_cluster_client)
