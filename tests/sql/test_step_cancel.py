"""A fenced step whose function returned is finished, even when a cancel cuts off the writes of
its result (docs/steps.md): under aguard the result goes into the step's committed row, then
into Redis as its checkpoint, and a cancel that comes during either does not stop them.

Before, only the checkpoint was shielded: a cancel while the result was being written into the
row left it "committed, no result", no checkpoint was sent, and the job could never finish (the
block that caught the cancel, and every retry, got EffectCommittedError for a step whose
result the process knew); the ``cancelled`` entry listed no step.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from idemkey import AsyncRedisStore, Policy, aguard
from idemkey._codec import encode_value
from idemkey._core import Record, record_for
from idemkey.contrib.sqlalchemy import AsyncEffects, afenced
from idemkey.guard import GUARD_METHOD
from tests._lease import lapse
from tests._servers import async_wait_until
from tests.sql.conftest import CHARGES, async_url

pytestmark = pytest.mark.redis

RESULT = {"charge_id": "ch_1"}


class SlowRecordEffects(AsyncEffects):
    """The first write of a result into a committed row waits (cancellably) before it is sent:
    the database is slow (a lock held by another writer) as the caller's cancel comes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recording = asyncio.Event()
        self.calls = 0

    async def record(self, record: Record, step: str | None, fence: int, result: bytes) -> bool:
        self.calls += 1
        if self.calls == 1:
            self.recording.set()
            await asyncio.sleep(30)  # the caller is cancelled here: nothing was written yet
        return await super().record(record, step, fence, result)


async def test_a_cancel_while_a_steps_result_is_recorded_does_not_undo_the_step(
    real_async_client: redis.asyncio.Redis, prefix: str, db_url: str
) -> None:
    engine = create_async_engine(async_url(db_url))
    effects = SlowRecordEffects(engine)
    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix, lease=30), effects=effects)
    record = record_for(prefix, "", GUARD_METHOD, "", "job")
    ran: list[str] = []
    again: list[Any] = []

    async def charge(call: Any) -> dict[str, str]:
        ran.append("charge")
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(sa.insert(CHARGES).values(key="job:charge", fence=call.fence))
            await afenced(session, call, step="charge")
        return RESULT

    async def job() -> Any:
        async with aguard(store, "job", payload=b"p") as call:
            if call.replayed:
                return call.result
            try:
                got = await call.step("charge", charge, call)
            except asyncio.CancelledError:
                # As docs/steps.md says: the finished step's outcome, without running it.
                again.append(await call.step("charge", charge, call))
                raise
            call.save({"charge": got["charge_id"]})
            return call.result

    try:
        task = asyncio.ensure_future(job())
        await asyncio.wait_for(effects.recording.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert again == [RESULT]
        (entry,) = await async_wait_until(store.uncertain, 10, "the cancelled entry")
        assert (entry.kind, entry.steps) == ("cancelled", ("charge",))
        # The cut-off writes go on: the row gets the result, then Redis its checkpoint.
        encoded = encode_value(RESULT)

        async def written() -> bool:
            found = await effects.find(record, "charge")
            checkpoint = await real_async_client.hget(record.record_key, "s:charge")
            return found == encoded and checkpoint == encoded

        await async_wait_until(written, 10, "the step's row and checkpoint")
        # The retry after the lease resumes the step from Redis...
        assert await lapse(real_async_client, record) == 1
        async with aguard(store, "job", payload=b"p") as call:
            assert call.takeover
            assert call.resumed_steps == ("charge",)
            assert await call.step("charge", charge, call) == RESULT  # not run again
        # ... and once Redis has forgotten the key, from the step's row.
        await real_async_client.delete(record.record_key)
        assert await job() == {"charge": "ch_1"}
        assert ran == ["charge"]
        async with engine.connect() as conn:
            query = sa.select(sa.func.count()).select_from(CHARGES)
            assert (await conn.execute(query)).scalar_one() == 1  # the effect, once
    finally:
        await store.aclose()
        await engine.dispose()
