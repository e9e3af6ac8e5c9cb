"""The record fields a script adds to (HINCRBY): cancel.lua's ``fence``, checkpoint.lua's
``ns`` and attempt.lua's ``a:<name>``. Stored bytes are input: a field that holds no integer
Redis can add 1 to is refused before the script writes anything, so the refusal (a
``StoreError`` naming the field) leaves the record byte for byte as it was; before, cancel.lua
had already removed the live claim's owner and lease when its HINCRBY failed, and its owner's
completion was refused.
"""

from __future__ import annotations

import pytest

from idemkey.errors import StoreError
from idemkey.records import Claimed, Record
from idemkey.store import Cancelled
from tests.store._both import (
    AsyncStore,
    Both,
    GlideAsyncStore,
    PlainAsyncStore,
    PlainSyncStore,
    SyncStore,
    _resolve,
)

FP = b"0123456789abcdef"

#: Values HINCRBY refuses ("hash value is not an integer", or the 64-bit maximum that one more
#: would overflow), and what Redis parses as an integer, so the script must too.
NO_COUNTER = {
    "text": b"not-a-number",
    "empty": b"",
    "a fraction": b"1.5",
    "a space before": b" 7",
    "a plus sign": b"+7",
    "a leading zero": b"007",
    "minus zero": b"-0",
    "hex": b"0x1f",
    "an exponent": b"1e3",
    "past 64 bits": b"9223372036854775808",
    "the 64-bit maximum": b"9223372036854775807",
    "twenty digits": b"10000000000000000000",
    "not UTF-8": b"\xff\xfe",
}
#: Fences the script adds to (its reply is a Lua number: exact up to 2**53, as claim.lua says).
COUNTERS = {
    "zero": (b"0", 1),
    "negative": (b"-5", -4),
    "2**53 - 1": (b"9007199254740991", 2**53),
}


class CounterBehaviour:
    async def claimed(self, store: Both) -> tuple[Record, Claimed]:
        record = store.record()
        claim = await store.claim(record, FP, heartbeat=False)
        assert isinstance(claim, Claimed)
        return record, claim

    async def hset(self, store: Both, record: Record, field: str, value: bytes) -> None:
        await _resolve(store.client.hset(record.key, field, value))

    @pytest.mark.parametrize("value", NO_COUNTER.values(), ids=NO_COUNTER.keys())
    async def test_a_cancel_of_a_fence_that_is_no_integer_changes_nothing(
        self, store: Both, value: bytes
    ) -> None:
        record, claim = await self.claimed(store)
        await self.hset(store, record, "fence", value)
        before = await store.snapshot(record)
        with pytest.raises(StoreError) as refused:
            await _resolve(store.store.cancel(record))
        assert await store.snapshot(record) == before  # the live claim is still its owner's
        assert "fence is not an integer" in str(refused.value)
        assert await store.complete(record, claim.owner, b"\x01\xc0")

    async def test_a_released_record_whose_fence_is_no_integer_keeps_its_steps(
        self, store: Both
    ) -> None:
        record, claim = await self.claimed(store)
        assert await store.checkpoint(record, claim.owner, "s:one", b"\x01\x01") == b"\x01\x01"
        assert await store.release(record, claim.owner)
        await self.hset(store, record, "fence", b"not-a-number")
        before = await store.snapshot(record)
        for abandon in (False, True):
            with pytest.raises(StoreError) as refused:
                await _resolve(store.store.cancel(record, abandon=abandon))
            assert await store.snapshot(record) == before
            assert "fence is not an integer" in str(refused.value)

    @pytest.mark.parametrize(("value", "raised"), COUNTERS.values(), ids=COUNTERS.keys())
    async def test_a_cancel_raises_any_fence_redis_adds_to(
        self, store: Both, value: bytes, raised: int
    ) -> None:
        record, _ = await self.claimed(store)
        await self.hset(store, record, "fence", value)
        assert await _resolve(store.store.cancel(record)) == Cancelled("in_progress", raised)

    async def test_a_checkpoint_over_a_step_count_that_is_no_integer_writes_nothing(
        self, store: Both
    ) -> None:
        store.store.completion_retry = 0  # the refusal is not a passing failure to retry
        record, claim = await self.claimed(store)
        await self.hset(store, record, "ns", b"not-a-number")
        before = await store.snapshot(record)
        with pytest.raises(StoreError) as refused:
            await store.checkpoint(record, claim.owner, "s:one", b"\x01\x01")
        assert await store.snapshot(record) == before  # no step stored beside a bad count
        assert "ns is not an integer" in str(refused.value)

    async def test_an_attempt_over_a_count_that_is_no_integer_writes_nothing(
        self, store: Both
    ) -> None:
        record, claim = await self.claimed(store)
        await self.hset(store, record, "a:charge", b"not-a-number")
        before = await store.snapshot(record)
        with pytest.raises(StoreError) as refused:
            await _resolve(store.store.attempt(record, claim.owner, "a:charge"))
        assert await store.snapshot(record) == before  # "na" not written either
        assert "a:charge is not an integer" in str(refused.value)
        assert b"na" not in before[0]
        await self.hset(store, record, "a:charge", b"2")
        assert await _resolve(store.store.attempt(record, claim.owner, "a:charge")) == 3


class TestRedisStoreCounters(SyncStore, CounterBehaviour):
    pass


class TestAsyncRedisStoreCounters(AsyncStore, CounterBehaviour):
    pass


class TestPlainPathStoreCounters(PlainSyncStore, CounterBehaviour):
    pass


class TestPlainPathAsyncStoreCounters(PlainAsyncStore, CounterBehaviour):
    pass


class TestGlideAsyncStoreCounters(GlideAsyncStore, CounterBehaviour):
    pass
