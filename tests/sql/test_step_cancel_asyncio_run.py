"""Ctrl-C in a job run with ``asyncio.run`` while a finished step's result is written into its
fenced row does not strand the step, however slow the database (docs/steps.md).

``asyncio.run`` delivers SIGINT to the job as a cancel of its main task, and once that task has
ended it cancels every task left. Before, the step's writes (the result into its row "committed,
no result", then Redis' checkpoint) went on in a task of their own that nobody awaited: the
guard's interrupted exit waited at most CLOSE_DRAIN (1 s) for leftover writes, so on a database
slower than that ``asyncio.run`` cancelled them. The row kept "committed, no result", Redis got
no checkpoint, and every retry raised EffectCommittedError for a result the process knew. Now
the step waits for its writes as the guard's completion does (``finish``), then the cancel goes
on. The job runs in a child process (tests/sql/_step_cancel_child.py) that sends itself SIGINT.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from idemkey import AsyncRedisStore, Policy, aguard
from idemkey._codec import encode_value
from idemkey._core import record_for
from idemkey.contrib.sqlalchemy import AsyncEffects
from idemkey.guard import GUARD_METHOD
from idemkey.store._async_store import CLOSE_DRAIN
from tests._lease import lapse
from tests.sql.conftest import CHARGES, async_url

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
RESULT = {"charge_id": "ch_1"}
#: How long the database takes to write the result into the row: longer than the guard waits
#: for leftover writes on an interrupted exit.
DELAY = CLOSE_DRAIN + 0.2


async def test_ctrl_c_under_asyncio_run_while_a_slow_row_write_is_pending(
    redis_url: str, real_async_client: redis.asyncio.Redis, prefix: str, db_url: str
) -> None:
    args = (redis_url, prefix, async_url(db_url), str(DELAY))
    child = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "tests.sql._step_cancel_child", *args),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(child.communicate(), 20)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    assert out.decode().split("\n")[:2] == ["interrupted", "ran 1"], err.decode()
    # The process has ended: what it wrote is all there will be.
    record = record_for(prefix, "", GUARD_METHOD, "", "job")
    encoded = encode_value(RESULT)
    assert await real_async_client.hget(record.record_key, "s:charge") == encoded
    engine = create_async_engine(async_url(db_url))
    store = AsyncRedisStore(
        real_async_client, Policy(prefix=prefix, lease=30), effects=AsyncEffects(engine)
    )
    ran: list[str] = []

    async def charge() -> Any:
        ran.append("charge")
        return {"charge_id": "again"}

    try:
        assert await store.effects.find(record, "charge") == encoded  # type: ignore[union-attr]
        # A retry after the lease (the interrupted guard kept the key) resumes from Redis...
        assert await lapse(real_async_client, record) == 1
        async with aguard(store, "job", payload=b"p") as call:
            assert call.takeover
            assert await call.step("charge", charge) == RESULT
        # ... and one after Redis forgot the key, from the step's row.
        await real_async_client.delete(record.record_key)
        async with aguard(store, "job", payload=b"p") as call:
            assert await call.step("charge", charge) == RESULT
            call.save("done")
        assert ran == []
        async with engine.connect() as conn:
            count = sa.select(sa.func.count()).select_from(CHARGES)
            assert (await conn.execute(count)).scalar_one() == 1  # the effect, once
    finally:
        await store.aclose()
        await engine.dispose()
