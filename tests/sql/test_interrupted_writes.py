"""Ctrl-C in a sync guard while a fenced result is written does not strand the effect.

A fenced transaction commits its row as "committed, no result" when the result is known only
after the commit (a step's return value, a value saved after it); the step runner, or the
guard as its block exits, then writes the result into the row, and Redis after it. A thread
can be interrupted (``KeyboardInterrupt``, ``SystemExit`` from a signal handler) at any
bytecode, inside those writes too. Before, the interruption cut them off: the row kept
"committed, no result", Redis had nothing, and every retry got ``EffectCommittedError`` for a
result the process knew. Now the writes are sent again whole (both are idempotent) before
the interruption goes on, as aguard does for a cancel (tests/sql/test_step_cancel.py).

The interruption is raised from a patched point inside the write, deterministically: the
first ``Effects.record`` of the test raises it before its UPDATE is sent. Real Redis, real
SQLite files and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session

from idemkey import Policy, RedisStore, guard
from idemkey._codec import encode_value
from idemkey._core import Record, record_for
from idemkey.contrib.sqlalchemy import Effects, fenced
from idemkey.guard import GUARD_METHOD
from tests._lease import lapse
from tests._servers import wait_until
from tests.sql.conftest import CHARGES

pytestmark = pytest.mark.redis

RESULT = {"charge_id": "ch_1"}
INTERRUPTIONS = [KeyboardInterrupt, SystemExit]


class InterruptedRecordEffects(Effects):
    """The first write of a result into a committed row is interrupted before it is sent."""

    def __init__(self, engine: sa.Engine, interruption: type[BaseException]) -> None:
        super().__init__(engine)
        self.interruption = interruption
        self.calls = 0

    def record(self, record: Record, step: str | None, fence: int, result: bytes) -> bool:
        self.calls += 1
        if self.calls == 1:
            raise self.interruption  # Ctrl-C as the UPDATE was about to go out
        return super().record(record, step, fence, result)


@pytest.fixture(params=INTERRUPTIONS, ids=lambda kind: kind.__name__)
def effects(request: pytest.FixtureRequest, engine: sa.Engine) -> InterruptedRecordEffects:
    return InterruptedRecordEffects(engine, request.param)


@pytest.fixture
def store(
    real_client: redis.Redis, prefix: str, effects: InterruptedRecordEffects
) -> Iterator[RedisStore]:
    store = RedisStore(real_client, Policy(prefix=prefix, lease=30), effects=effects)
    yield store
    store.close()


def charges(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(CHARGES)).scalar_one())


def test_an_interruption_while_a_steps_result_is_recorded_does_not_strand_the_step(
    real_client: redis.Redis,
    prefix: str,
    engine: sa.Engine,
    effects: InterruptedRecordEffects,
    store: RedisStore,
) -> None:
    record = record_for(prefix, "", GUARD_METHOD, "", "job")
    ran: list[str] = []

    def charge(call: Any) -> dict[str, str]:
        ran.append("charge")
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key="job:charge", fence=call.fence))
            fenced(session, call, step="charge")
        return RESULT

    def job() -> Any:
        with guard(store, "job", payload=b"p") as call:
            if call.replayed:
                return call.result
            got = call.step("charge", charge, call)
            call.save({"charge": got["charge_id"]})
            return call.result

    with pytest.raises(effects.interruption):
        job()
    # The step is finished all the same: its row holds its result, Redis its checkpoint, and
    # the cancelled entry (the key is held until the lease lapses) names it.
    encoded = encode_value(RESULT)
    assert effects.find(record, "charge") == encoded
    assert real_client.hget(record.record_key, "s:charge") == encoded
    (entry,) = wait_until(store.uncertain, 10, "the cancelled entry")
    assert (entry.kind, entry.steps) == ("cancelled", ("charge",))
    # The retry after the lease resumes after the step...
    assert lapse(real_client, record) == 1
    assert job() == {"charge": "ch_1"}
    # ... and after Redis forgot the key, the step's row is the truth.
    real_client.delete(record.record_key)
    assert job() == {"charge": "ch_1"}
    assert ran == ["charge"]
    assert charges(engine) == 1  # the effect, once


def test_an_interruption_while_a_result_saved_after_the_commit_is_recorded_completes(
    real_client: redis.Redis,
    prefix: str,
    engine: sa.Engine,
    effects: InterruptedRecordEffects,
    store: RedisStore,
) -> None:
    """The guard's own row: the value is saved after the fenced commit, so the guard records
    it into the row as the block exits, then completes Redis; Ctrl-C comes in between."""
    record = record_for(prefix, "", GUARD_METHOD, "", "order")
    ran: list[str] = []

    def order() -> Any:
        with guard(store, "order", payload=b"p") as call:
            if call.replayed:
                return call.result
            ran.append("order")
            with Session(engine) as session, session.begin():
                session.execute(sa.insert(CHARGES).values(key="order", fence=call.fence))
                fenced(session, call)
            call.save(RESULT)  # after the commit: recorded into the row as the block exits
            return call.result

    with pytest.raises(effects.interruption):
        order()
    assert effects.find(record) == encode_value(RESULT)
    assert order() == RESULT  # completed: replayed from Redis at once
    real_client.delete(record.record_key)
    assert order() == RESULT  # and from the row once Redis forgot it
    assert ran == ["order"]
    assert charges(engine) == 1
