"""A caller cancelled while aguard writes the outcome: the write still happens.

Found by the soak (tests/soak): a task cancelled while ``complete`` was on its way left the
record in progress although the work was done; after the lease a retry ran it again. The
guard now finishes a cut-off write in a task of its own (complete and release are safe to
send twice).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio

from idemkey import AsyncRedisStore, Policy, RequestInFlightError, aguard
from idemkey._core import Record, record_for, record_state
from idemkey.guard import GUARD_METHOD
from tests._lease import lease_holder, lease_left
from tests._servers import async_wait_until

pytestmark = pytest.mark.redis


class StallingStore(AsyncRedisStore):
    """The first complete/release waits (cancellably) before anything is sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stalled = asyncio.Event()
        self.calls = 0

    async def _stall(self) -> None:
        self.calls += 1
        if self.calls == 1:
            self.stalled.set()
            await asyncio.sleep(30)  # the caller is cancelled here: nothing reached Redis

    async def complete(self, *args: Any, **kwargs: Any) -> bool:
        await self._stall()
        return await super().complete(*args, **kwargs)

    async def release(self, *args: Any, **kwargs: Any) -> bool:
        await self._stall()
        return await super().release(*args, **kwargs)


@pytest.mark.parametrize("saved", [True, False], ids=["complete", "release"])
async def test_a_write_cut_off_by_a_cancellation_is_finished(
    real_async_client: redis.asyncio.Redis, prefix: str, saved: bool
) -> None:
    store = StallingStore(real_async_client, Policy(prefix=prefix, lease=60))
    record = record_for(prefix, "", GUARD_METHOD, "", "job")

    async def work() -> None:
        async with aguard(store, "job", payload=b"p") as call:
            if saved:
                call.save("done once")

    task = asyncio.ensure_future(work())
    await asyncio.wait_for(store.stalled.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Without the background write the record would stay in progress for the whole lease.
    if saved:
        await async_wait_until(
            lambda: _state_is(real_async_client, record.key, b"complete"), 10, "the completion"
        )
        async with aguard(store, "job", payload=b"p") as call:
            assert call.replayed
            assert call.result == "done once"
    else:
        await async_wait_until(lambda: _released(real_async_client, record), 10, "the release")
        async with aguard(store, "job", payload=b"p") as call:
            assert not call.replayed  # released: the retry runs at once, not after 60 s
            call.save("second try")
    await store.aclose()


async def _state_is(client: redis.asyncio.Redis, key: str, state: bytes) -> bool:
    return record_state(await client.hgetall(key)) == state.decode()


async def _released(client: redis.asyncio.Redis, record: Record) -> bool:
    """No live lease, and none left in the record: freed, not lapsed (the lease is 60 s)."""
    return await lease_left(client, record) == -2 and not await client.hexists(record.key, "lease")


class ClaimThenStallStore(AsyncRedisStore):
    """The claim reaches Redis, then its caller waits (cancellably) for the reply."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.applied = asyncio.Event()

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        decision = await super().claim(*args, **kwargs)
        self.applied.set()
        await asyncio.sleep(30)  # the reply is "lost": the caller is cancelled here
        return decision


async def test_a_claim_cut_off_by_a_cancellation_is_released(
    real_async_client: redis.asyncio.Redis, prefix: str
) -> None:
    stalling = ClaimThenStallStore(real_async_client, Policy(prefix=prefix, lease=60))
    record = record_for(prefix, "", GUARD_METHOD, "", "job")

    async def work() -> None:
        async with aguard(stalling, "job", payload=b"p"):
            pytest.fail("the block ran although its claim's reply never came")

    task = asyncio.ensure_future(work())
    await asyncio.wait_for(stalling.applied.wait(), 10)
    assert await lease_holder(real_async_client, record) is not None  # Redis holds the claim
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Without the release every retry would get RequestInFlightError for the 60 s lease.
    await async_wait_until(lambda: _released(real_async_client, record), 10, "the release")
    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix, lease=60))
    async with aguard(store, "job", payload=b"p") as call:
        assert not call.replayed
        call.save("ran once")
    await stalling.aclose()
    await store.aclose()


async def test_a_block_its_caller_cancels_keeps_the_key_until_the_lease_lapses(
    real_async_client: redis.asyncio.Redis, prefix: str
) -> None:
    # The caller cancels the task after the block's side effect, before it saved a result. A
    # release would let the retry charge again at once; the key is kept instead, no longer
    # renewed, and the retry that comes after the lease is a takeover (docs/guarantees.md).
    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix, lease=1.5, wait=0))
    charged = asyncio.Event()
    charges: list[str] = []

    async def work() -> None:
        async with aguard(store, "order-7", payload=b"p") as call:
            charges.append("charged")
            charged.set()
            await asyncio.sleep(30)  # cancelled here, before the result is saved
            call.save("ch_1")

    task = asyncio.ensure_future(work())
    await asyncio.wait_for(charged.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(RequestInFlightError):  # not released: the retry does not run at once
        async with aguard(store, "order-7", payload=b"p"):
            charges.append("charged again")
    (entry,) = await async_wait_until(store.uncertain, 10, "the uncertain entry")
    assert entry.kind == "cancelled"
    first_fence = entry.fence
    assert first_fence is not None
    # Not renewed any more: the lease lapses, and the retry after it is told it takes over.
    record = record_for(prefix, "", GUARD_METHOD, "", "order-7")
    await async_wait_until(lambda: _lapsed(real_async_client, record), 10, "the lease to lapse")
    async with aguard(store, "order-7", payload=b"p") as call:
        assert call.takeover
        assert (call.fence or 0) > first_fence  # the cancelled run's fence is passed
        call.save("checked, not charged again")
    assert charges == ["charged"]
    await store.aclose()


async def _lapsed(client: redis.asyncio.Redis, record: Record) -> bool:
    return await lease_left(client, record) <= 0
