"""``store.cancel(seen=...)`` (cancel.lua's ARGV[2] and ARGV[3]), both stores.

What ``idemkey cancel`` relies on: given the (state, fence) the operator was shown, a record
that is no longer that (claimed again since, completed, released, gone) is kept byte for byte
and the answer says what it is now; the record that was shown is cancelled as without ``seen``.
"""

from __future__ import annotations

from idemkey.records import Claimed
from idemkey.store import Cancelled
from tests.store._both import AsyncStore, Both, SyncStore, _resolve

FP = b"0123456789abcdef"


class CancelSeenBehaviour:
    async def test_the_record_shown_is_cancelled(self, store: Both) -> None:
        record = store.record()
        claim = await store.claim(record, FP, heartbeat=False)
        assert isinstance(claim, Claimed)
        fence = await _resolve(store.client.hget(record.key, "fence"))
        found = await _resolve(store.store.cancel(record, seen=("in_progress", fence)))
        assert found is not None
        assert (found.was, found.changed) == ("in_progress", False)
        assert not await store.complete(record, claim.owner, b"late")

    async def test_a_claim_made_since_keeps_its_run(self, store: Both) -> None:
        record = store.record()
        assert isinstance(await store.claim(record, FP, heartbeat=False), Claimed)
        await store.expire_lock(record)
        shown = ("lapsed", await _resolve(store.client.hget(record.key, "fence")))
        retry = await store.claim(record, FP, heartbeat=False)  # takes the lapsed claim over
        assert isinstance(retry, Claimed)
        before = await store.snapshot(record)
        found = await _resolve(store.store.cancel(record, seen=shown))
        assert found == Cancelled("in_progress", 0, changed=True)
        assert await store.snapshot(record) == before
        assert await store.complete(record, retry.owner, b"resp")  # still the retry's run

    async def test_a_lapsed_claim_as_shown_is_cancelled(self, store: Both) -> None:
        record = store.record()
        assert isinstance(await store.claim(record, FP, heartbeat=False), Claimed)
        await store.expire_lock(record)
        fence = await _resolve(store.client.hget(record.key, "fence"))
        found = await _resolve(store.store.cancel(record, seen=("lapsed", fence)))
        assert found is not None
        assert (found.was, found.changed) == ("in_progress", False)

    async def test_a_record_completed_or_gone_since_is_kept(self, store: Both) -> None:
        record = store.record()
        claim = await store.claim(record, FP, heartbeat=False)
        assert isinstance(claim, Claimed)
        shown = ("in_progress", await _resolve(store.client.hget(record.key, "fence")))
        assert await store.complete(record, claim.owner, b"resp")
        before = await store.snapshot(record)
        found = await _resolve(store.store.cancel(record, seen=shown))
        assert found == Cancelled("complete", 0, changed=True)
        assert await store.snapshot(record) == before
        await store.delete(record.key)
        assert await _resolve(store.store.cancel(record, seen=shown)) == Cancelled(
            "", 0, changed=True
        )
        assert await store.keys() == []


class TestRedisStoreCancelSeen(SyncStore, CancelSeenBehaviour):
    pass


class TestAsyncRedisStoreCancelSeen(AsyncStore, CancelSeenBehaviour):
    pass
