"""The database is the truth: when Redis forgets a key (a restart without persistence), the
very first retry of a fenced operation gets its committed answer from SQL without running the
work, for guard, aguard, ``@idempotent`` and a stepped job (docs/effects.md).

A private ``redis-server`` that keeps nothing on disk is restarted between the run and the
retry; the business table has no unique constraint, so its row count is the count of runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from idemkey import (
    AsyncRedisStore,
    EffectCommittedError,
    Policy,
    RedisStore,
    aguard,
    current_call,
    guard,
    idempotent,
)
from idemkey.contrib.sqlalchemy import AsyncEffects, Effects, afenced, fenced
from idemkey.errors import StoreError
from idemkey.events import Event
from tests._servers import RedisServer
from tests.sql.conftest import CHARGES, async_url

pytestmark = pytest.mark.redis


@pytest.fixture
def server(redis_server_factory: Callable[..., RedisServer]) -> RedisServer:
    return redis_server_factory()  # --save "" --appendonly no: a restart forgets every key


@pytest.fixture
def store(server: RedisServer, prefix: str, engine: sa.Engine) -> Iterator[RedisStore]:
    client = server.client()
    store = RedisStore(client, Policy(prefix=prefix), effects=Effects(engine))
    yield store
    store.close()
    client.close()


def business_rows(engine: sa.Engine, key: str) -> int:
    with engine.connect() as conn:
        query = sa.select(sa.func.count()).select_from(CHARGES).where(CHARGES.c.key == key)
        return int(conn.execute(query).scalar_one())


def forget(server: RedisServer, store: RedisStore) -> None:
    """Redis restarts without persistence: every record is gone."""
    server.restart()
    assert store.client.dbsize() == 0


def test_guard_replays_the_committed_result_on_the_first_retry_after_redis_forgot(
    server: RedisServer, store: RedisStore, engine: sa.Engine
) -> None:
    runs: list[int] = []

    def charge(key: str) -> Any:
        with guard(store, key, payload={"amount": 5}) as call:
            if call.replayed:
                return call.result, True
            runs.append(1)
            with Session(engine) as session, session.begin():
                session.execute(sa.insert(CHARGES).values(key=key, fence=call.fence))
                fenced(session, call)
                call.save({"charged": key})
            return call.result, False

    assert charge("g-1") == ({"charged": "g-1"}, False)
    forget(server, store)
    assert charge("g-1") == ({"charged": "g-1"}, True)  # the very first retry, from SQL
    assert charge("g-1") == ({"charged": "g-1"}, True)  # and Redis has it again
    assert runs == [1]
    assert business_rows(engine, "g-1") == 1


def test_a_result_saved_after_the_commit_is_recorded_with_the_effect(
    server: RedisServer, store: RedisStore, engine: sa.Engine
) -> None:
    """``@idempotent`` saves the return value after the function's transaction committed:
    the guard writes it into the committed row before completing in Redis."""
    runs: list[str] = []

    @idempotent(store, key=lambda order: f"order:{order}", outcome=True, name="ship")
    def ship(order: str) -> dict[str, str]:
        runs.append(order)
        call = current_call()
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key=order, fence=call.fence))
            fenced(session, call)
        return {"shipped": order}

    first = ship("o-7")
    assert (first.result, first.replayed) == ({"shipped": "o-7"}, False)
    forget(server, store)
    again = ship("o-7")
    assert (again.result, again.replayed) == ({"shipped": "o-7"}, True)
    assert runs == ["o-7"]
    assert business_rows(engine, "o-7") == 1


def test_a_stepped_job_resumes_after_its_committed_steps_when_redis_forgot(
    server: RedisServer, store: RedisStore, engine: sa.Engine
) -> None:
    ran: list[str] = []

    def fenced_step(call: Any, name: str, key: str) -> dict[str, Any]:
        ran.append(name)
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key=key, fence=call.fence))
            fenced(session, call, step=name)
        return {"step": name}

    def job(fail_after_charge: bool) -> Any:
        with guard(store, "job-1") as call:
            if call.replayed:
                return call.result
            charged = call.step("charge", fenced_step, call, "charge", "job-1:charge")
            if fail_after_charge:
                raise RuntimeError("the job stops between its steps")
            shipped = call.step("ship", fenced_step, call, "ship", "job-1:ship")
            call.save([charged, shipped])
            return call.result

    with pytest.raises(RuntimeError):
        job(fail_after_charge=True)
    forget(server, store)  # the checkpoint of "charge" is gone with the record
    assert job(fail_after_charge=False) == [{"step": "charge"}, {"step": "ship"}]
    assert ran == ["charge", "ship"]  # charge ran once: resumed from its committed row
    forget(server, store)
    assert job(fail_after_charge=False) == [{"step": "charge"}, {"step": "ship"}]
    assert ran == ["charge", "ship"]  # no step ran again
    assert business_rows(engine, "job-1:charge") == business_rows(engine, "job-1:ship") == 1


async def test_aguard_replays_the_committed_result_after_redis_forgot(
    server: RedisServer, prefix: str, db_url: str
) -> None:
    engine = create_async_engine(async_url(db_url))
    store = AsyncRedisStore(
        server.async_client(), Policy(prefix=prefix), effects=AsyncEffects(engine)
    )
    runs: list[int] = []

    async def charge() -> Any:
        async with aguard(store, "ag-1") as call:
            if call.replayed:
                return call.result, True
            runs.append(1)
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(sa.insert(CHARGES).values(key="ag-1", fence=call.fence))
                await afenced(session, call)
            call.save({"charged": "ag-1"})  # after the commit: recorded before Redis hears
            return call.result, False

    try:
        assert await charge() == ({"charged": "ag-1"}, False)
        server.restart()
        assert await charge() == ({"charged": "ag-1"}, True)
        assert runs == [1]
    finally:
        await store.aclose()
        await store.client.aclose()
        await engine.dispose()


def test_a_row_committed_without_its_result_is_never_run_again(
    server: RedisServer, store: RedisStore, engine: sa.Engine
) -> None:
    """The process stopped between its COMMIT and the write of its result (here: its block
    never exits), and Redis forgot the key: every retry raises EffectCommittedError without
    running the work; the effect stays single."""
    block = guard(store, "lost-1")
    call = block.__enter__()
    with Session(engine) as session, session.begin():
        session.execute(sa.insert(CHARGES).values(key="lost-1", fence=call.fence))
        fenced(session, call)
    forget(server, store)  # and the process is gone: its block never exits
    for _ in range(2):
        with pytest.raises(EffectCommittedError), guard(store, "lost-1"):
            pytest.fail("the work must not run again")
    assert business_rows(engine, "lost-1") == 1


def test_a_step_committed_without_its_result_is_never_run_again(
    server: RedisServer, store: RedisStore, engine: sa.Engine
) -> None:
    """A step's fenced transaction committed, then the process stopped before the step's
    result reached its row or Redis (staged: the step's transaction runs outside call.step,
    and the block dies): the retry's step raises EffectCommittedError naming it, and its work
    does not run again."""
    ran: list[str] = []

    def charge(call: Any) -> dict[str, str]:
        ran.append("charge")
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key="job-2:charge", fence=call.fence))
            fenced(session, call, step="charge")
        return {"step": "charge"}

    def dies_after_the_commit() -> None:
        with guard(store, "job-2") as call:
            charge(call)  # committed; no result recorded, no checkpoint
            raise RuntimeError("the process stops here")

    with pytest.raises(RuntimeError):
        dies_after_the_commit()
    forget(server, store)
    for _ in range(2):
        with pytest.raises(EffectCommittedError) as raised, guard(store, "job-2") as call:
            call.step("charge", charge, call)
        assert raised.value.step == "charge"
    assert ran == ["charge"]
    assert business_rows(engine, "job-2:charge") == 1


class UnwritableEffects(Effects):
    """Effects whose write of a result into a committed row fails (the database went away
    between the COMMIT and that write)."""

    def record(self, record: Any, step: str | None, fence: int, result: bytes) -> bool:
        raise StoreError("the effects row could not be written")


def test_a_result_not_recorded_with_its_effect_is_an_event_as_over_http(
    server: RedisServer, prefix: str, engine: sa.Engine
) -> None:
    """When the result cannot go into its committed row, the guard still completes in Redis,
    and says so as a ``store_error`` event (the HTTP driver does): an ``on_event`` hook, not
    only the log, learns that a later loss of the Redis record would be exposed."""
    events: list[Event] = []
    client = server.client()
    policy = Policy(prefix=prefix, on_event=events.append)
    store = RedisStore(client, policy, effects=UnwritableEffects(engine))

    def fenced_step(call: Any, name: str) -> dict[str, str]:
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key=f"u-1:{name}", fence=call.fence))
            fenced(session, call, step=name)
        return {"step": name}

    try:
        with guard(store, "u-1") as call:
            charged = call.step("charge", fenced_step, call, "charge")
            with Session(engine) as session, session.begin():
                session.execute(sa.insert(CHARGES).values(key="u-1", fence=call.fence))
                fenced(session, call)
            call.save(charged)
        with guard(store, "u-1") as again:
            assert (again.replayed, again.result) == (True, {"step": "charge"})
    finally:
        store.close()
        client.close()
    unrecorded = [e for e in events if e.kind == "store_error"]
    assert [(e.fence, e.detail) for e in unrecorded] == [
        (
            call.fence,
            "step 'charge' result not recorded with its effect: "
            "the effects row could not be written",
        ),
        (call.fence, "result not recorded with its effect: the effects row could not be written"),
    ]


def test_a_database_error_never_carries_the_stored_result_in_its_message(
    engine: sa.Engine,
) -> None:
    """SQLAlchemy's error text appends the statement's parameters; idemkey's StoreError text
    goes on to logs, store_error events and uncertain entries: it keeps the driver's error
    only, never the result or response being written."""
    from idemkey.contrib.sqlalchemy import effects_table
    from idemkey.records import record_for

    missing = effects_table(sa.MetaData(), name=f"no_such_effects_{id(engine)}")
    effects = Effects(engine, table=missing)  # never created: every write fails
    record = record_for("p", "", "GUARD", "", "k")
    with pytest.raises(StoreError) as failed:
        effects.record(record, None, 7, b"SECRET-RESULT-BYTES")
    assert "SECRET" not in str(failed.value)
    assert "effects write failed" in str(failed.value)
    if engine.dialect.name == "postgresql":  # psycopg's parameters show the bytes: the leak
        assert "SECRET" in str(failed.value.__cause__)  # the cause keeps it, for a debugger
