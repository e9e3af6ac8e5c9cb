"""Fences never repeat for a key on a cluster either, when a node forgot the record.

The node that serves the record's slot loses it for real, while its first owner still holds a
claim: evicted (``volatile-lru`` on that node), lost in a restart without persistence (a
3-master cluster without replicas: the node comes back with its slots and no data), and lost
in a failover to a replica that had not received the claim (a 3-master, 3-replica cluster). The
duplicate's fence, from the node that serves the slot now, is above the first owner's (see
tests/faults/test_fences.py for the standalone server and the design).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from redis.crc import key_slot

from idemkey import Policy, RedisStore, StoreError
from tests._servers import wait_until
from tests.cluster._cluster import ClusterProcesses, running_cluster
from tests.faults._eviction import evict_every_key_with_a_ttl
from tests.faults.test_fences import first_owner, the_duplicate_runs_above, the_record

if TYPE_CHECKING:
    import redis.cluster

pytestmark = [pytest.mark.cluster, pytest.mark.redis]


@pytest.fixture(scope="module")
def masters_only() -> Iterator[ClusterProcesses]:
    """Three masters, no replica: a restarted node keeps its slots (nodes.conf) and no data."""
    with running_cluster(masters=3, replicas=0) as cluster:
        yield cluster


def client_of(cluster: ClusterProcesses) -> redis.cluster.RedisCluster:
    return cluster.client(socket_timeout=2.0, socket_connect_timeout=1.0)


def test_an_evicted_record_on_a_cluster_node_does_not_repeat_a_fence(
    masters_only: ClusterProcesses, prefix: str
) -> None:
    client = client_of(masters_only)
    store = RedisStore(client, Policy(prefix=prefix))
    record = the_record(prefix)
    node = masters_only.master_for_slot(key_slot(record.key.encode()))
    admin = masters_only.node_client(node, socket_timeout=5.0)
    try:
        first = first_owner(store, prefix)
        admin.config_set("maxmemory-policy", "volatile-lru")
        # The filler shares the record's hash tag, so it lands on the record's node.
        tag = record.key[record.key.index("{") :]
        assert evict_every_key_with_a_ttl(admin, record, f"cache:{tag}:{{}}") >= 1
        the_duplicate_runs_above(store, prefix, first)
    finally:
        admin.config_set("maxmemory", 0)
        admin.config_set("maxmemory-policy", "noeviction")
        admin.close()
        store.close()
        client.close()


def test_a_cluster_node_restarted_without_persistence_does_not_repeat_a_fence(
    masters_only: ClusterProcesses, prefix: str
) -> None:
    client = client_of(masters_only)
    store = RedisStore(client, Policy(prefix=prefix))
    record = the_record(prefix)
    try:
        first = first_owner(store, prefix)
        node = masters_only.master_for_slot(key_slot(record.key.encode()))
        masters_only.restart_node(node)  # SIGKILL, then the same port and nodes.conf
        admin = masters_only.node_client(node)
        try:
            assert admin.exists(record.key) == 0
        finally:
            admin.close()
        the_duplicate_runs_above(store, prefix, first)
    finally:
        store.close()
        client.close()


def test_a_cluster_failover_to_a_replica_that_missed_the_claim_does_not_repeat_a_fence(
    prefix: str,
) -> None:
    with running_cluster(masters=3, replicas=1, node_timeout_ms=1000) as cluster:
        cluster.wait_replicas_synced()
        client = client_of(cluster)
        store = RedisStore(client, Policy(prefix=prefix))
        record = the_record(prefix)
        slot = key_slot(record.key.encode())
        master = cluster.master_for_slot(slot)
        [replica] = cluster.replicas_of(master)
        try:
            # The replica is cut off (frozen, its link dropped: SIGSTOP alone would leave the
            # stream buffered in the kernel), then the master acknowledges the claim and dies.
            replica.pause()
            cluster._ask(master, "CLIENT", "KILL", "TYPE", "replica")
            first = first_owner(store, prefix)
            master.kill()
            replica.resume()
            assert cluster.wait_failover(slot, master, 30.0) is replica
            promoted = cluster.node_client(replica)
            try:
                assert promoted.exists(record.key) == 0  # it never had the claim
            finally:
                promoted.close()
            wait_until(
                lambda: the_duplicate_runs_above(store, prefix, first),
                30.0,
                "the duplicate to claim on the promoted replica",
                ignore=(StoreError,),
            )
        finally:
            if replica.paused:
                replica.resume()
            store.close()
            client.close()
