"""Two audit defects of ``effects=`` as the truth.

* A custom effects table (``Effects(engine, table=effects_table(md, name=...))``): ``fenced()``
  without ``table=``, as the docs print it, wrote ``idemkey_effects``; after Redis forgot,
  every retry was ``LeaseLostError``. Now it fences in the table of the store's Effects.
* A lost lease after the call's fenced row committed said "nothing of this run is stored" (the
  error) and "a retry runs the work again" (the lease_lost event): both false, the row holds
  the effect and the retry replays it; a user could undo a charge that happened.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session

from idemkey import LeaseLostError, Policy, RedisStore, guard
from idemkey.contrib.sqlalchemy import Effects, effects_table, fenced
from tests.sql.conftest import CHARGES

pytestmark = pytest.mark.redis


def forget(client: redis.Redis, prefix: str) -> None:
    """Redis forgets the test's records (its prefix: FLUSHALL would reach other tests)."""
    names = client.keys(f"{prefix}*")
    if names:
        client.delete(*names)


def charge(store: RedisStore, engine: sa.Engine, key: str, n: int, lose: Any = None) -> Any:
    with guard(store, key, payload=key) as call:
        if call.replayed:
            return ("replayed", call.result)
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key=key, fence=call.fence, worker=n))
            fenced(session, call)
            call.save({"run": n})
        if lose is not None:
            lose()
        return ("ran", n)


def charged(engine: sa.Engine, key: str) -> list[Any]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(CHARGES.c.worker).where(CHARGES.c.key == key))
        return sorted(row[0] for row in rows)


def test_fenced_writes_the_store_effects_table(
    real_client: redis.Redis, prefix: str, engine: sa.Engine
) -> None:
    custom = effects_table(sa.MetaData(), name="my_effects")
    custom.drop(engine, checkfirst=True)
    custom.create(engine)
    store = RedisStore(real_client, Policy(prefix=prefix), effects=Effects(engine, table=custom))
    try:
        assert charge(store, engine, "c", 1) == ("ran", 1)
        forget(real_client, prefix)
        assert charge(store, engine, "c", 2) == ("replayed", {"run": 1})
        assert charged(engine, "c") == [1]
        with engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(custom)).scalar() == 1
            default = effects_table()
            assert conn.execute(sa.select(sa.func.count()).select_from(default)).scalar() == 0
    finally:
        store.close()
        custom.drop(engine, checkfirst=True)


def test_lease_lost_after_commit_says_the_effect_committed(
    real_client: redis.Redis, prefix: str, engine: sa.Engine
) -> None:
    events: list[Any] = []
    policy = Policy(prefix=prefix, on_event=events.append)
    store = RedisStore(real_client, policy, effects=Effects(engine))
    try:
        with pytest.raises(LeaseLostError) as lost:
            charge(store, engine, "l", 1, lose=lambda: forget(real_client, prefix))
        text = str(lost.value)
        assert "committed in the database" in text
        assert "a retry replays it" in text
        assert "nothing of this run is stored" not in text
        assert lost.value.committed
        assert lost.value.recorded
        [event] = [e for e in events if e.kind == "lease_lost"]
        assert "committed in the database" in event.detail
        assert "a retry runs the work again" not in event.detail
        assert charge(store, engine, "l", 2) == ("replayed", {"run": 1})
        assert charged(engine, "l") == [1]
    finally:
        store.close()


def test_lease_lost_without_a_committed_row_says_nothing_is_stored(
    real_client: redis.Redis, prefix: str, engine: sa.Engine
) -> None:
    events: list[Any] = []
    store = RedisStore(real_client, Policy(prefix=prefix, on_event=events.append))
    try:

        def lose() -> None:
            with guard(store, "n", payload="n") as call:
                call.save({"run": 1})
                forget(real_client, prefix)

        with pytest.raises(LeaseLostError) as lost:
            lose()
        assert "nothing of this run is stored" in str(lost.value)
        assert "committed in the database" not in str(lost.value)
        assert not lost.value.committed
        [event] = [e for e in events if e.kind == "lease_lost"]
        assert "a retry runs the work again" in event.detail
    finally:
        store.close()
