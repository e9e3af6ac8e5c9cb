"""guard() / aguard() with Policy(compress=...): a large result is stored compressed and
replays as it was saved, and a change of policy never stops a stored result from replaying.

Both stores, on the real session server and on fakeredis (``tests/store/_both.py``).
"""

from __future__ import annotations

from typing import Any

import pytest

from idemkey import Policy, RecordFormatError
from idemkey._codec import COMPRESSED_FORMAT, FORMAT_VERSION
from tests.store._both import AsyncStore, Both, SyncStore

#: A result like a page of orders: a few KiB of repetitive JSON-like data.
ORDERS = [
    {"id": f"ord_{i:06d}", "amount": 1000 + i, "currency": "eur", "status": "paid"}
    for i in range(100)
]


def compressing(store: Both, **changes: Any) -> Policy:
    return store.store.policy.replace(compress=True, **changes)


class CompressBehaviour:
    async def test_a_large_result_is_stored_compressed_and_replays_equal(self, store: Both) -> None:
        async with store.guard("orders", policy=compressing(store)) as call:
            call.save(ORDERS)
        stored = (await store.hash(store.guard_record("orders")))[b"resp"]
        assert stored[0] == COMPRESSED_FORMAT
        async with store.guard("orders", policy=compressing(store)) as again:
            assert again.replayed
            assert again.result == ORDERS

    async def test_a_small_result_stays_uncompressed(self, store: Both) -> None:
        async with store.guard("small", policy=compressing(store)) as call:
            call.save({"id": "ord_1"})
        stored = (await store.hash(store.guard_record("small")))[b"resp"]
        assert stored[0] == FORMAT_VERSION

    @pytest.mark.parametrize(("write", "read"), [(True, None), (None, True), (0, False)])
    async def test_a_policy_change_during_retention_still_replays(
        self, store: Both, write: object, read: object
    ) -> None:
        async with store.guard("orders", policy=policy(store, write)) as call:
            call.save(ORDERS)
        async with store.guard("orders", policy=policy(store, read)) as again:
            assert again.replayed
            assert again.result == ORDERS

    async def test_a_damaged_compressed_result_is_a_record_format_error(self, store: Both) -> None:
        async with store.guard("orders", policy=compressing(store)) as call:
            call.save(ORDERS)
        record = store.guard_record("orders")
        stored = (await store.hash(record))[b"resp"]
        await _resolve(store.client.hset(record.key, "resp", stored[:-8]))
        with pytest.raises(RecordFormatError):
            async with store.guard("orders", policy=compressing(store)):
                pytest.fail("a damaged record must not run the block again")


def policy(store: Both, compress: object) -> Policy:
    return store.store.policy.replace(compress=compress)


async def _resolve(value: Any) -> Any:
    return await value if hasattr(value, "__await__") else value


class TestGuardCompress(SyncStore, CompressBehaviour):
    pass


class TestAsyncGuardCompress(AsyncStore, CompressBehaviour):
    pass
