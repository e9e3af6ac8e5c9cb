"""Every script through the stores: claim, complete, release, renew, on real Redis and fakeredis.

Each behaviour is written once (``ScriptBehaviour``) and runs for RedisStore and
AsyncRedisStore. Records are compared byte for byte where a call must change nothing.
"""

from __future__ import annotations

from idemkey._core import RECORD_LOST, owner_tag
from idemkey.records import Claimed, InFlight, Mismatch, Replay, new_owner, payload_fingerprint
from tests.store._both import (
    AsyncStore,
    BatchedAsyncStore,
    Both,
    GlideAsyncStore,
    PlainAsyncStore,
    PlainSyncStore,
    SyncStore,
    ValkeyPyAsyncStore,
    ValkeyPySyncStore,
    _resolve,
)

LEASE_MS = 10_000
TTL_MS = 100_000


class ScriptBehaviour:
    async def test_a_first_claim_owns_the_record(self, store: Both) -> None:
        record = store.record()
        decision = await store.claim(record, "fp1", owner="o1", heartbeat=False)
        assert decision == Claimed("o1", decision.fence, False)
        fields = await store.hash(record)
        assert fields[b"state"] == b"in_progress"
        assert fields[b"fp"] == b"fp1"
        assert fields[b"owner"] == b"o1"
        # The fence: the server's clock in microseconds, as digits; f0 the record's first.
        assert fields[b"fence"] == fields[b"f0"] == str(decision.fence).encode()
        assert abs(decision.fence / 1e6 - await store.server_time()) < 60
        # No time of the claim, no takeover; the lease a deadline on the server's clock.
        assert fields.keys() == {b"state", b"fp", b"owner", b"fence", b"f0", b"lease"}
        assert await store.lock_holder(record) == b"o1"
        assert 0 < await store.lease_left(record) <= store.store.policy.lease_ms

    async def test_a_claim_names_a_fresh_owner_when_none_is_given(self, store: Both) -> None:
        first = await store.claim(store.record("a"), heartbeat=False)
        second = await store.claim(store.record("b"), heartbeat=False)
        assert isinstance(first, Claimed)
        assert isinstance(second, Claimed)
        assert first.owner != second.owner
        assert await store.lock_holder(store.record("a")) == first.owner.encode()

    async def test_a_resent_claim_is_claimed_again_with_the_same_fence(self, store: Both) -> None:
        # redis-py re-sends a command after a timeout: the script may run twice for one call.
        record = store.record()
        first = await store.claim(record, owner="o1", heartbeat=False)
        before = await store.snapshot(record)
        again = await store.claim(record, owner="o1", heartbeat=False)
        assert first == again == Claimed("o1", again.fence, False)
        assert await store.snapshot(record) == before

    async def test_a_resent_takeover_is_still_a_takeover(self, store: Both) -> None:
        record = store.record()
        crashed = await store.claim(record, owner="crashed", heartbeat=False)
        await store.expire_lock(record)
        first = await store.claim(record, owner="o2", heartbeat=False)
        assert first == Claimed("o2", first.fence, True)
        assert first.fence > crashed.fence
        assert await store.claim(record, owner="o2", heartbeat=False) == first

    async def test_another_owner_is_told_the_claim_is_in_flight(self, store: Both) -> None:
        record = store.record()
        await store.claim(record, owner="o1", lease_ms=LEASE_MS, heartbeat=False)
        before = await store.snapshot(record)
        decision = await store.claim(record, owner="o2", lease_ms=LEASE_MS, heartbeat=False)
        assert isinstance(decision, InFlight)
        assert 0 < decision.retry_after <= LEASE_MS / 1000
        assert await store.snapshot(record) == before

    async def test_another_payload_while_in_flight_is_a_mismatch(self, store: Both) -> None:
        record = store.record()
        await store.claim(record, "fp1", owner="o1", heartbeat=False)
        before = await store.snapshot(record)
        assert await store.claim(record, "fp2", owner="o2", heartbeat=False) == Mismatch()
        assert await store.snapshot(record) == before

    async def test_complete_stores_the_response_and_frees_the_lease(self, store: Both) -> None:
        record = store.record()
        await store.claim(record, "fp1", owner="o1", heartbeat=False)
        response = b"\x01\x00\xffbinary \r\n response"
        assert await store.complete(record, "o1", response) is True
        # Only what a replay and a re-sent complete need: the response, and the fingerprint
        # followed by a 12-character tag of the owner (a hash of an owner like "o1").
        tag = owner_tag("o1").encode()
        assert await store.hash(record) == {b"fp": b"fp1" + tag, b"resp": response}
        assert await store.lock_holder(record) is None
        # Every retry with the same fingerprint gets the stored bytes in one round trip.
        for owner in ("o1", "o2", "o3"):
            assert await store.claim(record, "fp1", owner=owner) == Replay(response)

    async def test_a_completed_record_keeps_16_fingerprint_bytes_and_an_owner_tag(
        self, store: Both
    ) -> None:
        record, owner, fp = store.record(), new_owner(), payload_fingerprint(b'{"amount": 5}')
        assert len(fp) == 16  # raw bytes, not hex
        await store.claim(record, fp, owner=owner, heartbeat=False)
        await store.checkpoint(record, owner, "s:charge", b"step result")
        assert await store.complete(record, owner, b"resp") is True
        # idemkey's owners are 32 random hex digits: their first 12 are the tag. The claim's
        # fields and the finished steps are gone.
        assert await store.hash(record) == {b"fp": fp + owner[:12].encode(), b"resp": b"resp"}
        assert await store.claim(record, fp, owner=new_owner()) == Replay(b"resp")
        assert await store.claim(record, fp[::-1], owner=new_owner()) == Mismatch()

    async def test_complete_keeps_the_tag_it_is_sent_and_knows_a_resend_by_it(
        self, store: Both
    ) -> None:
        # The tag is computed in Python only (owner_tag) and sent as ARGV[4]; the script never
        # derives its own from the owner.
        record = store.record()
        await store.claim(record, "fp1", owner="o1", heartbeat=False)
        args = (record.key, "o1", b"resp", TTL_MS)
        assert await _resolve(store.store._eval("complete", *args, "t" * 12)) == 1
        assert await store.hash(record) == {b"fp": b"fp1" + b"t" * 12, b"resp": b"resp"}
        before = await store.snapshot(record)
        assert await _resolve(store.store._eval("complete", *args, "t" * 12)) == 1  # a re-send
        assert await _resolve(store.store._eval("complete", *args, "u" * 12)) == 0
        assert await store.snapshot(record) == before

    async def test_a_completed_record_with_another_payload_is_untouched(self, store: Both) -> None:
        record = store.record()
        await store.claim(record, "fp1", owner="o1", heartbeat=False)
        await store.complete(record, "o1", b"resp")
        before = await store.snapshot(record)
        before_ttl = await store.pttl(record.key)
        assert await store.claim(record, "fp2", owner="o2") == Mismatch()
        assert await store.snapshot(record) == before
        assert await store.pttl(record.key) <= before_ttl  # retention not extended either

    async def test_a_resent_complete_succeeds_and_changes_nothing(self, store: Both) -> None:
        record = store.record()
        await store.claim(record, owner="o1", heartbeat=False)
        assert await store.complete(record, "o1", b"first") is True
        before = await store.snapshot(record)
        assert await store.complete(record, "o1", b"first") is True
        assert await store.snapshot(record) == before

    async def test_a_late_complete_of_a_taken_over_owner_is_refused_after_completion(
        self, store: Both
    ) -> None:
        # Owners drawn by new_owner() (tagged by their first 12 digits) and custom ones
        # (tagged by a digest): the loser is told 0, the winner's re-send 1.
        for loser, winner in ((new_owner(), new_owner()), ("worker-1:aaaa", "worker-1:aaab")):
            record = store.record(loser)
            await store.claim(record, owner=loser, heartbeat=False)
            await store.expire_lock(record)
            await store.claim(record, owner=winner, heartbeat=False)
            assert await store.complete(record, winner, b"winner") is True
            before = await store.snapshot(record)
            assert await store.complete(record, loser, b"loser") is False
            assert await store.complete(record, winner, b"winner") is True
            assert await store.release(record, loser) is False
            assert await store.snapshot(record) == before

    async def test_release_frees_the_key_and_keeps_the_fence(self, store: Both) -> None:
        record = store.record()
        first = await store.claim(record, "fp1", owner="o1", heartbeat=False)
        assert await store.release(record, "o1") is True
        fence = str(first.fence).encode()
        assert await store.hash(record) == {b"fence": fence, b"f0": fence, b"ro": b"o1"}
        assert await store.lock_holder(record) is None
        # A retry starts fresh, even with another payload, and its fence keeps growing.
        again = await store.claim(record, "fp2", owner="o2", heartbeat=False)
        assert again == Claimed("o2", again.fence, False)
        assert again.fence > first.fence

    async def test_a_resent_release_answers_released_and_changes_nothing(self, store: Both) -> None:
        # A release whose reply was lost, sent again by its owner: released (not "not ours",
        # which the guard would report as a lost lease), and nothing written. Another owner is
        # still told 0.
        record = store.record()
        await store.claim(record, owner="o1", heartbeat=False)
        assert await store.release(record, "o1") is True
        before = await store.snapshot(record)
        assert await store.release(record, "o1") is True
        assert await store.release(record, "o2") is False
        assert await store.snapshot(record) == before
        # Claimed again by another owner: the first owner's re-send is still answered released.
        await store.claim(record, owner="o3", heartbeat=False)
        assert await store.release(record, "o1") is True
        assert (await store.hash(record))[b"owner"] == b"o3"
        await store.complete(record, "o3", b"resp")
        assert b"ro" not in await store.hash(record)  # a completed record keeps resp and fp

    async def test_release_never_touches_a_completed_record(self, store: Both) -> None:
        record = store.record()
        await store.claim(record, owner="o1", heartbeat=False)
        await store.complete(record, "o1", b"resp")
        before = await store.snapshot(record)
        assert await store.release(record, "o1") is False
        assert await store.release(record, "o2") is False
        assert await store.snapshot(record) == before

    async def test_nobody_but_the_owner_completes_releases_or_renews(self, store: Both) -> None:
        record = store.record()
        await store.claim(record, owner="o1", lease_ms=LEASE_MS, heartbeat=False)
        before = await store.snapshot(record)
        assert await store.complete(record, "o2", b"forged") is False
        assert await store.release(record, "o2") is False
        assert await store.renew(record, "o2", lease_ms=LEASE_MS) is False
        assert await store.snapshot(record) == before

    async def test_a_lapsed_lease_is_taken_over_with_a_bumped_fence(self, store: Both) -> None:
        record = store.record()
        first = await store.claim(record, "fp1", owner="o1", heartbeat=False)
        await store.expire_lock(record)
        decision = await store.claim(record, "fp1", owner="o2", heartbeat=False)
        assert decision == Claimed("o2", decision.fence, True)
        assert decision.fence > first.fence
        assert (await store.hash(record))[b"owner"] == b"o2"
        assert await store.lock_holder(record) == b"o2"

    async def test_a_stale_owner_cannot_complete_release_or_renew(self, store: Both) -> None:
        record = store.record()
        await store.claim(record, "fp1", owner="stale", heartbeat=False)
        await store.expire_lock(record)
        await store.claim(record, "fp1", owner="new", lease_ms=LEASE_MS, heartbeat=False)
        before = await store.snapshot(record)
        assert await store.complete(record, "stale", b"late result") is False
        assert await store.release(record, "stale") is False
        assert await store.renew(record, "stale", lease_ms=LEASE_MS) is False
        assert await store.snapshot(record) == before
        # ...and once the new owner completed, the stale one still changes nothing.
        assert await store.complete(record, "new", b"result") is True
        before = await store.snapshot(record)
        assert await store.complete(record, "stale", b"late result") is False
        assert await store.release(record, "stale") is False
        assert await store.snapshot(record) == before

    async def test_a_lapsed_lease_nobody_took_is_still_the_owners(self, store: Both) -> None:
        # The record still names the owner and nobody else ran the work: it may finish.
        record = store.record()
        await store.claim(record, owner="o1", heartbeat=False)
        await store.expire_lock(record)
        assert await store.renew(record, "o1", lease_ms=LEASE_MS) is True
        assert await store.lock_holder(record) == b"o1"
        await store.expire_lock(record)
        assert await store.complete(record, "o1", b"resp") is True
        assert await store.claim(record, owner="o2") == Replay(b"resp")

    async def test_renew_extends_the_lease(self, store: Both) -> None:
        record = store.record()
        await store.claim(record, owner="o1", lease_ms=1_000, heartbeat=False)
        assert await store.lease_left(record) <= 1_000
        assert await store.renew(record, "o1", lease_ms=60_000) is True
        assert 50_000 < await store.lease_left(record) <= 60_000
        assert await store.renew(record, "o1", lease_ms=60_000) is True  # re-sent: still fine

    async def test_a_renewed_claim_outlives_a_short_retention(self, store: Both) -> None:
        # A body that runs longer than the retention: without this, the record would expire
        # under the live claim, the owner's complete would be refused, and once the lock
        # lapsed the next caller would run the work again with fence 1.
        record = store.record()
        await store.claim(record, owner="o1", lease_ms=LEASE_MS, ttl_ms=TTL_MS, heartbeat=False)
        await store.pexpire(record.key, 2_000)  # the retention runs out before the work
        assert await store.renew(record, "o1", lease_ms=LEASE_MS) is True
        assert LEASE_MS / 2 < await store.pttl(record.key) <= LEASE_MS
        assert await store.complete(record, "o1", b"resp", ttl_ms=TTL_MS) is True
        assert TTL_MS / 2 < await store.pttl(record.key) <= TTL_MS

    async def test_renew_after_release_or_complete_is_refused(self, store: Both) -> None:
        released, completed = store.record("a"), store.record("b")
        await store.claim(released, owner="o1", heartbeat=False)
        await store.release(released, "o1")
        await store.claim(completed, owner="o1", heartbeat=False)
        await store.complete(completed, "o1", b"resp")
        assert await store.renew(released, "o1") is False
        assert await store.renew(completed, "o1") is False
        assert await store.lock_holder(released) is None
        assert await store.lock_holder(completed) is None

    async def test_a_renewal_whose_record_vanished_re_creates_nothing(self, store: Both) -> None:
        # The record evicted (or deleted) under its live claim: the lease, a field of it, went
        # with it. The renewal writes nothing back, and the owner is told its record is lost.
        record = store.record()
        await store.claim(record, owner="o1", lease_ms=LEASE_MS, heartbeat=False)
        await store.delete(record.key)
        assert await store.renew(record, "o1", lease_ms=60_000) is False
        assert await store.renew_reply(record, "o1", 60_000, fence=1) == RECORD_LOST
        assert await store.keys() == []

    async def test_a_record_claimed_afresh_after_it_vanished_is_lost_not_taken_over(
        self, store: Both
    ) -> None:
        record = store.record()
        first = await store.claim(record, "fp1", owner="o1", heartbeat=False)
        await store.delete(record.key)  # evicted under the running claim, its lease with it
        # The duplicate cannot tell: to its claim this is a new key; its fence is above ours.
        second = await store.claim(record, "fp1", owner="o2", heartbeat=False)
        assert second == Claimed("o2", second.fence, False)
        assert second.fence > first.fence
        before = await store.snapshot(record)
        # The record was created after the first owner's claim (its f0 is above the first
        # owner's fence): lost, not a takeover.
        fence = first.fence
        assert await store.renew_reply(record, "o1", LEASE_MS, fence=fence) == RECORD_LOST
        assert await store.complete_reply(record, "o1", b"late", fence=fence) == RECORD_LOST
        assert await store.snapshot(record) == before  # nothing written

    async def test_a_takeover_is_not_reported_as_a_lost_record(self, store: Both) -> None:
        record = store.record()
        first = await store.claim(record, "fp1", owner="o1", heartbeat=False)
        await store.expire_lock(record)
        second = await store.claim(record, "fp1", owner="o2", heartbeat=False)
        assert second == Claimed("o2", second.fence, True)
        fence = first.fence  # below the record's, but the record is the one it claimed (f0)
        assert await store.renew_reply(record, "o1", LEASE_MS, fence=fence) == 0
        assert await store.complete_reply(record, "o1", b"late", fence=fence) == 0
        released = store.record("released")  # nor a release, nor a completion
        fence = (await store.claim(released, owner="o1", heartbeat=False)).fence
        await store.release(released, "o1")
        assert await store.renew_reply(released, "o1", LEASE_MS, fence=fence) == 0
        assert await store.complete_reply(released, "o1", b"late", fence=fence) == 0
        # ...nor the release claimed again by another owner, whose fence is above ours too.
        await store.claim(released, owner="o3", heartbeat=False)
        assert await store.renew_reply(released, "o1", LEASE_MS, fence=fence) == 0
        assert await store.complete_reply(released, "o1", b"late", fence=fence) == 0
        completed = store.record("completed")
        fence = (await store.claim(completed, owner="o1", heartbeat=False)).fence
        await store.complete(completed, "o1", b"resp")
        assert await store.renew_reply(completed, "o1", LEASE_MS, fence=fence) == 0
        assert await store.complete_reply(completed, "o1", b"resp", fence=fence) == 1  # re-sent

    async def test_a_first_fence_that_is_no_number_is_read_as_none(self, store: Both) -> None:
        # Stored bytes are input: a damaged f0 falls back to the fences' comparison (a
        # takeover's fence is above ours: not lost) instead of failing the script.
        record = store.record()
        first = await store.claim(record, "fp1", owner="o1", heartbeat=False)
        await store.expire_lock(record)
        await store.claim(record, "fp1", owner="o2", heartbeat=False)
        await _resolve(store.client.hset(record.key, mapping={"f0": "x"}))
        assert await store.renew_reply(record, "o1", LEASE_MS, fence=first.fence) == 0
        assert await store.complete_reply(record, "o1", b"late", fence=first.fence) == 0

    async def test_a_completion_whose_record_vanished_writes_nothing(self, store: Both) -> None:
        # No half record: the fingerprint and fence went with the record, so a record made
        # from what the completion knows would refuse the client's retry or fence it wrongly.
        record = store.record()
        await store.claim(record, "fp1", owner="o1", heartbeat=False)
        await store.delete(record.key)
        assert await store.complete(record, "o1", b"resp") is False
        assert await store.complete_reply(record, "o1", b"resp", fence=1) == RECORD_LOST
        assert await store.hash(record) == {}

    async def test_ttls_follow_the_lease_and_the_retention(self, store: Both) -> None:
        record = store.record()
        await store.claim(record, owner="o1", lease_ms=LEASE_MS, ttl_ms=TTL_MS, heartbeat=False)
        assert LEASE_MS / 2 < await store.lease_left(record) <= LEASE_MS
        assert TTL_MS / 2 < await store.pttl(record.key) <= TTL_MS
        await store.complete(record, "o1", b"resp", ttl_ms=3 * TTL_MS)
        # Retention restarts at completion.
        assert 2 * TTL_MS < await store.pttl(record.key) <= 3 * TTL_MS
        assert await store.lease_left(record) == -2
        assert b"lease" not in await store.hash(record)

    async def test_the_policy_gives_the_default_lease_and_retention(self, store: Both) -> None:
        record = store.record()
        await store.claim(record, owner="o1", heartbeat=False)
        policy = store.store.policy
        assert policy.lease_ms / 2 < await store.lease_left(record) <= policy.lease_ms
        assert policy.ttl_ms / 2 < await store.pttl(record.key) <= policy.ttl_ms

    async def test_only_the_record_key_is_written(self, store: Both) -> None:
        record = store.record("}x{a}")
        await store.claim(record, owner="o1", heartbeat=False)
        assert await store.keys() == [record.key.encode()]
        await store.complete(record, "o1", b"resp")
        assert await store.keys() == [record.key.encode()]

    async def test_claim_waits_for_a_lapsing_lease(self, store: Both) -> None:
        record = store.record()
        first = await store.claim(record, owner="o1", lease_ms=300, heartbeat=False)
        decision = await store.claim(record, owner="o2", wait=10, heartbeat=False)
        # Either the first owner's lease lapsed while we polled (a takeover), or, on a very
        # slow machine, it had lapsed before our first poll: a takeover too. Never InFlight.
        assert decision == Claimed("o2", decision.fence, True)
        assert decision.fence > first.fence

    async def test_claim_gives_up_waiting_after_the_wait(self, store: Both) -> None:
        record = store.record()
        await store.claim(record, owner="o1", lease_ms=LEASE_MS, heartbeat=False)
        decision = await store.claim(record, owner="o2", wait=0.05, heartbeat=False)
        assert isinstance(decision, InFlight)


class TestRedisStoreScripts(SyncStore, ScriptBehaviour):
    pass


class TestAsyncRedisStoreScripts(AsyncStore, ScriptBehaviour):
    pass


# The same contract through valkey-py (the redis-py fork), on the real server only.
class TestValkeyPyStoreScripts(ValkeyPySyncStore, ScriptBehaviour):
    pass


class TestValkeyPyAsyncStoreScripts(ValkeyPyAsyncStore, ScriptBehaviour):
    pass


class TestPlainPathStoreScripts(PlainSyncStore, ScriptBehaviour):
    """The same contract on the plain path (execute_command), see test_lean.py."""


class TestPlainPathAsyncStoreScripts(PlainAsyncStore, ScriptBehaviour):
    pass


# The same contract through valkey-glide (AsyncRedisStore's facade, idemkey/store/_glide.py).
class TestGlideAsyncStoreScripts(GlideAsyncStore, ScriptBehaviour):
    pass


class TestBatchedAsyncStoreScripts(BatchedAsyncStore, ScriptBehaviour):
    pass
