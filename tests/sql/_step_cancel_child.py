"""A user's async job under ``asyncio.run``, Ctrl-C arriving as a fenced step's result is on
its way into the step's committed row, on a database slower than the guard's CLOSE_DRAIN.

``python -m tests.sql._step_cancel_child REDIS_URL PREFIX DB_URL DELAY`` (DB_URL: an asyncio
driver's URL, ``charges`` and ``idemkey_effects`` already made)

The first write of the result into the row sends the process SIGINT (``asyncio.run`` turns it
into a cancel of its main task) and waits there, so the cancel comes before the UPDATE went
out; the write sent again after it takes DELAY seconds (a lock held by another writer), then
runs. Prints ``interrupted`` when KeyboardInterrupt came out of ``asyncio.run``, and ``ran N``:
how many times the step's function ran. What landed is for the test to read: the process has
ended, and nothing more will.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import redis.asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from idemkey import AsyncRedisStore, Policy, aguard
from idemkey._core import Record
from idemkey.contrib.sqlalchemy import AsyncEffects, afenced

CHARGES = sa.table("charges", sa.column("key"), sa.column("fence"), sa.column("worker"))
RESULT = {"charge_id": "ch_1"}


class SlowRecordEffects(AsyncEffects):
    """Ctrl-C as the first write of a result into its row is about to be sent; every write of
    it takes ``delay`` seconds."""

    def __init__(self, engine: AsyncEngine, delay: float) -> None:
        super().__init__(engine)
        self.delay = delay
        self.calls = 0

    async def record(self, record: Record, step: str | None, fence: int, result: bytes) -> bool:
        self.calls += 1
        if self.calls == 1:
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(30)  # the cancel comes here: nothing was written yet
        await asyncio.sleep(self.delay)  # the slow database
        return await super().record(record, step, fence, result)


async def job(redis_url: str, prefix: str, db_url: str, delay: float, ran: list[str]) -> None:
    engine = create_async_engine(db_url)
    client = redis.asyncio.Redis.from_url(redis_url)
    store = AsyncRedisStore(
        client, Policy(prefix=prefix, lease=30), effects=SlowRecordEffects(engine, delay)
    )

    async def charge(call: Any) -> dict[str, str]:
        ran.append("charge")
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(sa.insert(CHARGES).values(key="job:charge", fence=call.fence))
            await afenced(session, call, step="charge")
        return RESULT

    async with aguard(store, "job", payload=b"p") as call:
        got = await call.step("charge", charge, call)
        call.save(got)


def main() -> None:
    redis_url, prefix, db_url, delay = sys.argv[1:5]
    ran: list[str] = []
    try:
        asyncio.run(job(redis_url, prefix, db_url, float(delay), ran))
    except KeyboardInterrupt:
        print("interrupted")
    print(f"ran {len(ran)}", flush=True)


if __name__ == "__main__":
    main()
