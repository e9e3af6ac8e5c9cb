"""Records written by idemkey 0.1 (hex fingerprint, every claim field kept after completion) are
read by the current scripts: a matching retry replays, another request is a mismatch, and an
old in-progress record is in flight until its lease lapses, then taken over.

The old records are written field by field exactly as 0.1's claim.lua and complete.lua left
them, so these tests do not depend on the old scripts' text.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from idemkey import KeyReuseError, Policy, RedisStore, guard
from idemkey._codec import StoredResponse, encode_payload, encode_response, encode_value
from idemkey._core import fingerprint, payload_fingerprint, record_state
from idemkey.adapters.wsgi import IdempotencyMiddleware
from idemkey.guard import GUARD_METHOD
from idemkey.http import Exchange, Headers, Request, begin
from idemkey.records import Claimed, InFlight, Mismatch, Record, Replay, record_for
from tests._servers import wait_until
from tests.adapters.harness_wsgi import environ_for

TTL_MS = 60_000
OLD_AT = b"1764494336796"  # 0.1 wrote the server time of the last claim or completion


@pytest.fixture
def store(sync_client: redis.Redis, prefix: str) -> Iterator[RedisStore]:
    store = RedisStore(sync_client, Policy(prefix=prefix, wait=0))
    try:
        yield store
    finally:
        store.close()


def old_complete(client: redis.Redis, record: Record, fp: bytes, resp: bytes) -> str:
    """What 0.1's complete.lua left: every claim field, a hex fingerprint. Returns the owner."""
    owner = os.urandom(16).hex()
    client.hset(record.key, mapping={
        "state": "complete", "fp": fp.hex(), "owner": owner, "fence": 1, "tk": 0,
        "at": OLD_AT, "resp": resp,
    })  # fmt: skip
    client.pexpire(record.key, TTL_MS)
    return owner


def old_in_progress(client: redis.Redis, record: Record, fp: bytes, lease_ms: int) -> str:
    """What 0.1's claim.lua left for a claim in progress: the hash and the lock."""
    owner = os.urandom(16).hex()
    client.hset(record.key, mapping={
        "state": "in_progress", "fp": fp.hex(), "owner": owner, "fence": 1, "tk": 0,
        "at": OLD_AT,
    })  # fmt: skip
    client.pexpire(record.key, TTL_MS)
    client.set(record.lock, owner, px=lease_ms)
    return owner


def test_an_old_completed_record_replays_and_refuses_another_request(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    record, fp = record_for(prefix, "", "POST", "/r", "k"), payload_fingerprint(b"one")
    owner = old_complete(sync_client, record, fp, b"stored by 0.1")
    before = sync_client.hgetall(record.key)
    assert store.claim(record, fp) == Replay(b"stored by 0.1")
    assert store.claim(record, payload_fingerprint(b"two")) == Mismatch()
    # A complete re-sent across the upgrade: its owner is told 1, anyone else 0; nothing written.
    assert store.complete(record, owner, b"again") is True
    assert store.complete(record, os.urandom(16).hex(), b"late") is False
    assert store.release(record, owner) is False
    assert sync_client.hgetall(record.key) == before
    assert record_state(before) == "complete"


def test_an_old_guard_record_replays_through_guard(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    record = record_for(prefix, "", GUARD_METHOD, "", "invoice-7")
    fp = payload_fingerprint(encode_payload({"amount": 5}))
    old_complete(sync_client, record, fp, encode_value({"charge": "ch_1"}))
    with guard(store, "invoice-7", payload={"amount": 5}) as call:
        assert call.replayed
        assert call.result == {"charge": "ch_1"}
    with (
        pytest.raises(KeyReuseError),
        guard(store, "invoice-7", payload={"amount": 6}),
    ):
        pytest.fail("a different payload ran under an old record's key")


def test_an_old_in_progress_record_is_in_flight_then_taken_over(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    record, fp = record_for(prefix, "", "POST", "/r", "k"), payload_fingerprint(b"one")
    old_owner = old_in_progress(sync_client, record, fp, lease_ms=60_000)
    decision = store.claim(record, fp, heartbeat=False)
    assert isinstance(decision, InFlight)
    assert 0 < decision.retry_after <= 60
    assert store.claim(record, payload_fingerprint(b"two"), heartbeat=False) == Mismatch()

    sync_client.pexpire(record.lock, 1)  # the old owner crashed: its lease lapses
    wait_until(lambda: not sync_client.exists(record.lock), timeout=5, message="lock expiry")
    taken = store.claim(record, fp, heartbeat=False)
    assert isinstance(taken, Claimed)
    assert taken.takeover is True
    assert taken.fence > 1  # above the old record's counter: the clock's microseconds
    assert store.complete(record, old_owner, b"late") is False  # the old owner lost it
    assert store.complete(record, taken.owner, b"new") is True
    assert store.complete(record, old_owner, b"late") is False
    assert store.claim(record, fp) == Replay(b"new")
    fields = sync_client.hgetall(record.key)
    assert fields.keys() == {b"fp", b"resp"}  # the new layout from here on


def test_an_old_record_released_with_steps_keeps_its_payload(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    record, fp = record_for(prefix, "", "POST", "/r", "k"), payload_fingerprint(b"one")
    # 0.1's release.lua with finished steps: fp (hex), fence and the steps stay.
    sync_client.hset(record.key, mapping={"fp": fp.hex(), "fence": 1, "ns": 1, "s:a": b"x"})
    assert store.claim(record, payload_fingerprint(b"two"), heartbeat=False) == Mismatch()
    claimed = store.claim(record, fp, heartbeat=False)
    assert isinstance(claimed, Claimed)
    assert claimed == Claimed(claimed.owner, claimed.fence, False, (("a", b"x"),))
    assert claimed.fence > 1


def _wsgi_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("201 Created", [("Content-Type", "text/plain")])
    return [b"ran again"]


def test_an_old_http_record_replays_through_the_wsgi_adapter(
    store: RedisStore, sync_client: redis.Redis
) -> None:
    headers = [("Idempotency-Key", "order-1"), ("Content-Type", "text/plain")]
    step = begin(store.policy, Request("POST", "/things", "", Headers(headers)))
    assert isinstance(step, Exchange)
    fp = fingerprint("POST", "/things", "", "text/plain", b"payload")
    assert step.fingerprint(b"payload") == fp
    stored = StoredResponse(
        201, (("Content-Type", "text/plain"),), b"stored by 0.1", True, "Created"
    )
    old_complete(sync_client, step.record, fp, encode_response(stored))
    app = IdempotencyMiddleware(_wsgi_app, store)
    answers: list[str] = []

    def start_response(status: str, headers: Any, exc_info: Any = None) -> Any:
        answers.append(status)
        return lambda data: None

    body = b"".join(app(environ_for("POST", "/things", headers, b"payload"), start_response))
    assert (answers[-1], body) == ("201 Created", b"stored by 0.1")
    b"".join(app(environ_for("POST", "/things", headers, b"other"), start_response))
    assert answers[-1].startswith("422")
