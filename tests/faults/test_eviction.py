"""An evicting server takes a running request's record: idemkey notices, and says why.

The promise cannot be kept (eviction destroys the record), so the failure must be loud. The
running request's record, its lease with it, is evicted for real (tests/faults/_eviction.py: a
``volatile-lru`` server filled with keys that have no TTL), the filler is freed, as the cache's
owner would, and a duplicate arrives while the first owner still runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from idemkey import Event, LeaseLostError, Policy, RedisStore, guard
from idemkey.records import GUARD_METHOD, record_for
from tests._lease import lease_holder
from tests._servers import RedisServer, wait_until
from tests.faults._eviction import evict_every_key_with_a_ttl, evicting_server

pytestmark = pytest.mark.redis

LEASE = 0.6  # seconds: the heartbeat renews every 0.2 s
KEY, PAYLOAD = "charge-7", {"order": 7, "amount": 500}


@pytest.fixture
def evicting(redis_server_factory: Callable[..., RedisServer]) -> Iterator[redis.Redis]:
    client = evicting_server(redis_server_factory).client(socket_timeout=5)
    try:
        yield client
    finally:
        client.close()


def test_an_evicted_running_record_is_reported_and_its_owner_stores_nothing(
    evicting: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="idemkey")
    record = record_for(prefix, "", GUARD_METHOD, "", KEY)
    events: list[Event] = []
    store = RedisStore(evicting, Policy(prefix=prefix, lease=LEASE, on_event=events.append))
    rival = RedisStore(evicting, Policy(prefix=prefix))
    started, finish = threading.Event(), threading.Event()
    outcome: list[BaseException | Any] = []
    fences: list[int] = []

    def first_owner() -> None:
        try:
            with guard(store, KEY, payload=PAYLOAD) as call:
                fences.append(call.fence or 0)
                started.set()
                assert finish.wait(30), "the test never let the first owner finish"
                call.save({"charge": "ch_first"})
            outcome.append("completed")
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=first_owner)
    worker.start()
    try:
        assert started.wait(10), "the first owner never claimed"
        assert evict_every_key_with_a_ttl(evicting, record) >= 1  # one key: the record

        # The duplicate cannot tell an evicted record from a new key: no takeover. But its fence
        # is above the first owner's, never a repeat of it (issue 34: it was 1 again).
        [first] = fences
        duplicate = guard(rival, KEY, payload=PAYLOAD)
        with duplicate as call:
            assert (call.replayed, call.takeover) == (False, False)
            assert call.fence is not None
            assert call.fence > first
            assert duplicate.claim is not None
            rival_owner = duplicate.claim.owner.encode()

            # The first owner's heartbeat notices: an event and a WARNING that name the cause.
            lost = wait_until(
                lambda: [e for e in events if e.kind == "record_lost"],
                timeout=10,
                message="the heartbeat to report the lost record",
            )
            assert [(e.record, e.fence) for e in lost] == [(record.digest, first)]
            assert "evicted" in lost[0].detail
            assert "maxmemory-policy noeviction" in lost[0].detail
            # ...and stops renewing: the lease is the duplicate's, never taken back or extended.
            assert lease_holder(evicting, record) == rival_owner
            before = evicting.hgetall(record.key)

            # The first owner finishes: told its lease is lost, and nothing of it is stored.
            finish.set()
            worker.join(10)
            assert not worker.is_alive()
            [error] = outcome
            assert isinstance(error, LeaseLostError)
            assert error.fence == first
            assert evicting.hgetall(record.key) == before  # no half record, no overwrite
            assert lease_holder(evicting, record) == rival_owner
            call.save({"charge": "ch_second"})
    finally:
        finish.set()
        worker.join(10)
        store.close()
        rival.close()

    [lease_lost] = [e for e in events if e.kind == "lease_lost"]
    assert "evicted" in lease_lost.detail  # the cause, not "another executor took it over"
    assert "maxmemory-policy noeviction" in lease_lost.detail
    warnings = {
        getattr(r, "idemkey_event", None): r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
    }
    assert "evicted" in warnings["record_lost"]
    assert record.digest in warnings["record_lost"]  # no request: the record is named
    assert "maxmemory-policy noeviction" in warnings["lease_lost"]
    with guard(RedisStore(evicting, Policy(prefix=prefix)), KEY, payload=PAYLOAD) as again:
        assert again.replayed
        assert again.result == {"charge": "ch_second"}


def test_a_record_lost_on_a_noeviction_server_names_every_cause(
    private_redis_server: RedisServer, prefix: str
) -> None:
    """A FLUSHDB (or a restart without persistence, a failover to a replica that missed the
    claim) loses the record on a server that never evicts: the detail and the error name those
    causes too, not eviction or another executor alone."""
    events: list[Event] = []
    client = private_redis_server.client()
    assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    store = RedisStore(client, Policy(prefix=prefix, on_event=events.append))

    def charge_while_the_database_is_flushed() -> None:
        with guard(store, KEY, payload=PAYLOAD) as call:
            client.flushdb()
            call.save({"charge": "ch_1"})

    try:
        with pytest.raises(LeaseLostError) as lost:
            charge_while_the_database_is_flushed()
    finally:
        store.close()
        client.close()
    [lease_lost] = [e for e in events if e.kind == "lease_lost"]
    for cause in ("evicted", "restart without persistence", "failover", "FLUSHDB", "DEL"):
        assert cause in lease_lost.detail, cause
        assert cause in str(lost.value), cause
