"""A fenced write inside a SAVEPOINT: the tie follows the savepoint the effect row was written in.

The audit's defect: ``fenced()`` and ``call.save()`` inside ``begin_nested()``, the savepoint
rolls back (no charge, no effects row), the outer transaction commits other work, and the
guard completed the record with the saved value; every retry replayed a charge the database
does not hold. Now a savepoint that rolls back drops the value saved under it and the key is
released (the retry runs), whatever the outer transaction does; a savepoint released into its
parent keeps the effect tied to the parent (its commit completes, its rollback releases). Run
on real SQLite files and PostgreSQL, through a ``Session`` and a ``Connection``, sync and
asyncio, with a real Redis. Each saved value names its execution (``run``), and the business
row keeps the same number in ``worker``, so a replayed result is checked against the database.

SQLite through pysqlite (and aiosqlite) needs SQLAlchemy's recipe for savepoints (the driver's
own BEGIN handling lets SQLite commit at the first RELEASE): :func:`savepoint_ready` applies it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from idemkey import AsyncRedisStore, NoResultError, Policy, RedisStore, aguard, guard
from idemkey.contrib.sqlalchemy import AsyncEffects, Effects, afenced, effects_table, fenced
from tests.sql.conftest import CHARGES, async_url

pytestmark = pytest.mark.redis

LEASE = 0.3


class Declined(Exception):
    """What rolls a savepoint (or a transaction) back in these tests."""


def savepoint_ready(engine: sa.Engine) -> sa.Engine:
    """SQLAlchemy's pysqlite recipe on a SQLite engine: BEGIN sent by SQLAlchemy, so that a
    SAVEPOINT is nested in the transaction (docs: "Serializable isolation / Savepoints")."""
    if engine.dialect.name == "sqlite":

        @sa.event.listens_for(engine, "connect")
        def _no_driver_begin(dbapi: Any, _: Any) -> None:
            dbapi.isolation_level = None

        @sa.event.listens_for(engine, "begin")
        def _begin(conn: sa.Connection) -> None:
            conn.exec_driver_sql("BEGIN")

    return engine


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    engine = savepoint_ready(sa.create_engine(db_url))
    yield engine
    engine.dispose()


@pytest.fixture
def store(real_client: redis.Redis, prefix: str, engine: sa.Engine) -> Iterator[RedisStore]:
    store = RedisStore(real_client, Policy(prefix=prefix, lease=LEASE), effects=Effects(engine))
    yield store
    store.close()


def state(engine: sa.Engine, key: str) -> tuple[list[Any], list[Any]]:
    """The committed runs (``worker``) of ``key``'s charges, and the effects table's fences."""
    with engine.connect() as conn:
        charged = conn.execute(sa.select(CHARGES.c.worker).where(CHARGES.c.key == key))
        effects = conn.execute(sa.select(effects_table().c.fence))
        return sorted(row[0] for row in charged), [row[0] for row in effects]


def charge_row(key: str, call: Any, run: int) -> Any:
    return sa.insert(CHARGES).values(key=key, fence=call.fence, worker=run)


@contextlib.contextmanager
def transaction(engine: sa.Engine, through: str) -> Iterator[Any]:
    """``with Session(engine) as session, session.begin()``, or ``with engine.begin()``."""
    if through == "session":
        with Session(engine) as session, session.begin():
            yield session
    else:
        with engine.begin() as conn:
            yield conn


Body = Callable[[Any, Any, str, int], None]


class Attempts:
    """Executions under the guard, numbered from 1 (``run``) in the order they run."""

    def __init__(self, store: RedisStore, engine: sa.Engine, through: str) -> None:
        self.store, self.engine, self.through = store, engine, through
        self.runs = 0

    def __call__(self, key: str, body: Body) -> Any:
        """``body(db, call, key, run)`` inside an outer transaction that commits unless the
        body raises: ``("ran", run)``, or ``("replayed", result)``."""
        with guard(self.store, key, payload=key) as call:
            if call.replayed:
                return ("replayed", call.result)
            self.runs += 1
            with transaction(self.engine, self.through) as db:
                body(db, call, key, self.runs)
            return ("ran", self.runs)


@pytest.fixture(params=["session", "connection"])
def attempt(request: pytest.FixtureRequest, store: RedisStore, engine: sa.Engine) -> Attempts:
    """Through a ``Session`` or a ``Connection``."""
    return Attempts(store, engine, request.param)


def fence_and_save(db: Any, call: Any, key: str, run: int, order: str) -> None:
    db.execute(charge_row(key, call, run))
    if order == "fenced-then-save":
        fenced(db, call)
        call.save({"run": run})
    else:
        call.save({"run": run})
        fenced(db, call)


def committing(db: Any, call: Any, key: str, run: int) -> None:
    """The documented pattern, no savepoint: it commits."""
    fence_and_save(db, call, key, run, "fenced-then-save")


def released(db: Any, call: Any, key: str, run: int) -> None:
    """The documented pattern in a savepoint released into the transaction, which commits."""
    with db.begin_nested():
        committing(db, call, key, run)


@pytest.mark.parametrize("order", ["fenced-then-save", "save-then-fenced"])
def test_a_savepoint_rolled_back_in_a_committed_transaction_stores_nothing(
    order: str, attempt: Attempts, engine: sa.Engine
) -> None:
    """The audit's case: the charge, fenced() and save() in a savepoint that rolls back, the
    outer transaction commits. The value is dropped at the savepoint's rollback and the key
    released: the retry runs (before: it replayed run 1, with no charge and no effects row).
    The retry's savepoint is released into a transaction that commits: completed, replayed."""

    def declined(db: Any, call: Any, key: str, run: int) -> None:
        with contextlib.suppress(Declined), db.begin_nested():
            fence_and_save(db, call, key, run, order)
            raise Declined
        with pytest.raises(NoResultError):
            call.result  # noqa: B018  (dropped with the savepoint, before the outer commit)
        db.execute(sa.insert(CHARGES).values(key="other-work", worker=run))

    assert attempt("inv-1", declined) == ("ran", 1)
    assert state(engine, "inv-1") == ([], [])
    assert state(engine, "other-work")[0] == [1]  # the outer transaction did commit
    assert attempt("inv-1", released) == ("ran", 2)
    assert attempt("inv-1", released) == ("replayed", {"run": 2})
    assert state(engine, "inv-1")[0] == [2]


def test_a_savepoint_effect_goes_with_the_transaction_it_was_released_into(
    attempt: Attempts, engine: sa.Engine
) -> None:
    """1: the inner savepoint is released into an outer savepoint, which rolls back; the
    transaction commits: the effect went with the outer savepoint. 2: released into the
    transaction, which rolls back. 3: a first try in a savepoint rolls back, and the same call
    fences a second effect in the transaction, which commits: that one is stored and replayed.
    """

    def nested(db: Any, call: Any, key: str, run: int) -> None:
        with contextlib.suppress(Declined), db.begin_nested():
            released(db, call, key, run)
            raise Declined

    def released_then_declined(db: Any, call: Any, key: str, run: int) -> None:
        released(db, call, key, run)
        raise Declined

    def second_try(db: Any, call: Any, key: str, run: int) -> None:
        with contextlib.suppress(Declined), db.begin_nested():
            committing(db, call, key, run)
            raise Declined
        committing(db, call, key, run * 10)

    assert attempt("inv-4", nested) == ("ran", 1)
    assert state(engine, "inv-4") == ([], [])
    with pytest.raises(Declined):
        attempt("inv-4", released_then_declined)
    assert state(engine, "inv-4") == ([], [])
    assert attempt("inv-4", second_try) == ("ran", 3)
    assert attempt("inv-4", second_try) == ("replayed", {"run": 30})
    assert state(engine, "inv-4")[0] == [30]


@pytest.mark.parametrize("saved", ["inside", "after the commit"])
def test_an_effect_row_the_commit_does_not_find_is_not_committed(
    saved: str, attempt: Attempts, engine: sa.Engine
) -> None:
    """A savepoint SQLAlchemy does not know of (plain SQL) rolls the upsert back: the commit's
    UPDATE of the row matches nothing, which is the database saying the effect is not there.
    The tie ends rolled back: a value saved inside is dropped (the retry runs); a value saved
    after the commit is the guard's plain rule (tied to no transaction), and is not recorded
    into a row that does not exist."""

    def raw_savepoint(db: Any, call: Any, key: str, run: int) -> None:
        db.execute(sa.text("SAVEPOINT raw_sp"))
        db.execute(charge_row(key, call, run))
        fenced(db, call)
        if saved == "inside":
            call.save({"run": run})
        db.execute(sa.text("ROLLBACK TO SAVEPOINT raw_sp"))

    with guard(attempt.store, "inv-6", payload="inv-6") as call:
        with transaction(attempt.engine, attempt.through) as db:
            raw_savepoint(db, call, "inv-6", 0)
        with pytest.raises(NoResultError):
            call.result  # noqa: B018
        assert call.unrecorded_fence() is None  # no 'committed, no result' row to fill
        if saved == "after the commit":
            call.save({"declined": 0})
    assert state(engine, "inv-6") == ([], [])
    expected = ("ran", 1) if saved == "inside" else ("replayed", {"declined": 0})
    assert attempt("inv-6", committing) == expected


# asyncio: AsyncSession and AsyncConnection run the same listeners on their sync twins.


def async_savepoint_ready(engine: AsyncEngine) -> AsyncEngine:
    savepoint_ready(engine.sync_engine)
    return engine


@contextlib.asynccontextmanager
async def atransaction(engine: AsyncEngine, through: str) -> AsyncIterator[Any]:
    if through == "session":
        async with AsyncSession(engine) as session, session.begin():
            yield session
    else:
        async with engine.begin() as conn:
            yield conn


@pytest.mark.parametrize("through", ["session", "connection"])
@pytest.mark.parametrize("shape", ["rolled back", "released into one rolled back"])
async def test_asyncio_a_savepoint_rolled_back_in_a_committed_transaction_stores_nothing(
    through: str, shape: str, real_async_client: redis.asyncio.Redis, prefix: str, db_url: str
) -> None:
    """aguard with afenced(): the same as the sync twins above."""
    engine = async_savepoint_ready(create_async_engine(async_url(db_url)))
    store = AsyncRedisStore(
        real_async_client, Policy(prefix=prefix, lease=LEASE), effects=AsyncEffects(engine)
    )

    async def effect(db: Any, call: Any, run: int) -> None:
        await db.execute(charge_row("inv-7", call, run))
        await afenced(db, call)
        call.save({"run": run})

    async def charge(run: int, decline: bool) -> Any:
        async with aguard(store, "inv-7", payload="inv-7") as call:
            if call.replayed:
                return ("replayed", call.result)
            async with atransaction(engine, through) as db:
                if not decline:
                    await effect(db, call, run)
                    return ("ran", run)
                with contextlib.suppress(Declined):
                    async with db.begin_nested():
                        if shape == "rolled back":
                            await effect(db, call, run)
                        else:
                            async with db.begin_nested():
                                await effect(db, call, run)
                        raise Declined
            return ("ran", run)

    try:
        assert await charge(1, decline=True) == ("ran", 1)
        assert await charge(2, decline=False) == ("ran", 2)
        assert await charge(3, decline=False) == ("replayed", {"run": 2})
    finally:
        await store.aclose()
        await engine.dispose()
    sync = sa.create_engine(db_url)
    assert state(sync, "inv-7")[0] == [2]
    sync.dispose()
