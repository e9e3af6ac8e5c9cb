"""A caller cancelled while aguard writes the outcome: the write still happens.

Found by the soak (tests/soak): a task cancelled while ``complete`` was on its way left the
record in progress although the work was done; after the lease a retry ran it again. The
guard now finishes a cut-off write in a task of its own (complete and release are safe to
send twice).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from idemkey import AsyncRedisStore, Policy, RedisStore, RequestInFlightError, aguard, guard
from idemkey._core import Record, record_for, record_state
from idemkey.guard import GUARD_METHOD
from idemkey.http._scope import NO_CREDENTIALS
from idemkey.store.status import RecordStatus
from tests._lease import lease_holder, lease_left
from tests._servers import async_wait_until
from tests.faults._sigint_worker import KEY

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


# ---- Ctrl-C under asyncio.run ---------------------------------------------------------------
# asyncio.run answers the first SIGINT by cancelling its main task, and once that task ends it
# cancels every task still pending: a write sent again in a task of its own was cancelled there
# before it went out. The worker (tests/faults/_sigint_worker.py) raises SIGINT itself at one
# point of its run; its store's lease is 60 s, so a record it left claimed is still held here.

ROOT = Path(__file__).resolve().parents[2]
# Before 3.11, asyncio.run had no SIGINT handler: KeyboardInterrupt was raised where the code
# ran, as in a thread, and nothing is cancelled.
needs_runner = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="asyncio.run cancels its main task on Ctrl-C from 3.11"
)


def ctrl_c_in(scenario: str, client: redis.Redis, redis_url: str, prefix: str) -> RecordStatus:
    """Run the worker's ``scenario`` to its end; the status of the record it was writing."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.faults._sigint_worker", redis_url, prefix, scenario],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, "interrupted\n"), done.stderr[-3000:]
    store = RedisStore(client, Policy(prefix=prefix))
    if scenario.startswith("asgi"):
        status = store.record(KEY, scope=NO_CREDENTIALS, method="POST", route="/charges")
    else:
        status = store.record(KEY)
    store.close()
    assert status is not None
    return status


@needs_runner
@pytest.mark.parametrize("scenario", ["complete", "asgi"])
def test_ctrl_c_as_the_outcome_is_written_still_completes_the_record(
    real_client: redis.Redis, redis_url: str, prefix: str, scenario: str
) -> None:
    # Before: both records stayed in progress; after the lease a retry ran the work again.
    assert ctrl_c_in(scenario, real_client, redis_url, prefix).state == "complete"
    if scenario == "complete":
        store = RedisStore(real_client, Policy(prefix=prefix))
        with guard(store, KEY, payload=1) as call:
            assert call.replayed
            assert call.result == "charge-1"
        store.close()


@needs_runner
@pytest.mark.parametrize("scenario", ["claim", "asgi-claim"])
def test_ctrl_c_as_the_claim_is_sent_releases_it(
    real_client: redis.Redis, redis_url: str, prefix: str, scenario: str
) -> None:
    # Before: the claim Redis applied held the key for the whole lease (60 s).
    assert ctrl_c_in(scenario, real_client, redis_url, prefix).state == "released"


@needs_runner
@pytest.mark.parametrize("scenario", ["claim-2", "asgi-claim-2"])
def test_two_ctrl_c_as_the_claim_is_sent_release_it(
    real_client: redis.Redis, redis_url: str, prefix: str, scenario: str
) -> None:
    # The second Ctrl-C raises KeyboardInterrupt where the claim's reply was awaited, the
    # first one's cancel still pending: it landed on the wait for the release, and asyncio.run
    # then cancelled the release before it went out. Before: held for the whole lease (60 s).
    assert ctrl_c_in(scenario, real_client, redis_url, prefix).state == "released"


@needs_runner
def test_ctrl_c_in_an_aguard_block_writes_its_cancelled_entry(
    real_client: redis.Redis, redis_url: str, prefix: str
) -> None:
    status = ctrl_c_in("block", real_client, redis_url, prefix)
    assert status.state == "in_progress"  # kept until its lease lapses, as documented
    store = RedisStore(real_client, Policy(prefix=prefix))
    # Before: the entry's task was cancelled by asyncio.run's teardown, the stream empty.
    assert [(entry.kind, entry.digest) for entry in store.uncertain()] == [
        ("cancelled", status.digest)
    ]
    store.close()
