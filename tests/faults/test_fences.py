"""Fences never repeat for a key, even when Redis forgot its record.

A fencing token that repeats is no fencing token: a downstream system that stored the first
owner's fence would accept a second writer with the same one. Until 0.3 a fence counted the
claims a record had seen, so a record lost while its owner ran (evicted: see test_eviction.py;
a restart without persistence; a failover to a replica that had not received the claim) gave
the next claim fence 1 again. claim.lua now takes ``max(stored fence + 1, server clock in
microseconds)``: these tests lose the record for real, on private servers (``redis-server``,
or ``IDEMKEY_TEST_SERVER=valkey``), and check that the duplicate's fence is above the first
owner's and that the first owner learns its record was lost; and that a record whose fence is
ahead of the clock (a clock stepped back) still grows by one, stored as plain digits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from idemkey import Policy, RedisStore, guard
from idemkey._core import RECORD_LOST, Claimed
from idemkey.records import GUARD_METHOD, Record, record_for
from tests._servers import RedisServer, no_retry, wait_until

pytestmark = pytest.mark.redis

KEY, PAYLOAD = "charge-9", {"order": 9, "amount": 700}
LEASE_MS = 60_000  # the first owner's lease outlives every test: only the loss frees the key


def the_record(prefix: str) -> Record:
    return record_for(prefix, "", GUARD_METHOD, "", KEY)


def first_owner(store: RedisStore, prefix: str) -> Claimed:
    """The first owner's claim of the guard's record (its fingerprint does not matter: the
    record is lost before anyone compares it)."""
    decision = store.claim(the_record(prefix), b"first", lease_ms=LEASE_MS, heartbeat=False)
    assert isinstance(decision, Claimed)
    return decision


def the_duplicate_runs_above(store: RedisStore, prefix: str, first: Claimed) -> int:
    """The duplicate, through guard(): it runs (the record is gone) with a fence above the
    first owner's, not a repeat of it; the first owner's renewal is told the record was lost,
    and its completion is refused. Returns the duplicate's fence."""
    with guard(store, KEY, payload=PAYLOAD) as call:
        assert not call.replayed
        assert not call.takeover
        fence = call.fence
        assert fence is not None
        assert fence > first.fence
        record = the_record(prefix)
        assert store._renew(record, first.owner, LEASE_MS, first.fence) == RECORD_LOST
        assert not store.complete(record, first.owner, b"stale")
        call.save({"charge": "ch_second"})
    return fence


def client_of(server: RedisServer) -> redis.Redis:
    return server.client(socket_timeout=5, socket_connect_timeout=2, retry=no_retry())


def test_a_restart_without_persistence_does_not_repeat_a_fence(
    private_redis_server: RedisServer, prefix: str
) -> None:
    client = client_of(private_redis_server)
    store = RedisStore(client, Policy(prefix=prefix))
    try:
        first = first_owner(store, prefix)
        private_redis_server.restart(kill=True)  # nothing on disk: the record is gone
        wait_until(lambda: client.ping(), 10, "the restarted server", ignore=(redis.RedisError,))
        assert client.exists(the_record(prefix).key) == 0
        the_duplicate_runs_above(store, prefix, first)
    finally:
        store.close()
        client.close()


@pytest.fixture
def primary_and_replica(
    redis_server_factory: Callable[..., RedisServer],
) -> Iterator[tuple[RedisServer, RedisServer]]:
    primary = redis_server_factory(["--repl-diskless-sync-delay", "0", "--shutdown-timeout", "0"])
    replica = redis_server_factory(["--replicaof", primary.host, str(primary.port)])
    probe = client_of(replica)
    try:
        wait_until(
            lambda: probe.info("replication").get("master_link_status") == "up",
            15,
            "the replica to sync",
        )
    finally:
        probe.close()
    yield primary, replica
    if replica.paused:
        replica.resume()


def test_a_failover_to_a_replica_that_missed_the_claim_does_not_repeat_a_fence(
    primary_and_replica: tuple[RedisServer, RedisServer], prefix: str
) -> None:
    primary, replica = primary_and_replica
    on_primary, on_replica = client_of(primary), client_of(replica)
    store = RedisStore(on_primary, Policy(prefix=prefix))
    promoted = RedisStore(on_replica, Policy(prefix=prefix))
    try:
        # Something of the prefix reaches the replica first: it was in sync.
        on_primary.set(f"{prefix}:synced", b"1", px=60_000)
        wait_until(lambda: on_replica.exists(f"{prefix}:synced"), 10, "the replica to sync")
        # The replica is cut off (frozen, and its link dropped: SIGSTOP alone would leave the
        # stream buffered in the kernel, applied on waking), then the claim is acknowledged.
        replica.pause()
        on_primary.execute_command("CLIENT", "KILL", "TYPE", "replica")
        first = first_owner(store, prefix)
        primary.kill()
        replica.resume()
        on_replica.execute_command("REPLICAOF", "NO", "ONE")  # the failover
        assert on_replica.exists(the_record(prefix).key) == 0  # it never had the claim
        the_duplicate_runs_above(promoted, prefix, first)
    finally:
        store.close()
        promoted.close()
        on_primary.close()
        on_replica.close()


def test_a_fence_ahead_of_the_clock_still_grows_by_one_and_is_stored_as_digits(
    real_client: redis.Redis, prefix: str
) -> None:
    """A clock stepped back: the record's fence (written while the clock was ahead) is above
    the clock now, and the next claim takes the stored fence + 1, exactly (2^53 bounds Lua's
    integers: microseconds since 1970 are about 1.8e15)."""
    store = RedisStore(real_client, Policy(prefix=prefix))
    record = the_record(prefix)
    try:
        first = first_owner(store, prefix)
        assert real_client.hget(record.key, "fence") == str(first.fence).encode()  # %d, no 1e+15
        assert store.release(record, first.owner)
        ahead = first.fence + 3_600 * 10**6  # an hour ahead of the clock
        real_client.hset(record.key, "fence", ahead)
        second = store.claim(record, b"second", heartbeat=False)
        assert isinstance(second, Claimed)
        assert second.fence == ahead + 1
        assert real_client.hget(record.key, "fence") == str(ahead + 1).encode()
        assert not second.takeover
        assert store.release(record, second.owner)
        # A new key's fence is the server's clock in microseconds.
        seconds, micros = real_client.time()
        fresh = store.claim(the_record(prefix + "n"), b"fp", heartbeat=False)
        assert isinstance(fresh, Claimed)
        assert 0 <= fresh.fence - (seconds * 10**6 + micros) < 60 * 10**6
    finally:
        store.close()
