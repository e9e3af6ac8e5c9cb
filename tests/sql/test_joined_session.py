"""A Session joined to an outer transaction (SQLAlchemy's "join a Session into an external
transaction" recipe): its ``commit()`` sends no COMMIT, so the fence ends with the outer one.

The audit's defect: ``conn = engine.connect(); conn.begin(); Session(bind=conn)``, fenced and
saved, ``session.commit()``: the guard completed the record, then the outer transaction rolled
back, and every retry replayed a charge the database never held. Now the fence is tied to the
Connection's own commit and rollback: an outer rollback releases the key (the retry runs, one
charge in the end), an outer commit completes it (the retry replays). All three join modes, on
real SQLite files and PostgreSQL, sync and asyncio, with a real Redis.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from idemkey import AsyncRedisStore, NoResultError, Policy, RedisStore, aguard, guard
from idemkey.contrib.sqlalchemy import AsyncEffects, Effects, afenced, fenced
from tests.sql.conftest import CHARGES, async_url
from tests.sql.test_savepoints import savepoint_ready

pytestmark = pytest.mark.redis

MODES = ["conditional_savepoint", "rollback_only", "create_savepoint"]


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    engine = savepoint_ready(sa.create_engine(db_url))
    yield engine
    engine.dispose()


def charges(engine: sa.Engine, key: str) -> list[Any]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(CHARGES.c.worker).where(CHARGES.c.key == key))
        return sorted(row[0] for row in rows)


def run(store: RedisStore, engine: sa.Engine, key: str, mode: str, outer: str, n: int) -> Any:
    with guard(store, key, payload=key) as call:
        if call.replayed:
            return ("replayed", call.result)
        with engine.connect() as conn:
            trans = conn.begin()
            session = Session(bind=conn, join_transaction_mode=mode)  # type: ignore[arg-type]
            session.execute(sa.insert(CHARGES).values(key=key, fence=call.fence, worker=n))
            fenced(session, call)
            call.save({"run": n})
            session.commit()
            session.close()
            trans.commit() if outer == "commit" else trans.rollback()
        return ("ran", n)


@pytest.mark.parametrize("mode", MODES)
def test_outer_rollback_releases_and_commit_completes(
    real_client: redis.Redis, prefix: str, engine: sa.Engine, mode: str
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix), effects=Effects(engine))
    try:
        assert run(store, engine, "j", mode, "rollback", 1) == ("ran", 1)
        assert charges(engine, "j") == []
        assert run(store, engine, "j", mode, "commit", 2) == ("ran", 2)  # not a replay
        assert run(store, engine, "j", mode, "commit", 3) == ("replayed", {"run": 2})
        assert charges(engine, "j") == [2]
        real_client.delete(*real_client.keys(f"{prefix}*"))  # Redis forgets: the row answers
        assert run(store, engine, "j", mode, "commit", 4) == ("replayed", {"run": 2})
        assert charges(engine, "j") == [2]
    finally:
        store.close()


def test_session_rollback_in_joined_session_drops_the_value(
    real_client: redis.Redis, prefix: str, engine: sa.Engine
) -> None:
    """create_savepoint: the Session's own rollback (its savepoint) drops what it saved,
    though the outer transaction commits."""
    store = RedisStore(real_client, Policy(prefix=prefix), effects=Effects(engine))
    try:
        with guard(store, "s", payload="s") as call, engine.connect() as conn, conn.begin():
            session = Session(bind=conn, join_transaction_mode="create_savepoint")
            session.execute(sa.insert(CHARGES).values(key="s", fence=call.fence, worker=1))
            fenced(session, call)
            call.save({"run": 1})
            session.rollback()
            session.close()
            with pytest.raises(NoResultError):
                call.result  # noqa: B018
        assert charges(engine, "s") == []
        assert run(store, engine, "s", "create_savepoint", "commit", 2) == ("ran", 2)
    finally:
        store.close()


@pytest.mark.parametrize("mode", MODES)
def test_async_outer_rollback_releases(
    redis_url: str, prefix: str, db_url: str, engine: sa.Engine, mode: str
) -> None:
    async def main() -> list[Any]:
        aengine = create_async_engine(async_url(db_url))
        if aengine.dialect.name == "sqlite":
            savepoint_ready(aengine.sync_engine)
        client = redis.asyncio.Redis.from_url(redis_url)
        store = AsyncRedisStore(client, Policy(prefix=prefix), effects=AsyncEffects(aengine))
        out = []
        try:
            for n, outer in ((1, "rollback"), (2, "commit"), (3, "commit")):
                async with aguard(store, "a", payload="a") as call:
                    if call.replayed:
                        out.append(("replayed", call.result))
                        continue
                    async with aengine.connect() as conn:
                        trans = await conn.begin()
                        session = AsyncSession(bind=conn, join_transaction_mode=mode)  # type: ignore[arg-type]
                        row = sa.insert(CHARGES).values(key="a", fence=call.fence, worker=n)
                        await session.execute(row)
                        await afenced(session, call)
                        call.save({"run": n})
                        await session.commit()
                        await session.close()
                        await (trans.commit() if outer == "commit" else trans.rollback())
                    out.append(("ran", n))
        finally:
            await store.aclose()
            await client.aclose()
            await aengine.dispose()
        return out

    assert asyncio.run(main()) == [("ran", 1), ("ran", 2), ("replayed", {"run": 2})]
    assert charges(engine, "a") == [2]
