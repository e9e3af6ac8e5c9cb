"""A result saved in a transaction that rolled back is never stored (issue 20, item 1).

docs/effects.md's sample as printed before issue 20 (``session.add(...)``, ``call.save(...)``,
then ``fenced(session, call)``) and as printed now (``fenced()`` then ``save()``), on real SQLite
and PostgreSQL and a real Redis: when ``fenced()``
refuses, or the transaction rolls back for any other reason, the guard releases the key (the
next claim recovers the committed row or runs again); it never completes the record with the
rolled-back value. Each saved value names its execution (``run``), and the business row keeps
the same number in ``worker``, so a replayed result can be checked against the database.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Session

from idemkey import (
    AsyncRedisStore,
    LeaseLostError,
    Policy,
    RedisStore,
    aguard,
    current_call,
    guard,
    idempotent,
)
from idemkey.contrib.sqlalchemy import AsyncEffects, Effects, afenced, fenced
from tests._lease import lease_left
from tests._servers import RedisServer, wait_until
from tests.sql.conftest import async_url

pytestmark = pytest.mark.redis

LEASE = 0.3


class Base(DeclarativeBase):
    pass


class Charge(Base):
    """The docs' ``Charge``: a row in ``charges`` (no unique key: only the fence keeps one)."""

    __table__ = sa.Table(
        "charges",
        Base.metadata,
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("fence", sa.BigInteger),
        sa.Column("worker", sa.BigInteger),
    )
    __mapper_args__ = {"primary_key": [__table__.c.key, __table__.c.worker]}  # noqa: RUF012


def committed(engine: sa.Engine, key: str) -> list[tuple[int, int]]:
    """(fence, run) of each committed charge for ``key``."""
    with engine.connect() as conn:
        table = Charge.__table__
        query = sa.select(table.c.fence, table.c.worker).where(table.c.key == key)
        return [(row[0], row[1]) for row in conn.execute(query)]


class Runs:
    """Counts executions: each one is numbered, and its number is in its row and its result."""

    def __init__(self) -> None:
        self.fences: list[int] = []

    def start(self, fence: int | None) -> int:
        self.fences.append(fence or 0)
        return len(self.fences)

    def grew(self, count: int) -> bool:
        """``count`` executions, each with a fence above the one before (never a repeat, even
        after Redis lost the record)."""
        fences = self.fences
        return len(fences) == count and all(a < b for a, b in itertools.pairwise(fences))


def documented_charge(
    store: RedisStore,
    engine: sa.Engine,
    invoice: str,
    runs: Runs,
    meanwhile: Callable[[], Any] = lambda: None,
    order: str = "save-then-fenced",
) -> Any:
    """docs/effects.md's ``charge(invoice)``: as printed now (``fenced-then-save``), or as
    printed before issue 20 (``save-then-fenced``, still safe). ``meanwhile``: what others do
    while this one runs, before its transaction."""
    with guard(store, f"charge:{invoice}", payload=invoice) as call:
        if call.replayed:
            return call.result
        run = runs.start(call.fence)
        meanwhile()
        with Session(engine) as session, session.begin():
            session.add(Charge(key=invoice, fence=call.fence, worker=run))
            if order == "save-then-fenced":
                call.save({"invoice": invoice, "run": run})
                fenced(session, call)
            else:
                fenced(session, call)  # just before the commit: it locks the record's row
                call.save({"invoice": invoice, "run": run})  # written into the row by the commit
        return call.result


ORDERS = pytest.mark.parametrize("order", ["save-then-fenced", "fenced-then-save"])


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def store(real_client: redis.Redis, prefix: str, engine: sa.Engine) -> Iterator[RedisStore]:
    store = RedisStore(real_client, Policy(prefix=prefix, lease=LEASE), effects=Effects(engine))
    yield store
    store.close()


@ORDERS
def test_refused_after_a_stale_owner_committed_first_recovers_its_row(
    order: str, store: RedisStore, engine: sa.Engine, real_client: redis.Redis
) -> None:
    """A frozen owner resumes and commits while its successor (a higher fence) runs; the
    successor's fenced() refuses. Its retry replays the committed charge, not the successor's
    rolled-back one."""
    runs = Runs()
    stale = guard(store, "charge:inv-1", payload="inv-1")
    stale_call = stale.__enter__()
    assert stale.claim is not None
    store._unwatch(stale.record, stale.claim.owner)  # no heartbeat: frozen past its lease
    wait_until(lambda: lease_left(real_client, stale.record) == -2, 5, "the stale lease to lapse")

    def stale_owner_commits() -> None:
        with Session(engine) as session, session.begin():
            session.add(Charge(key="inv-1", fence=stale_call.fence, worker=0))
            stale_call.save({"invoice": "inv-1", "run": 0})
            fenced(session, stale_call)

    with pytest.raises(LeaseLostError):
        documented_charge(store, engine, "inv-1", runs, stale_owner_commits, order)
    assert committed(engine, "inv-1") == [(stale_call.fence, 0)]
    assert runs.grew(1)
    assert runs.fences[0] > (stale_call.fence or 0)
    with pytest.raises(LeaseLostError):  # its completion: the record is the successor's
        stale.__exit__(None, None, None)
    # The successor released: the next claim reads the committed row and replays it.
    recovered = documented_charge(store, engine, "inv-1", runs, order=order)
    assert recovered == {"invoice": "inv-1", "run": 0}
    assert runs.grew(1)  # not run again
    assert committed(engine, "inv-1") == [(stale_call.fence, 0)]


@ORDERS
def test_after_redis_lost_its_records_the_first_retry_replays_the_committed_row(
    order: str, private_redis_server: RedisServer, prefix: str, engine: sa.Engine
) -> None:
    """Redis forgets the record (FLUSHALL: a restart without persistence): the very first
    retry's claim reads the committed row and replays it; nothing runs again (before the
    database was the truth, it ran, was refused and released)."""
    client = private_redis_server.client()
    store = RedisStore(client, Policy(prefix=prefix, lease=LEASE), effects=Effects(engine))
    runs = Runs()

    def charge() -> Any:
        return documented_charge(store, engine, "inv-2", runs, order=order)

    first = charge()
    assert first == {"invoice": "inv-2", "run": 1}
    client.flushall()
    assert charge() == first  # from SQL
    assert charge() == first  # now from Redis
    assert runs.grew(1)
    assert committed(engine, "inv-2") == [(runs.fences[0], 1)]
    store.close()
    client.close()


@ORDERS
@pytest.mark.parametrize("through", ["session", "connection"])
def test_a_constraint_violated_at_commit_releases_the_key(
    order: str, through: str, store: RedisStore, engine: sa.Engine, db_url: str
) -> None:
    """The COMMIT itself fails (a deferred foreign key: no such invoice) after save(): the
    transaction rolled back, so the record is not completed; the retry runs again."""
    checked = sa.create_engine(db_url)
    if checked.dialect.name == "sqlite":
        sa.event.listen(
            checked, "connect", lambda dbapi, _: dbapi.execute("PRAGMA foreign_keys=ON")
        )
    with checked.begin() as conn:
        conn.execute(sa.text("DROP TABLE IF EXISTS ledger"))
        conn.execute(sa.text("DROP TABLE IF EXISTS invoices"))
        conn.execute(sa.text("CREATE TABLE invoices (id VARCHAR(20) PRIMARY KEY)"))
        conn.execute(
            sa.text(
                "CREATE TABLE ledger (invoice VARCHAR(20) REFERENCES invoices (id)"
                " DEFERRABLE INITIALLY DEFERRED)"
            )
        )
    runs = Runs()
    ledger = sa.text("INSERT INTO ledger (invoice) VALUES ('inv-3')")

    def charge_with_ledger() -> Any:
        with guard(store, "charge:inv-3", payload="inv-3") as call:
            if call.replayed:
                return call.result
            run = runs.start(call.fence)
            with contextlib.ExitStack() as stack:
                if through == "session":
                    db: Any = stack.enter_context(Session(checked))
                    stack.enter_context(db.begin())
                else:
                    db = stack.enter_context(checked.begin())
                db.execute(sa.insert(Charge.__table__).values(key="inv-3", fence=call.fence))
                db.execute(ledger)  # checked only by the COMMIT
                if order == "save-then-fenced":
                    call.save({"run": run})
                    fenced(db, call)
                else:
                    fenced(db, call)
                    call.save({"run": run})
            return call.result

    with pytest.raises(sa.exc.IntegrityError):
        charge_with_ledger()
    assert committed(engine, "inv-3") == []
    with checked.begin() as conn:
        conn.execute(sa.text("INSERT INTO invoices (id) VALUES ('inv-3')"))
    assert charge_with_ledger() == {"run": 2}  # released, not completed: it runs again
    assert charge_with_ledger() == {"run": 2}
    assert runs.grew(2)
    assert committed(engine, "inv-3") == [(runs.fences[1], None)]
    with checked.begin() as conn:
        conn.execute(sa.text("DROP TABLE ledger"))
        conn.execute(sa.text("DROP TABLE invoices"))
    checked.dispose()


def test_an_idempotent_function_saving_through_current_call_is_replayed_after_redis_lost_it(
    private_redis_server: RedisServer, prefix: str, engine: sa.Engine
) -> None:
    """docs/effects.md's @idempotent form: current_call().save() inside the transaction, then
    fenced(); Redis loses its records: the first retry replays the committed value."""
    client = private_redis_server.client()
    store = RedisStore(client, Policy(prefix=prefix, lease=LEASE), effects=Effects(engine))
    runs = Runs()

    @idempotent(store, key=lambda invoice: f"charge:{invoice}", name="book")
    def book(invoice: str) -> dict[str, Any]:
        call = current_call()
        run = runs.start(call.fence)
        with Session(engine) as session, session.begin():
            session.add(Charge(key=invoice, fence=call.fence, worker=run))
            result = {"invoice": invoice, "run": run}
            call.save(result)
            fenced(session, call)
        return result

    assert book("inv-4") == {"invoice": "inv-4", "run": 1}
    client.flushall()
    assert book("inv-4") == book("inv-4") == {"invoice": "inv-4", "run": 1}
    assert runs.grew(1)
    assert committed(engine, "inv-4") == [(runs.fences[0], 1)]
    store.close()
    client.close()


@pytest.mark.parametrize("form", ["aguard", "idempotent", "connection"])
async def test_asyncio_after_redis_lost_its_records_the_first_retry_replays_the_row(
    form: str, private_redis_server: RedisServer, prefix: str, db_url: str
) -> None:
    """The asyncio twin: aguard (or an async @idempotent with current_call()), AsyncSession
    (or AsyncConnection), save() then afenced(), FLUSHALL: the first retry replays the
    committed row."""
    engine = create_async_engine(async_url(db_url))
    client = redis.asyncio.Redis.from_url(private_redis_server.url)
    store = AsyncRedisStore(
        client, Policy(prefix=prefix, lease=LEASE), effects=AsyncEffects(engine)
    )
    runs = Runs()

    async def transaction(call: Any, invoice: str) -> dict[str, Any]:
        run = runs.start(call.fence)
        if form == "connection":
            async with engine.begin() as conn:
                charge = sa.insert(Charge.__table__)
                await conn.execute(charge.values(key=invoice, fence=call.fence, worker=run))
                call.save({"invoice": invoice, "run": run})
                await afenced(conn, call)
            return {"invoice": invoice, "run": run}
        async with AsyncSession(engine) as session, session.begin():
            session.add(Charge(key=invoice, fence=call.fence, worker=run))
            call.save({"invoice": invoice, "run": run})
            await afenced(session, call)
        return {"invoice": invoice, "run": run}

    async def by_aguard(invoice: str) -> Any:
        async with aguard(store, f"charge:{invoice}", payload=invoice) as call:
            if call.replayed:
                return call.result
            await transaction(call, invoice)
            return call.result

    @idempotent(store, key=lambda invoice: f"charge:{invoice}", name="charge")
    async def by_idempotent(invoice: str) -> dict[str, Any]:
        return await transaction(current_call(), invoice)

    charge = by_idempotent if form == "idempotent" else by_aguard
    try:
        assert await charge("inv-5") == {"invoice": "inv-5", "run": 1}
        await client.flushall()
        assert await charge("inv-5") == {"invoice": "inv-5", "run": 1}
        assert await charge("inv-5") == {"invoice": "inv-5", "run": 1}
        assert runs.grew(1)
    finally:
        await store.aclose()
        await client.aclose()
        await engine.dispose()
    sync = sa.create_engine(db_url)
    assert committed(sync, "inv-5") == [(runs.fences[0], 1)]
    sync.dispose()


def test_a_result_saved_in_a_fenced_step_that_rolled_back_is_not_stored(
    store: RedisStore, engine: sa.Engine
) -> None:
    """A recovery point fenced on its own row (fenced(session, call, step=...)) saves the
    call's result inside its transaction, which then rolls back: the step did not finish, the
    result is dropped, and the retry runs the step again."""
    runs = Runs()

    class Declined(Exception):
        pass

    def charge_step(call: Any, decline: bool) -> int:
        run = runs.start(call.fence)
        with Session(engine) as session, session.begin():
            session.add(Charge(key="inv-7", fence=call.fence, worker=run))
            fenced(session, call, step="charge")
            call.save({"run": run})
            if decline:
                raise Declined
        return run

    def order(decline: bool) -> Any:
        with guard(store, "order:inv-7", payload="inv-7") as call:
            if call.replayed:
                return call.result
            call.step("charge", charge_step, call, decline)
            return call.result

    with pytest.raises(Declined):
        order(decline=True)
    assert committed(engine, "inv-7") == []
    assert order(decline=False) == {"run": 2}  # released, not completed with run 1
    assert order(decline=False) == {"run": 2}
    assert runs.grew(2)
    assert committed(engine, "inv-7") == [(runs.fences[1], 2)]


def test_a_transaction_still_open_when_the_block_ends_releases_then_recovers(
    store: RedisStore, engine: sa.Engine
) -> None:
    """The guard inside the transaction: at the block's end the result is not committed yet,
    so the key is released rather than completed; the commit writes the result into the row,
    and the next claim replays it from there."""
    runs = Runs()
    with (
        Session(engine) as session,
        session.begin(),
        guard(store, "charge:inv-6", payload="inv-6") as call,
    ):
        run = runs.start(call.fence)
        session.add(Charge(key="inv-6", fence=call.fence, worker=run))
        call.save({"run": run})
        fenced(session, call)
    with guard(store, "charge:inv-6", payload="inv-6") as call:
        assert call.replayed
        assert call.result == {"run": 1}
    assert runs.grew(1)
    assert committed(engine, "inv-6") == [(runs.fences[0], 1)]


def test_an_unfenced_save_then_an_exception_still_completes(store: RedisStore) -> None:
    """The guard's rule for calls tied to no transaction stays: the work was done."""

    def work_then_fail() -> None:
        with guard(store, "plain") as call:
            call.save("done")
            raise RuntimeError("after the work")

    with pytest.raises(RuntimeError):
        work_then_fail()
    with guard(store, "plain") as call:
        assert call.replayed
        assert call.result == "done"
