"""Expired-key tombstones in the scripts (``Policy.expired_grace``), both stores, both backends.

complete.lua with ``grace_ms`` writes ``{prefix}:{<d>}:gone``: the claim's whole fingerprint
then the completion time in Unix ms (13 digits), living retention + grace. claim.lua asked to read
it (``expired=True``) answers :class:`Expired` for the same fingerprint once the record is gone,
:class:`Mismatch` for another, and writes nothing; a claim not asked ignores it.
"""

from __future__ import annotations

import time

import fakeredis
import pytest

from idemkey.records import (
    Claimed,
    Expired,
    Mismatch,
    Replay,
    payload_fingerprint,
)
from tests.store._both import (
    AsyncStore,
    BatchedAsyncStore,
    Both,
    GlideAsyncStore,
    PlainAsyncStore,
    PlainSyncStore,
    SyncStore,
    _resolve,
)

TTL_MS = 100_000
GRACE_MS = 500_000
FP = payload_fingerprint(b"order-1")
OTHER = payload_fingerprint(b"order-2")


def tombstone_of(record_key: str) -> str:
    return record_key + ":gone"


class TombstoneBehaviour:
    async def completed(self, store: Both, grace_ms: int = GRACE_MS) -> str:
        record = store.record()
        claim = await store.claim(record, FP, owner="o1", heartbeat=False)
        assert isinstance(claim, Claimed)
        ok = await store.complete(record, "o1", b"resp", ttl_ms=TTL_MS, grace_ms=grace_ms)
        assert ok
        return record.key

    async def test_a_completion_with_a_grace_writes_a_tombstone(self, store: Both) -> None:
        before = time.time()
        key = await self.completed(store)
        stone = await _resolve(store.client.get(tombstone_of(key)))
        assert stone[:16] == FP
        assert before - 1 <= int(stone[16:]) / 1000 <= time.time() + 1
        assert TTL_MS + GRACE_MS - 5_000 < await store.pttl(tombstone_of(key)) <= TTL_MS + GRACE_MS
        assert 0 < await store.pttl(key) <= TTL_MS  # the record keeps its own retention
        assert set(await store.hash(store.record())) == {b"fp", b"resp"}  # as without a grace

    async def test_no_grace_no_tombstone(self, store: Both) -> None:
        key = await self.completed(store, grace_ms=0)
        assert sorted(await store.keys()) == [key.encode()]

    async def test_a_release_leaves_no_tombstone(self, store: Both) -> None:
        record = store.record()
        await store.claim(record, FP, owner="o1", heartbeat=False)
        assert await store.release(record, "o1")
        assert not await _resolve(store.client.exists(tombstone_of(record.key)))

    async def test_while_the_record_lives_it_replays(self, store: Both) -> None:
        await self.completed(store)
        assert await store.claim(store.record(), FP, expired=True) == Replay(b"resp")

    async def test_after_the_record_expired_the_tombstone_answers(self, store: Both) -> None:
        key = await self.completed(store)
        await store.delete(key)  # the record's own expiry, brought forward
        before = await store.keys()
        decision = await store.claim(store.record(), FP, owner="o2", expired=True)
        assert isinstance(decision, Expired)
        assert abs(decision.completed_at - time.time()) < 60
        assert await store.claim(store.record(), OTHER, owner="o3", expired=True) == Mismatch()
        assert await store.keys() == before  # nothing written: no claim, no lock

    @pytest.mark.parametrize("fingerprint", [b"short", b"f" * 40, "a text fingerprint"])
    async def test_a_fingerprint_of_any_length_is_answered_expired(
        self, store: Both, fingerprint: bytes | str
    ) -> None:
        """store.claim takes any str or bytes: the tombstone keeps the whole fingerprint, so a
        retry with the same one is told expired (not mismatch) whatever its length, and one
        that only shares a prefix, or only extends it, is told mismatch."""
        record = store.record()
        assert isinstance(
            await store.claim(record, fingerprint, owner="o1", heartbeat=False), Claimed
        )
        assert await store.complete(record, "o1", b"resp", ttl_ms=TTL_MS, grace_ms=GRACE_MS)
        await store.delete(record.key)  # the record's own expiry, brought forward
        decision = await store.claim(record, fingerprint, owner="o2", expired=True)
        assert isinstance(decision, Expired)
        assert abs(decision.completed_at - time.time()) < 60
        for other in (fingerprint[:-1], fingerprint + fingerprint[:1], fingerprint[1:]):
            assert await store.claim(record, other, owner="o3", expired=True) == Mismatch()

    async def test_a_claim_not_asked_ignores_the_tombstone(self, store: Both) -> None:
        key = await self.completed(store)
        await store.delete(key)
        decision = await store.claim(store.record(), FP, owner="o2", heartbeat=False)
        assert isinstance(decision, Claimed)

    async def test_once_the_grace_is_over_the_key_is_free(self, store: Both) -> None:
        key = await self.completed(store)
        await store.delete(key, tombstone_of(key))
        decision = await store.claim(store.record(), FP, owner="o2", expired=True, heartbeat=False)
        assert isinstance(decision, Claimed)

    async def test_a_tombstone_is_small_next_to_its_record(self, store: Both) -> None:
        # MEMORY USAGE on a real server (fakeredis has none): a key name, 29 bytes of value
        # and the key's expiry; 136 bytes on Redis 7.0 for the 54-character names idemkey
        # makes, the record of a 25-byte JSON answer 216 (docs/design.md, issue 24).
        if isinstance(store.client, fakeredis.FakeRedis | fakeredis.FakeAsyncRedis):
            pytest.skip("MEMORY USAGE needs a real server")
        key = await self.completed(store)
        stone = await _resolve(store.client.memory_usage(tombstone_of(key)))
        record = await _resolve(store.client.memory_usage(key))
        assert stone <= 160
        assert stone < record


class TestRedisStoreTombstones(SyncStore, TombstoneBehaviour):
    pass


class TestAsyncRedisStoreTombstones(AsyncStore, TombstoneBehaviour):
    pass


class TestPlainPathStoreTombstones(PlainSyncStore, TombstoneBehaviour):
    """The same contract on the plain path (execute_command), see test_lean.py."""


class TestPlainPathAsyncStoreTombstones(PlainAsyncStore, TombstoneBehaviour):
    pass


# The same contract through valkey-glide (AsyncRedisStore's facade, idemkey/store/_glide.py).
class TestGlideAsyncStoreTombstones(GlideAsyncStore, TombstoneBehaviour):
    pass


class TestBatchedAsyncStoreTombstones(BatchedAsyncStore, TombstoneBehaviour):
    pass
