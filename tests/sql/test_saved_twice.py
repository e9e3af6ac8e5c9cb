"""A result saved inside the fenced transaction, then saved again after its commit: the last
value is the answer, in Redis and in the database alike (docs/effects.md: "Redis never holds an
answer the database lacks").

Before, the commit wrote the first value into the row and the guard completed Redis with the
second: retries got the second value while Redis kept the record, the first once it forgot.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from idemkey import AsyncRedisStore, Policy, RedisStore, aguard, guard
from idemkey._core import record_for
from idemkey.contrib.sqlalchemy import AsyncEffects, Effects, afenced, fenced
from idemkey.guard import GUARD_METHOD
from tests.sql.conftest import CHARGES, async_url

pytestmark = pytest.mark.redis

PENDING = {"v": 1, "status": "pending"}
CHARGED = {"v": 2, "status": "charged"}


def test_a_value_saved_again_after_the_commit_is_the_answer_after_redis_forgot(
    real_client: redis.Redis, prefix: str, engine: sa.Engine
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix), effects=Effects(engine))
    runs: list[int] = []

    def job(final: dict[str, Any] | None = CHARGED) -> tuple[bool, Any]:
        with guard(store, "twice") as call:
            if call.replayed:
                return True, call.result
            runs.append(1)
            with Session(engine) as session, session.begin():
                session.execute(sa.insert(CHARGES).values(key="twice", fence=call.fence))
                fenced(session, call)
                call.save(PENDING)
            if final is not None:
                call.save(final)  # the final answer, known after the commit
            return False, call.result

    try:
        assert job() == (False, CHARGED)
        assert job() == (True, CHARGED)  # from Redis
        real_client.delete(record_for(prefix, "", GUARD_METHOD, "", "twice").record_key)
        assert job() == (True, CHARGED)  # from the row: the same answer
        assert runs == [1]
    finally:
        store.close()


async def test_aguard_a_value_saved_again_after_the_commit_is_the_answer_after_redis_forgot(
    real_async_client: redis.asyncio.Redis, prefix: str, db_url: str
) -> None:
    engine = create_async_engine(async_url(db_url))
    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix), effects=AsyncEffects(engine))
    runs: list[int] = []

    async def job() -> tuple[bool, Any]:
        async with aguard(store, "twice") as call:
            if call.replayed:
                return True, call.result
            runs.append(1)
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(sa.insert(CHARGES).values(key="twice", fence=call.fence))
                await afenced(session, call)
                call.save(PENDING)
            call.save(CHARGED)
            return False, call.result

    try:
        assert await job() == (False, CHARGED)
        assert await job() == (True, CHARGED)
        await real_async_client.delete(record_for(prefix, "", GUARD_METHOD, "", "twice").record_key)
        assert await job() == (True, CHARGED)
        assert runs == [1]
    finally:
        await store.aclose()
        await engine.dispose()


class CountingEffects(Effects):
    """Effects that count the writes of a result into a committed row."""

    writes = 0

    def record(self, record: Any, step: str | None, fence: int, result: bytes) -> bool:
        self.writes += 1
        return super().record(record, step, fence, result)


@pytest.mark.parametrize("again", [False, True], ids=["saved once", "the same value again"])
def test_a_value_the_commit_wrote_is_not_written_again(
    real_client: redis.Redis, prefix: str, engine: sa.Engine, again: bool
) -> None:
    effects = CountingEffects(engine)
    store = RedisStore(real_client, Policy(prefix=prefix), effects=effects)
    try:
        with guard(store, "once") as call:
            with Session(engine) as session, session.begin():
                fenced(session, call)
                call.save(PENDING)
            if again:
                call.save(dict(PENDING))  # equal: the row holds it already
        assert effects.writes == 0  # no UPDATE beyond the commit's own
    finally:
        store.close()
