"""Checkpoints under Policy(durability=Replicas(...)), against a real primary and replica:
a step returns only once its checkpoint is on the replica; one that no replica confirmed
raises StoreError and does not count as finished."""

from __future__ import annotations

import pytest

from idemkey import Policy, RedisStore, StoreError, guard
from idemkey._core import record_for
from idemkey.guard import GUARD_METHOD
from idemkey.policy import Replicas
from tests._servers import RedisServer
from tests.faults.test_durability import TIMEOUT, client_of, pair  # noqa: F401 (fixture)

pytestmark = pytest.mark.redis


def test_a_step_returns_once_its_checkpoint_is_on_the_replica(
    pair: tuple[RedisServer, RedisServer],  # noqa: F811
    prefix: str,
) -> None:
    primary, replica = pair
    client, replica_client = client_of(primary), client_of(replica)
    store = RedisStore(client, Policy(prefix=prefix, durability=Replicas(1, TIMEOUT)))
    record = record_for(prefix, "", GUARD_METHOD, "", "order-1")
    runs: list[str] = []
    try:
        with guard(store, "order-1") as call:
            call.step("reserve", runs.append, "reserve")
            # Read at once from the replica: no waiting, it is there already.
            assert replica_client.hget(record.key, "s:reserve") is not None
            replica.pause()
            try:
                with pytest.raises(StoreError, match="checkpoint reached 0 of 1 replicas"):
                    call.step("charge", runs.append, "charge")
            finally:
                replica.resume()
            # Not finished as far as this call knows: it runs again (the PSP's step_key
            # makes that safe downstream).
            call.step("charge", runs.append, "charge")
            call.save(None)
    finally:
        store.close()
        client.close()
        replica_client.close()
    assert runs == ["reserve", "charge", "charge"]
