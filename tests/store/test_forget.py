"""``store.forget()`` (forget.lua), both stores, both backends, every send path.

What an operator relies on: the record goes with its expiry tombstone, a 0.2 lock string and its
wake-up stream, so the next claim of the key is a first claim (not ``expired``); a record a live
claim holds is kept, unless ``force``; a lapsed one is forgotten; what was found is said.
"""

from __future__ import annotations

import pytest

from idemkey import RecordFormatError
from idemkey.records import Claimed
from idemkey.store import Forgotten
from tests.store._both import (
    AsyncStore,
    BatchedAsyncStore,
    Both,
    GlideAsyncStore,
    PlainSyncStore,
    SyncStore,
    _resolve,
)

FP = b"0123456789abcdef"


class ForgetBehaviour:
    async def test_a_completed_record_goes_with_its_tombstone_and_runs_again(
        self, store: Both
    ) -> None:
        record = store.record()
        claim = await store.claim(record, FP, heartbeat=False)
        assert isinstance(claim, Claimed)
        assert await store.complete(record, claim.owner, b"resp", grace_ms=600_000)
        stone = record.key + ":gone"
        assert await _resolve(store.client.exists(stone))
        found = await _resolve(store.store.forget(record))
        assert found == Forgotten("complete", 2)
        assert found.forgotten
        assert await store.keys() == []
        again = await store.claim(record, FP, heartbeat=False, expired=True)
        assert isinstance(again, Claimed)  # a first claim, not Expired (410)

    async def test_a_live_claim_is_kept_unless_forced(self, store: Both) -> None:
        record = store.record()
        claim = await store.claim(record, FP, heartbeat=False)
        assert isinstance(claim, Claimed)
        before = await store.snapshot(record)
        assert await _resolve(store.store.forget(record)) == Forgotten("in_progress", 0, held=True)
        assert await store.snapshot(record) == before
        forced = await _resolve(store.store.forget(record, force=True))
        assert forced == Forgotten("in_progress", 1)
        assert await store.hash(record) == {}
        # The forgotten owner can no longer complete: nothing of it is stored.
        assert not await store.complete(record, claim.owner, b"late")
        assert await store.hash(record) == {}

    async def test_a_lapsed_claim_is_forgotten(self, store: Both) -> None:
        record = store.record()
        assert isinstance(await store.claim(record, FP, heartbeat=False), Claimed)
        await store.expire_lock(record)
        assert await _resolve(store.store.forget(record)) == Forgotten("lapsed", 1)

    async def test_a_released_record_with_steps_and_nothing(self, store: Both) -> None:
        record = store.record()
        claim = await store.claim(record, FP, heartbeat=False)
        assert isinstance(claim, Claimed)
        await store.checkpoint(record, claim.owner, "s:one", b"1")
        assert await store.release(record, claim.owner)
        assert await _resolve(store.store.forget(record)) == Forgotten("released", 1)
        nothing = await _resolve(store.store.forget(record))
        assert nothing == Forgotten("", 0)
        assert not nothing.forgotten

    async def test_a_0_2_claim_is_held_by_its_lock_string_which_goes_too(self, store: Both) -> None:
        record = store.record()
        # A claim idemkey 0.2 wrote: the state in the hash, the lease in the lock string.
        await _resolve(store.client.hset(record.key, mapping={"state": "in_progress"}))
        await _resolve(store.client.set(record.lock_key, "owner-0.2", px=60_000))
        assert await _resolve(store.store.forget(record)) == Forgotten("in_progress", 0, held=True)
        forced = await _resolve(store.store.forget(record, force=True))
        assert forced == Forgotten("in_progress", 2)
        assert await store.keys() == []
        # Its lease lapsed (no lock string left): forgotten without force.
        await _resolve(store.client.hset(record.key, mapping={"state": "in_progress"}))
        assert await _resolve(store.store.forget(record)) == Forgotten("lapsed", 1)

    @pytest.mark.parametrize("wait", [0.0, 1.0])
    async def test_a_key_of_another_type_is_refused_by_claim_and_forgotten(
        self, store: Both, wait: float
    ) -> None:
        # A list where the record's hash should be (a stranger's, or damage): every claim of
        # the key is refused as unreadable (not "Redis failed"), and forget, the remedy, takes
        # it with its hints, so the key runs afresh.
        record = store.record()
        await _resolve(store.client.rpush(record.key, "a", "b"))
        await _resolve(store.client.set(record.key + ":gone", "a tombstone"))
        for expired in (False, True):
            with pytest.raises(RecordFormatError, match="not an idemkey record: a list"):
                await store.claim(record, FP, heartbeat=False, wait=wait, expired=expired)
        assert await _resolve(store.client.lrange(record.key, 0, -1)) == [b"a", b"b"]
        found = await _resolve(store.store.forget(record))
        assert (found.state, found.deleted, found.held) == ("foreign", 2, False)
        assert found.forgotten
        assert await store.keys() == []
        assert isinstance(await store.claim(record, FP, heartbeat=False), Claimed)


class TestRedisStoreForget(SyncStore, ForgetBehaviour):
    pass


class TestAsyncRedisStoreForget(AsyncStore, ForgetBehaviour):
    pass


class TestPlainPathStoreForget(PlainSyncStore, ForgetBehaviour):
    pass


class TestGlideAsyncStoreForget(GlideAsyncStore, ForgetBehaviour):
    pass


class TestBatchedAsyncStoreForget(BatchedAsyncStore, ForgetBehaviour):
    pass
