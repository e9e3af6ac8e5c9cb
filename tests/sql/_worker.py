"""Worker processes for the fenced-effects tests.

``python -m tests.sql._worker MODE REDIS_URL PREFIX DB_URL LEASE [KEYS...]``

Each business write is a row in ``charges`` (``key``, ``fence``, ``worker``), deliberately with
no unique constraint: only the fence can keep a key to one row.

* ``stale``: claims ``KEYS[0]``, opens a transaction (on PostgreSQL, with its row already
  inserted; SQLite allows one writer at a time, so there the row follows the pause), prints
  ``ready`` and waits for a line on stdin (the test SIGSTOPs it meanwhile, lets its lease lapse
  and runs a successor), then fences and tries to commit. Prints ``lost`` when refused.
* ``commit-then-die`` / ``commit-then-die-async``: claims ``KEYS[0]``, commits a fenced
  transaction with its row and its saved result, prints ``committed`` and SIGKILLs itself
  before the Redis completion.
* ``race``: works through every key in a random order until each one has a result, with no
  heartbeat and a random pause past the lease on one execution in eight, so successors take
  over records whose first owner is still running. Prints how many times it ran the work.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time
from typing import Any

import redis
import redis.asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from idemkey import (
    AsyncRedisStore,
    LeaseLostError,
    Policy,
    RedisStore,
    RequestInFlightError,
    aguard,
    guard,
)
from idemkey.contrib.sqlalchemy import AsyncEffects, Effects, afenced, fenced

CHARGES = sa.table("charges", sa.column("key"), sa.column("fence"), sa.column("worker"))


def make_engine(url: str) -> sa.Engine:
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"timeout": 60})

        @sa.event.listens_for(engine, "connect")
        def wal(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.execute("PRAGMA journal_mode=WAL")

        return engine
    return sa.create_engine(url, pool_size=2)


def insert_charge(session: Session, key: str, fence: int | None) -> None:
    session.execute(sa.insert(CHARGES).values(key=key, fence=fence, worker=os.getpid()))


def stale(store: RedisStore, engine: sa.Engine, key: str, write_first: bool) -> None:
    with guard(store, key) as call:
        assert not call.replayed
        try:
            with Session(engine) as session, session.begin():
                if write_first:  # PostgreSQL: a transaction left open across the pause
                    insert_charge(session, key, call.fence)
                print("ready", flush=True)
                sys.stdin.readline()  # SIGSTOPped here; the successor commits meanwhile
                if not write_first:  # SQLite: one writer at a time, so write after it
                    insert_charge(session, key, call.fence)
                call.save({"by": "stale", "fence": call.fence})
                fenced(session, call)
        except LeaseLostError:
            print("lost", flush=True)
            raise


def commit_then_die(store: RedisStore, engine: sa.Engine, key: str) -> None:
    with guard(store, key) as call:
        with Session(engine) as session, session.begin():
            insert_charge(session, key, call.fence)
            call.save({"by": os.getpid(), "fence": call.fence})
            fenced(session, call)
        print("committed", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


async def commit_then_die_async(redis_url: str, prefix: str, db_url: str, key: str) -> None:
    engine = create_async_engine(db_url)
    store = AsyncRedisStore(
        redis.asyncio.Redis.from_url(redis_url),
        Policy(prefix=prefix, lease=LEASE),
        effects=AsyncEffects(engine),
    )
    async with aguard(store, key) as call:
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(
                sa.insert(CHARGES).values(key=key, fence=call.fence, worker=os.getpid())
            )
            call.save({"by": os.getpid(), "fence": call.fence})
            await afenced(session, call)
        print("committed", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def race(store: RedisStore, engine: sa.Engine, keys: list[str], lease: float) -> None:
    store._watch = lambda *args: None  # type: ignore[method-assign]  # no heartbeat: lapses
    pending = list(keys)
    random.shuffle(pending)
    ran = 0
    deadline = time.monotonic() + 120
    while pending and time.monotonic() < deadline:
        key = pending.pop(0)
        try:
            with guard(store, key) as call:
                if call.replayed:
                    continue
                ran += 1
                with Session(engine) as session, session.begin():
                    insert_charge(session, key, call.fence)
                    if random.random() < 1 / 8:
                        time.sleep(lease * 1.5)  # a pause past the lease: others take over
                    call.save({"fence": call.fence})
                    fenced(session, call)
        except (RequestInFlightError, LeaseLostError):
            pending.append(key)  # not done by us, maybe not at all yet: look again later
            time.sleep(random.uniform(0, lease / 4))
    print(f"ran {ran} pending {len(pending)}", flush=True)


LEASE = 0.3


def main(argv: list[str]) -> None:
    global LEASE
    mode, redis_url, prefix, db_url, lease, *keys = argv
    LEASE = float(lease)
    if mode == "commit-then-die-async":
        asyncio.run(commit_then_die_async(redis_url, prefix, db_url, keys[0]))
        return
    engine = make_engine(db_url)
    store = RedisStore(
        redis.Redis.from_url(redis_url, socket_timeout=10),
        Policy(prefix=prefix, lease=LEASE),
        effects=Effects(engine),
    )
    try:
        if mode == "stale":
            stale(store, engine, keys[0], write_first=not db_url.startswith("sqlite"))
        elif mode == "commit-then-die":
            commit_then_die(store, engine, keys[0])
        elif mode == "race":
            race(store, engine, keys, LEASE)
        else:
            sys.exit(f"unknown mode {mode}")
    finally:
        store.close()


if __name__ == "__main__":
    main(sys.argv[1:])
