"""Fenced SQL effects, timed with ``effects=`` on the store and without it (``--effects``).

The same work in every case: a guard, one business row and ``fenced()`` in one SQLite
transaction (a file in a temporary directory, WAL), the result saved. What differs is the
store: without ``effects=`` a new key's claim reads no SQL; with it, every claim that would run
reads the key's row (one primary-key SELECT), and a result saved after the commit is written
into the row by one more UPDATE before Redis completes. The replay case is answered by Redis,
with no SQL, on both.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from idemkey import RedisStore, guard
from idemkey.contrib.sqlalchemy import Effects, fenced

from .cases import PAYLOAD, RESULT, Case, Context

__all__ = ["effects_cases"]


def effects_cases(ctx: Context) -> list[Case]:
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    folder = Path(tempfile.mkdtemp(prefix="idemkey-bench-sql-"))
    engine = sa.create_engine(f"sqlite:///{folder / 'effects.db'}")
    sa.event.listen(engine, "connect", lambda dbapi, _: dbapi.execute("PRAGMA journal_mode=WAL"))
    effects = Effects(engine)
    effects.create()
    charges = sa.Table(
        "charges", sa.MetaData(), sa.Column("key", sa.String(80)), sa.Column("fence", sa.BigInteger)
    )
    charges.create(engine, checkfirst=True)
    off = RedisStore(ctx.client, ctx.policy)
    on = RedisStore(ctx.client, ctx.policy, effects=effects)
    ctx.stores += [off, on]

    def charge(store: RedisStore, key: str, after: bool) -> None:
        with guard(store, key, payload=PAYLOAD) as call:
            if call.replayed:
                return
            with Session(engine) as session, session.begin():
                session.execute(sa.insert(charges).values(key=key, fence=call.fence))
                fenced(session, call)
                if not after:
                    call.save(RESULT)  # written into the row by the commit
            if after:
                call.save(RESULT)  # an HTTP response's case: recorded after the commit

    def case(name: str, store: RedisStore, after: bool, note: str) -> Case:
        keys = ctx.keys(name)
        return Case(name, "effects", lambda i: charge(store, keys[i], after), note=note)

    def replay(store: RedisStore) -> Any:
        return lambda i: charge(store, "effects.replay", False)

    def prepare() -> None:
        charge(on, "effects.replay", False)

    return [
        case("effects.off.first", off, False, "guard + fenced SQLite txn, no effects="),
        case("effects.on.first", on, False, "the same, effects=: + 1 SELECT at the claim"),
        case("effects.off.after", off, True, "result saved after the commit, no effects="),
        case("effects.on.after", on, True, "the same, effects=: + 1 SELECT, + 1 UPDATE"),
        Case("effects.off.replay", "effects", replay(off), note="replay from Redis",
             prepare=prepare),
        Case("effects.on.replay", "effects", replay(on), note="replay from Redis: no SQL",
             prepare=prepare),
    ]  # fmt: skip
