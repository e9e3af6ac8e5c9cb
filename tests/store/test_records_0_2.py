"""Records written by idemkey 0.2, the two-key layout (the record hash and a lock string holding
the lease), are read by 0.3's one-key scripts: a matching retry replays, another request is a
mismatch, a claim in flight stays in flight until its lock lapses, then it is taken over; a
release with finished steps resumes.

The 0.2 records are written by 0.2's own scripts, kept byte for byte in ``lua_0_2/`` (from
e04385c, the last 0.2 commit), so these tests pin what an upgrade meets, not a guess of it.
The upgrade step they justify (docs/operators.md, "Upgrading from 0.2"): 0.3 honours 0.2's
claims, but 0.2 cannot see 0.3's (it looks for the lock string 0.3 no longer writes), so 0.2
processes stop before 0.3 ones take traffic; the last test shows why.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from idemkey import Policy, RedisStore, guard
from idemkey._codec import encode_payload, encode_value
from idemkey._core import new_owner, owner_tag, payload_fingerprint
from idemkey.guard import GUARD_METHOD
from idemkey.records import Claimed, InFlight, Mismatch, Record, Replay, record_for
from tests._lease import lease_left
from tests._servers import wait_until

OLD_SCRIPTS = Path(__file__).parent / "lua_0_2"
LEASE_MS, TTL_MS = 60_000, 600_000


def run_0_2(client: redis.Redis, name: str, record: Record, *args: object) -> object:
    """Run 0.2's ``name``.lua as 0.2 sent it: two keys, the record and its lock string."""
    script = (OLD_SCRIPTS / f"{name}.lua").read_text()
    return client.eval(script, 2, record.record_key, record.lock_key, *args)


def claim_0_2(client: redis.Redis, record: Record, fp: bytes, owner: str) -> object:
    return run_0_2(client, "claim", record, fp, owner, LEASE_MS, TTL_MS)


def complete_0_2(client: redis.Redis, record: Record, owner: str, resp: bytes) -> object:
    return run_0_2(client, "complete", record, owner, resp, TTL_MS, owner_tag(owner))


@pytest.fixture
def store(sync_client: redis.Redis, prefix: str) -> Iterator[RedisStore]:
    store = RedisStore(sync_client, Policy(prefix=prefix, wait=0))
    try:
        yield store
    finally:
        store.close()


def test_a_record_completed_by_0_2_replays_and_refuses_another_request(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    record, fp = record_for(prefix, "", "POST", "/r", "k"), payload_fingerprint(b"one")
    owner = new_owner()
    assert claim_0_2(sync_client, record, fp, owner)[0] == 1  # type: ignore[index]
    assert complete_0_2(sync_client, record, owner, b"stored by 0.2") == 1
    before = sync_client.hgetall(record.key)
    assert store.claim(record, fp) == Replay(b"stored by 0.2")
    assert store.claim(record, payload_fingerprint(b"two")) == Mismatch()
    # A complete re-sent across the upgrade: its owner is told 1, anyone else 0.
    assert store.complete(record, owner, b"again") is True
    assert store.complete(record, new_owner(), b"late") is False
    assert sync_client.hgetall(record.key) == before


def test_a_guard_result_of_0_2_replays_through_guard(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    record = record_for(prefix, "", GUARD_METHOD, "", "invoice-7")
    fp, owner = payload_fingerprint(encode_payload({"amount": 5})), new_owner()
    claim_0_2(sync_client, record, fp, owner)
    complete_0_2(sync_client, record, owner, encode_value({"charge": "ch_1"}))
    with guard(store, "invoice-7", payload={"amount": 5}) as call:
        assert call.replayed
        assert call.result == {"charge": "ch_1"}


def test_a_claim_of_0_2_is_in_flight_until_its_lock_lapses_then_taken_over(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    record, fp = record_for(prefix, "", "POST", "/r", "k"), payload_fingerprint(b"one")
    old_owner = new_owner()
    assert claim_0_2(sync_client, record, fp, old_owner) == [1, 1, 0]
    decision = store.claim(record, fp, heartbeat=False)
    assert isinstance(decision, InFlight)
    assert 50 < decision.lease_remaining <= LEASE_MS / 1000  # the lock's PTTL, not a guess
    assert store.claim(record, payload_fingerprint(b"two"), heartbeat=False) == Mismatch()
    assert 50_000 < lease_left(sync_client, record) <= LEASE_MS  # type: ignore[operator]
    (status,) = store.records()
    assert status.state == "in_progress"
    assert status.lease_left is not None
    assert status.lease_left > 50

    sync_client.pexpire(record.lock_key, 1)  # the 0.2 owner crashed: its lease lapses
    wait_until(lambda: not sync_client.exists(record.lock_key), 5, "the 0.2 lock to lapse")
    (status,) = store.records()
    assert status.state == "lapsed"
    taken = store.claim(record, fp, heartbeat=False)
    assert isinstance(taken, Claimed)
    assert taken.takeover is True
    assert taken.fence > 1  # above the 0.2 claim's counter
    assert store.complete(record, old_owner, b"late") is False  # the 0.2 owner lost it
    assert complete_0_2(sync_client, record, old_owner, b"late") == 0  # in its own script too
    assert store.complete(record, taken.owner, b"new") is True
    assert store.claim(record, fp) == Replay(b"new")
    assert sync_client.hgetall(record.key).keys() == {b"fp", b"resp"}
    assert not sync_client.exists(record.lock_key)


def test_a_claim_of_0_2_still_completes_with_its_own_script(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    # A 0.2 process finishing the request it claimed while 0.3 processes answered its
    # duplicates: their in-flight answers wrote nothing it depends on.
    record, fp = record_for(prefix, "", "POST", "/r", "k"), payload_fingerprint(b"one")
    old_owner = new_owner()
    claim_0_2(sync_client, record, fp, old_owner)
    assert isinstance(store.claim(record, fp, heartbeat=False, wait=0), InFlight)
    assert run_0_2(sync_client, "renew", record, old_owner, LEASE_MS, 1) == 1
    assert complete_0_2(sync_client, record, old_owner, b"by 0.2") == 1
    assert store.claim(record, fp) == Replay(b"by 0.2")


def test_a_release_of_0_2_with_finished_steps_resumes_after_them(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    record, fp = record_for(prefix, "", "POST", "/r", "k"), payload_fingerprint(b"one")
    old_owner = new_owner()
    claim_0_2(sync_client, record, fp, old_owner)
    assert run_0_2(sync_client, "checkpoint", record, old_owner, "s:charge", b"ch_1") == 1
    assert run_0_2(sync_client, "release", record, old_owner) == 1
    assert store.claim(record, payload_fingerprint(b"two"), heartbeat=False) == Mismatch()
    claimed = store.claim(record, fp, heartbeat=False)
    assert isinstance(claimed, Claimed)
    assert claimed.steps == (("charge", b"ch_1"),)
    assert claimed.fence > 1  # above the 0.2 claim's counter


def test_0_2_does_not_see_a_claim_of_0_3_so_the_two_must_not_share_a_prefix(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    # Why the upgrade stops 0.2 before 0.3 takes traffic: 0.2's claim looks for its lock
    # string, which a 0.3 claim does not write, and takes the live claim over.
    record, fp = record_for(prefix, "", "POST", "/r", "k"), payload_fingerprint(b"one")
    claimed = store.claim(record, fp, heartbeat=False)
    assert isinstance(claimed, Claimed)
    assert claim_0_2(sync_client, record, fp, new_owner()) == [
        1,
        claimed.fence + 1,
        1,
    ]  # a takeover
