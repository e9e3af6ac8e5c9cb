"""A guard block interrupted part way (Ctrl-C, an exit) keeps its key, as a cancelled one does.

What a user relies on (docs/guard.md): a sync ``guard()`` block cut off by ``KeyboardInterrupt``
or ``SystemExit`` before it saved a result did work nobody can tell the extent of, so the key is
not released for an immediate retry to run it again: the claim is kept, no longer renewed,
until its lease lapses; a ``cancelled`` uncertain entry names it and its finished steps; the
retry after the lease takes it over and resumes. ``aguard`` treats the same interruptions as it
treats a cancel. A result saved before the interruption still completes the record, and any
other exception still releases the key.
"""

from __future__ import annotations

import pytest
import redis
import redis.asyncio

from idemkey import (
    AsyncRedisStore,
    Policy,
    RedisStore,
    RequestInFlightError,
    aguard,
    guard,
)
from idemkey._core import Record, record_for
from idemkey.guard import GUARD_METHOD
from tests._lease import lease_left
from tests._servers import async_wait_until, wait_until

pytestmark = pytest.mark.redis

INTERRUPTIONS = [KeyboardInterrupt, SystemExit]


def guard_record(prefix: str, key: str) -> Record:
    return record_for(prefix, "", GUARD_METHOD, "", key)


@pytest.mark.parametrize("interruption", INTERRUPTIONS, ids=lambda kind: kind.__name__)
def test_a_sync_block_interrupted_mid_work_keeps_its_key_until_the_lease_lapses(
    real_client: redis.Redis, prefix: str, interruption: type[BaseException]
) -> None:
    # Before: the key was released at once, the retry ran the half-done step again, and no
    # entry told an operator.
    store = RedisStore(real_client, Policy(prefix=prefix, lease=5, wait=0))
    ran: list[str] = []
    try:
        with pytest.raises(interruption), guard(store, "job", payload=b"p") as call:  # noqa: PT012
            call.step("reserve", ran.append, "reserve")
            ran.append("charge, half done")
            raise interruption  # Ctrl-C while the charge is on the wire
        with pytest.raises(RequestInFlightError), guard(store, "job", payload=b"p"):
            ran.append("ran again at once")
        (entry,) = wait_until(store.uncertain, 10, "the cancelled entry")
        assert (entry.kind, entry.fence, entry.steps) == ("cancelled", call.fence, ("reserve",))
        # Not renewed any more: it lapses, and the retry after it takes over and resumes.
        record = guard_record(prefix, "job")
        wait_until(lambda: lease_left(real_client, record) <= 0, 20, "the lease to lapse")
        with guard(store, "job", payload=b"p") as retry:
            assert retry.takeover
            assert retry.resumed_steps == ("reserve",)
            retry.step("reserve", ran.append, "reserve again")  # finished: not run
            retry.save("done")
    finally:
        store.close()
    assert ran == ["reserve", "charge, half done"]


def test_a_sync_block_interrupted_after_saving_completes(
    real_client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix, lease=30))
    try:
        with pytest.raises(KeyboardInterrupt), guard(store, "job") as call:  # noqa: PT012
            call.save("done")
            raise KeyboardInterrupt
        with guard(store, "job") as again:
            assert again.replayed
            assert again.result == "done"
        assert store.uncertain() == []
    finally:
        store.close()


def test_a_sync_block_that_raises_an_exception_still_releases(
    real_client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix, lease=30))
    try:
        with pytest.raises(ValueError, match="declined"), guard(store, "job"):
            raise ValueError("declined")
        with guard(store, "job") as again:  # at once, not after the lease
            assert not again.replayed
            again.save("ran twice, as a failure allows")
    finally:
        store.close()


@pytest.mark.parametrize("interruption", INTERRUPTIONS, ids=lambda kind: kind.__name__)
async def test_an_async_block_interrupted_keeps_its_key_as_a_cancelled_one(
    real_async_client: redis.asyncio.Redis, prefix: str, interruption: type[BaseException]
) -> None:
    # KeyboardInterrupt reaches a coroutine where asyncio.run does not turn it into a cancel
    # (a second Ctrl-C, a loop run by other means); one rule for both guards.
    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix, lease=30, wait=0))
    try:
        with pytest.raises(interruption):  # noqa: PT012
            async with aguard(store, "job", payload=b"p") as call:
                await call.step("reserve", lambda: "held")
                raise interruption
        with pytest.raises(RequestInFlightError):
            async with aguard(store, "job", payload=b"p"):
                pytest.fail("the interrupted block's key was released")
        (entry,) = await async_wait_until(store.uncertain, 10, "the cancelled entry")
        assert (entry.kind, entry.steps) == ("cancelled", ("reserve",))
    finally:
        await store.aclose()
