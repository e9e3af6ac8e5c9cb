"""Failover: a master killed under load, and what happens to acknowledged writes.

Each test runs on its own 3-master, 3-replica cluster with ``cluster-node-timeout`` 1000 ms, so
a killed master is replaced by its replica within seconds. Every wait has a deadline.

Measured here (printed; run with ``-s`` to see the figures):

* a master SIGKILLed under steady load: requests to its slots fail (StoreError, fail closed)
  until the replica is promoted, then resume; acknowledged completions lost = those the
  replica had not received yet when the master died (usually none on loopback);
* a replica cut off from its master (frozen, its replication link dropped) while the master
  acknowledges writes, then the master dies: without durability every write the replica
  missed is lost when it is promoted; with ``Policy(durability=Replicas(1, ...))`` none of
  those writes was acknowledged (they failed closed), so nothing acknowledged is lost.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest
import redis
from redis.crc import key_slot

from idemkey import AsyncRedisStore, Policy, RedisStore, Replicas, StoreError
from idemkey._core import Claimed, InFlight, Record, Replay, record_for
from tests._servers import RedisServerError, redis_server_executable, wait_until
from tests.cluster._cluster import ClusterProcesses

if TYPE_CHECKING:
    import redis.cluster

    from tests._servers import RedisServer

pytestmark = [pytest.mark.cluster, pytest.mark.redis]

FAILOVER_TIMEOUT = 30.0
# A full resync of the few thousand records these tests write takes well under a second on an
# idle box; the deadline only bounds how long a failing run waits on a loaded one.
SYNC_TIMEOUT = 60.0
# Once the promoted master serves (and, with durability, has a synced replica), requests on
# its slots resume at once; this bounds a failing run.
RESUME_TIMEOUT = 30.0


@pytest.fixture
def cluster() -> Iterator[ClusterProcesses]:
    if redis_server_executable() is None:
        pytest.skip("needs redis-server or valkey-server")
    try:
        processes = ClusterProcesses(masters=3, replicas=1, node_timeout_ms=1000).start()
    except RedisServerError as exc:
        pytest.fail(f"could not start a Redis cluster: {exc}", pytrace=False)
    try:
        processes.wait_replicas_synced()
        yield processes
    finally:
        processes.close()


def client_of(cluster: ClusterProcesses) -> redis.cluster.RedisCluster:
    return cluster.client(socket_timeout=1.0, socket_connect_timeout=0.5)


def records_on(cluster: ClusterProcesses, master: RedisServer, prefix: str, n: int) -> list[Record]:
    """``n`` records whose slot ``master`` serves."""
    mine = cluster.slots_of(master)
    found: list[Record] = []
    i = 0
    while len(found) < n:
        record = record_for(prefix, "", "POST", "/pay", f"k{i}")
        slot = key_slot(record.key.encode())
        if any(first <= slot <= last for first, last in mine):
            found.append(record)
        i += 1
    return found


def lost(store: RedisStore, acked: list[Record]) -> int:
    """How many acknowledged completions a retry would not find (it would run them again)."""
    count = 0
    for record in acked:
        answer = store.claim(record, "fp", heartbeat=False)
        if answer != Replay(record.digest.encode()):
            count += 1
            if isinstance(answer, Claimed):
                store.release(record, answer.owner)
    return count


def lost_claims(store: RedisStore, claimed: list[Record]) -> int:
    """How many acknowledged, unfinished claims vanished (a duplicate would run at once)."""
    count = 0
    for record in claimed:
        answer = store.claim(record, "fp", heartbeat=False)
        if not isinstance(answer, InFlight):
            count += 1
    return count


@pytest.mark.parametrize("durability", [None, Replicas(1, 0.2)], ids=["plain", "durable"])
def test_a_master_killed_under_load_fails_over_and_requests_resume(
    cluster: ClusterProcesses, prefix: str, durability: Replicas | None
) -> None:
    """With durability, the promoted master has no replica until the old one rejoins: its
    slots answer StoreError (fail closed) until then, and resume once it has synced."""
    client = client_of(cluster)
    store = RedisStore(client, Policy(prefix=prefix, durability=durability))
    acked: list[tuple[float, Record]] = []
    errors: list[float] = []
    reasons: collections.Counter[str] = collections.Counter()
    stop = threading.Event()

    def load(offset: int) -> None:
        # Fresh keys until told to stop: the load never runs dry before the failover ends.
        for i in itertools.count(offset, 4):
            if stop.is_set():
                return
            record = record_for(prefix, "", "POST", "/pay", f"load-{i}")
            try:
                claim = store.claim(record, "fp", heartbeat=False)
                if isinstance(claim, Claimed) and store.complete(
                    record, claim.owner, record.digest.encode()
                ):
                    acked.append((time.monotonic(), record))
            except StoreError as exc:
                errors.append(time.monotonic())  # fail closed while the slot has no master
                reasons[str(exc)[:120]] += 1

    threads = [threading.Thread(target=load, args=(n,), daemon=True) for n in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len(acked) > 200, "load before the kill")
        victim_slot = key_slot(acked[0][1].key.encode())
        victim = cluster.kill_master_for_slot(victim_slot)
        killed_at = time.monotonic()
        promoted = cluster.wait_failover(victim_slot, victim, FAILOVER_TIMEOUT)
        promoted_at = time.monotonic()
        if durability is not None:
            # Durable writes on the promoted master need a replica to confirm them: wait for
            # the real condition, the restarted node attached as its replica (link up, full
            # resync done, offset caught up), with that sync's own deadline.
            cluster.restart_node(victim, SYNC_TIMEOUT)
            cluster.wait_replica_attached(victim, promoted, SYNC_TIMEOUT)
        acked_at_failover = len(acked)
        promoted_slots = cluster.slots_of(promoted)

        def on_promoted() -> int:
            return sum(
                1
                for _, record in acked[acked_at_failover:]
                if any(a <= key_slot(record.key.encode()) <= b for a, b in promoted_slots)
            )

        # Requests resume, on the promoted master's slots too: at the load's pace (hundreds a
        # second here) 20 of them take well under a second once writes can be confirmed.
        try:
            wait_until(
                lambda: on_promoted() >= 20 or not any(t.is_alive() for t in threads),
                RESUME_TIMEOUT,
                "requests on the promoted master",
            )
        except AssertionError as exc:
            # Say what the load saw, so a timeout here can be told from a slow box: acks since
            # the failover, on the promoted master, requests failed closed since, live threads.
            since = [at for at in errors if at > promoted_at]
            raise AssertionError(
                f"{exc}: {len(acked) - acked_at_failover} acknowledged since the failover, "
                f"{on_promoted()} on the promoted master, {len(since)} failed closed since, "
                f"{sum(t.is_alive() for t in threads)} load threads alive; "
                f"most common failures: {reasons.most_common(3)}"
            ) from exc
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    after = [record for at, record in acked if at > promoted_at]
    assert any(
        any(a <= key_slot(record.key.encode()) <= b for a, b in promoted_slots) for record in after
    )
    lost_count = lost(store, [record for _, record in acked])
    print(
        f"\nfailover under load ({'durable' if durability else 'plain'}): {len(acked)} "
        f"completions acknowledged, {len(errors)} requests failed closed, failover took "
        f"{promoted_at - killed_at:.1f} s, acknowledged completions lost: {lost_count}"
    )
    if durability is not None:
        assert lost_count == 0
    else:
        cluster.restart_node(victim)
    store.close()
    client.close()


def test_a_durable_store_whose_node_map_went_stale_in_a_failover_finds_the_new_master(
    cluster: ClusterProcesses, prefix: str
) -> None:
    """The client learned the topology before the failover and sent nothing during it, so its
    map still names the old master, now back as the promoted one's replica. That node answers
    MOVED to the script and an error to WAIT; the store must read it as a redirect, learn the
    topology and go to the new master, not fail every request on that slot from then on."""
    client = client_of(cluster)
    store = RedisStore(client, Policy(prefix=prefix, durability=Replicas(1, 0.5)))
    runner = asyncio.Runner()  # one loop: the asyncio client's connections belong to it

    async def async_store_on_this_loop() -> AsyncRedisStore:
        client = cluster.async_client(socket_timeout=1.0, socket_connect_timeout=0.5)
        return AsyncRedisStore(client, Policy(prefix=prefix, durability=Replicas(1, 0.5)))

    async_store = runner.run(async_store_on_this_loop())
    try:
        master = cluster.masters()[0]
        first, sync_record, async_record = records_on(cluster, master, prefix, 3)
        assert isinstance(store.claim(first, "fp", heartbeat=False), Claimed)  # maps learned
        assert isinstance(runner.run(async_store.claim(first, "fp", heartbeat=False)), InFlight)
        promoted = fail_over_and_rejoin(cluster, master, first)
        assert isinstance(store.claim(sync_record, "fp", heartbeat=False), Claimed)

        # The asyncio pool still holds a connection to the killed process, and the cluster
        # node hands back its ConnectionError instead of re-dialling: sent again, on a new one.
        assert isinstance(
            runner.run(async_store.claim(async_record, "fp", heartbeat=False)), Claimed
        )
        # Both claims are on the promoted master, each confirmed by the rejoined replica.
        check = cluster.node_client(promoted)
        assert check.exists(sync_record.key) == check.exists(async_record.key) == 1
    finally:
        store.close()
        client.close()
        runner.run(async_store.client.aclose())
        runner.close()


def fail_over_and_rejoin(
    cluster: ClusterProcesses, master: RedisServer, record: Record
) -> RedisServer:
    """Kill ``master``, wait for its replica's promotion, restart it as that replica's replica."""
    slot = key_slot(record.key.encode())
    [replica] = cluster.replicas_of(master)
    master.kill()
    promoted = cluster.wait_failover(slot, master, FAILOVER_TIMEOUT)
    assert promoted is replica
    cluster.restart_node(master, SYNC_TIMEOUT)
    cluster.wait_replica_attached(master, promoted, SYNC_TIMEOUT)
    return promoted


def test_lost_acknowledged_writes_with_a_partitioned_replica_without_and_with_durability(
    cluster: ClusterProcesses, prefix: str
) -> None:
    client = client_of(cluster)
    plain = RedisStore(client, Policy(prefix=prefix))
    durable = RedisStore(client, Policy(prefix=prefix, durability=Replicas(1, 0.1)))
    try:
        # Without durability: the master acknowledges what its stalled replica never gets.
        master = cluster.masters()[0]
        [replica] = cluster.replicas_of(master)
        records = records_on(cluster, master, prefix + "a", 40)
        completed, claimed = write(plain, records[:30], records[30:], (cluster, master, replica))
        assert (len(completed), len(claimed)) == (30, 10)  # all acknowledged
        fail_over(cluster, master, replica, records[0])
        lost_without = lost(plain, completed)
        lost_claims_without = lost_claims(plain, claimed)
        cluster.restart_node(master)
        cluster.wait_replicas_synced()

        # With durability: the same fault, and nothing acknowledged is lost.
        master = next(m for m in cluster.masters() if m is not replica)
        [replica] = cluster.replicas_of(master)
        records = records_on(cluster, master, prefix + "b", 40)
        before, _ = write(durable, records[:10], [], None)  # replica healthy: confirmed
        completed, claimed = write(
            durable, records[10:30], records[30:], (cluster, master, replica)
        )
        assert (len(before), len(completed), len(claimed)) == (10, 0, 0)  # failed closed
        fail_over(cluster, master, replica, records[0])
        lost_with = lost(plain, before + completed)
        lost_claims_with = lost_claims(plain, claimed)
        print(
            f"\npartitioned replica, then failover: without durability {lost_without}/30 "
            f"acknowledged completions and {lost_claims_without}/10 acknowledged claims lost; "
            f"with Replicas(1, 0.1): {lost_with}/10 completions and {lost_claims_with}/0 "
            "claims lost (the 30 writes during the stall failed closed)"
        )
        assert lost_without > 0  # the gap durability exists for
        assert lost_with == 0
        assert lost_claims_with == 0
        # Once the old master is back as a replica (and streaming: after a full sync that
        # takes its first ACK, up to a second), durable writes are confirmed again.
        cluster.restart_node(master)
        extra = iter(records_on(cluster, replica, prefix + "c", 200))
        wait_until(
            lambda: write(durable, [next(extra)], [], None)[0],
            FAILOVER_TIMEOUT,
            "a durable write to be confirmed by the rejoined replica",
        )
    finally:
        for node in cluster.nodes:
            if node.paused:
                node.resume()
        plain.close()
        durable.close()
        client.close()


def write(
    store: RedisStore,
    to_complete: list[Record],
    to_claim: list[Record],
    cut: tuple[ClusterProcesses, RedisServer, RedisServer] | None,
) -> tuple[list[Record], list[Record]]:
    """Complete and claim records; return what was acknowledged.

    ``cut=(cluster, master, replica)`` first partitions the replica from its master: SIGSTOP
    alone is not enough (the kernel keeps buffering the replication stream, and the replica
    applies it when it wakes), so the master also drops its replication link.
    """
    if cut is not None:
        cluster, master, replica = cut
        replica.pause()
        cluster._ask(master, "CLIENT", "KILL", "TYPE", "replica")
    completed: list[Record] = []
    claimed: list[Record] = []
    for record in to_complete:
        try:
            claim = store.claim(record, "fp", heartbeat=False)
            assert isinstance(claim, Claimed)
            if store.complete(record, claim.owner, record.digest.encode()):
                completed.append(record)
        except StoreError:
            pass
    for record in to_claim:
        try:
            if isinstance(store.claim(record, "fp", lease_ms=60_000, heartbeat=False), Claimed):
                claimed.append(record)
        except StoreError:
            pass
    return completed, claimed


def fail_over(
    cluster: ClusterProcesses, master: RedisServer, replica: RedisServer, record: Record
) -> None:
    """Kill ``master`` (its replica still stalled), wake the replica, wait for its promotion."""
    slot = key_slot(record.key.encode())
    master.kill()
    replica.resume()
    assert cluster.wait_failover(slot, master, FAILOVER_TIMEOUT) is replica


def wait_for(predicate: Callable[[], object], message: str) -> None:
    wait_until(predicate, FAILOVER_TIMEOUT, message)
