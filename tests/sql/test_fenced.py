"""Fenced effects (idemkey.contrib.sqlalchemy) against a real Redis and real databases.

Every business write is a row in ``charges`` with no unique constraint, so the count of rows
per key is the count of committed executions: the fence alone must keep it at one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis
import redis.asyncio
import sqlalchemy as sa
from sqlalchemy.orm import Session

from idemkey import (
    AsyncRedisStore,
    EffectCommittedError,
    LeaseLostError,
    Policy,
    RedisStore,
    StoredFailureError,
    aguard,
    guard,
)
from idemkey.contrib.sqlalchemy import AsyncEffects, Effects, afenced, effects_table, fenced
from idemkey.errors import ConfigurationError, StoreError
from idemkey.records import Claimed, payload_fingerprint, record_for
from tests._lease import lapse, lease_left
from tests._servers import wait_until
from tests.sql.conftest import CHARGES, async_url

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
LEASE = 0.3


def rows(url: str, key: str | None = None) -> list[tuple[Any, ...]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            query = sa.select(CHARGES.c.key, CHARGES.c.fence)
            if key is not None:
                query = query.where(CHARGES.c.key == key)
            return [tuple(row) for row in conn.execute(query)]
    finally:
        engine.dispose()


@pytest.fixture
def store(real_client: redis.Redis, prefix: str, engine: sa.Engine) -> Iterator[RedisStore]:
    store = RedisStore(real_client, Policy(prefix=prefix, lease=LEASE), effects=Effects(engine))
    yield store
    store.close()


@pytest.fixture
def spawn(redis_url: str, prefix: str, db_url: str) -> Iterator[Callable[..., Any]]:
    procs: list[subprocess.Popen[str]] = []

    def start(mode: str, *keys: str, url: str | None = None) -> subprocess.Popen[str]:
        args = [mode, redis_url, prefix, url or db_url, str(LEASE), *keys]
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.sql._worker", *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            proc.communicate(timeout=30)


def charge(store: RedisStore, engine: sa.Engine, key: str, runs: list[int]) -> Any:
    with guard(store, key) as call:
        if call.replayed:
            return call.result
        runs.append(call.fence or 0)
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key=key, fence=call.fence))
            call.save({"fence": call.fence})
            fenced(session, call)
        return call.result


def test_a_fenced_commit_keeps_the_saved_result_in_the_row(
    store: RedisStore, engine: sa.Engine, db_url: str
) -> None:
    runs: list[int] = []
    first = charge(store, engine, "k1", runs)
    assert charge(store, engine, "k1", runs) == first  # replayed by Redis
    [ran] = runs
    assert first == {"fence": ran}
    assert ran > 10**15  # the server's clock in µs: BIGINT holds it
    assert rows(db_url, "k1") == [("k1", ran)]
    with engine.connect() as conn:
        fence, result = conn.execute(sa.text("SELECT fence, result FROM idemkey_effects")).one()
    assert fence == ran
    assert result is not None


def test_a_rolled_back_transaction_leaves_no_result(
    store: RedisStore, engine: sa.Engine, db_url: str
) -> None:
    class Declined(Exception):
        pass

    declined: list[int] = []

    def declined_charge() -> None:
        with guard(store, "k2") as call, Session(engine) as session, session.begin():
            declined.append(call.fence or 0)
            session.execute(sa.insert(CHARGES).values(key="k2", fence=call.fence))
            call.save({"fence": call.fence})
            fenced(session, call)
            raise Declined

    with pytest.raises(Declined):
        declined_charge()
    assert rows(db_url, "k2") == []
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM idemkey_effects")).scalar() == 0
    runs: list[int] = []
    # The value saved in the rolled-back transaction went with it: released, so it runs again.
    result = charge(store, engine, "k2", runs)
    [ran] = runs
    assert ran > declined[0]
    assert result == {"fence": ran}
    assert rows(db_url, "k2") == [("k2", ran)]


def test_a_newer_fence_refuses_an_older_one(
    real_client: redis.Redis, prefix: str, engine: sa.Engine, db_url: str
) -> None:
    """Two claims of one record in one process: the successor's commit wins, the stale one
    is refused with LeaseLostError and rolled back."""
    policy = Policy(prefix=prefix, lease=LEASE)
    store = RedisStore(real_client, policy, effects=Effects(engine))
    old = guard(store, "k3")
    old_call = old.__enter__()
    store._unwatch(old.record, old_call_owner(old))  # stop its heartbeat: a frozen owner
    wait_until(lambda: lease_left(real_client, old.record) == -2, 5, "the old lease to lapse")
    runs: list[int] = []
    assert charge(store, engine, "k3", runs) == {"fence": runs[0]}
    assert runs[0] > (old_call.fence or 0)
    with Session(engine) as session:
        session.begin()
        session.execute(sa.insert(CHARGES).values(key="k3", fence=old_call.fence))
        with pytest.raises(LeaseLostError):
            fenced(session, old_call)
        session.rollback()
    old.__exit__(None, None, None)  # its release is refused: the record is not its own
    assert rows(db_url, "k3") == [("k3", runs[0])]
    store.close()


def old_call_owner(state: Any) -> str:
    return str(state.claim.owner)


def test_each_claim_that_runs_reads_one_row_and_a_replay_none(
    real_client: redis.Redis, prefix: str
) -> None:
    """With effects=, the database is the truth: every claim that would run the work asks it
    (one row, by key), whatever the fence; a replay Redis answers reads no SQL."""
    looked: list[str] = []

    class CountingEffects:
        def find(self, record: Any, step: str | None = None) -> bytes | None:
            looked.append(record.digest)
            return None

        def record(self, record: Any, step: str | None, fence: int, result: bytes) -> bool:
            raise AssertionError("nothing was fenced: nothing to record")

    store = RedisStore(real_client, Policy(prefix=prefix), effects=CountingEffects())
    with guard(store, "first") as call:
        call.save(1)
    assert len(looked) == 1  # the first claim: Redis has no record, SQL may
    with guard(store, "first") as call:
        assert call.replayed
    assert len(looked) == 1  # a replay: Redis only
    with pytest.raises(RuntimeError), guard(store, "again"):
        raise RuntimeError("released")
    with guard(store, "again") as call:
        call.save(2)
    assert len(looked) == 3
    store.close()


def test_a_failing_lookup_fails_closed_and_frees_the_key(
    real_client: redis.Redis, prefix: str
) -> None:
    class BrokenEffects:
        def find(self, record: Any, step: str | None = None) -> bytes | None:
            raise StoreError("database down")

        def record(self, record: Any, step: str | None, fence: int, result: bytes) -> bool:
            raise StoreError("database down")

    store = RedisStore(real_client, Policy(prefix=prefix), effects=BrokenEffects())
    with pytest.raises(StoreError, match="database down"), guard(store, "k"):
        pytest.fail("the block must not run without its fence check")
    store.effects = None
    with guard(store, "k") as call:  # released by the failed attempt: no 409 until a lease
        assert not call.replayed
        call.save(3)
    store.close()


def test_fenced_refuses_a_replayed_call(store: RedisStore, engine: sa.Engine) -> None:
    with guard(store, "k4") as call:
        call.save(1)
    with guard(store, "k4") as call:
        assert call.replayed
        replayed = call
    with Session(engine) as session, pytest.raises(ConfigurationError):
        fenced(session, replayed)


def test_a_stale_owner_resumed_after_its_successor_committed_cannot_commit(
    store: RedisStore, engine: sa.Engine, db_url: str, spawn: Callable[..., Any], real_client: Any
) -> None:
    worker = spawn("stale", "k5")
    assert worker.stdout is not None
    assert worker.stdout.readline().strip() == "ready"
    os.kill(worker.pid, signal.SIGSTOP)  # a GC pause / a frozen VM, past its lease
    runs: list[int] = []
    result = wait_until(
        lambda: charge(store, engine, "k5", runs),
        10,
        "the successor to take the record over",
        ignore=(Exception,),
    )
    assert result == {"fence": runs[-1]}
    os.kill(worker.pid, signal.SIGCONT)
    out, err = worker.communicate("go\n", timeout=30)
    assert "lost" in out, err
    assert worker.returncode != 0  # LeaseLostError reached the stale worker's caller
    assert rows(db_url, "k5") == [("k5", runs[-1])]  # the stale row was rolled back


@pytest.mark.parametrize("mode", ["commit-then-die", "commit-then-die-async"])
def test_a_worker_killed_after_its_commit_is_replayed_not_run_again(
    mode: str, store: RedisStore, engine: sa.Engine, db_url: str, spawn: Callable[..., Any]
) -> None:
    url = async_url(db_url) if mode.endswith("async") else db_url
    worker = spawn(mode, "k6", url=url)
    out, _ = worker.communicate(timeout=30)
    assert "committed" in out
    assert worker.returncode == -signal.SIGKILL  # died before Redis heard of the commit
    runs: list[int] = []
    result = wait_until(
        lambda: charge(store, engine, "k6", runs),
        10,
        "the lease of the dead worker to lapse",
        ignore=(Exception,),
    )
    assert runs == []  # the handler did not run again
    assert result == {"by": worker.pid, "fence": result["fence"]}
    assert rows(db_url, "k6") == [("k6", result["fence"])]
    assert charge(store, engine, "k6", runs) == result  # now completed in Redis too


async def test_aguard_with_afenced_and_async_effects(
    real_async_client: redis.asyncio.Redis, prefix: str, db_url: str
) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine(async_url(db_url))
    store = AsyncRedisStore(
        real_async_client, Policy(prefix=prefix, lease=LEASE), effects=AsyncEffects(engine)
    )
    runs: list[int] = []
    for _ in range(2):
        async with aguard(store, "k7") as call:
            if call.replayed:
                break
            runs.append(call.fence or 0)
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(sa.insert(CHARGES).values(key="k7", fence=call.fence))
                call.save({"fence": call.fence})
                await afenced(session, call)
    assert len(runs) == 1
    async with engine.connect() as conn:
        saved = (await conn.execute(sa.text("SELECT result FROM idemkey_effects"))).scalar()
    assert saved is not None
    await store.aclose()
    await engine.dispose()
    assert rows(db_url, "k7") == [("k7", runs[0])]


@pytest.mark.slow
def test_racing_workers_with_lapsing_leases_commit_one_row_per_key(
    db_url: str, spawn: Callable[..., Any]
) -> None:
    # 80 keys: about ten pauses past the lease (one execution in eight pauses), so successors
    # take over on every run (the check below fails one run in ~50 000); 200 took 4x longer.
    keys = [f"race-{i}" for i in range(80)]
    started = time.monotonic()
    workers = [spawn("race", *keys) for _ in range(8)]
    outputs = [worker.communicate(timeout=180) for worker in workers]
    for worker, (out, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, err[-2000:]
        assert "pending 0" in out, out
    ran = sum(int(out.split()[1]) for out, _ in outputs)
    counts: dict[str, int] = {}
    for key, _fence in rows(db_url):
        counts[key] = counts.get(key, 0) + 1
    assert sorted(counts) == sorted(keys)
    duplicated = {key: n for key, n in counts.items() if n != 1}
    assert duplicated == {}
    # The pauses made successors take over: more executions ran than rows were committed.
    assert ran > len(keys), f"no lease lapsed ({ran} executions): the test proved nothing"
    print(
        f"{db_url.split(':')[0]}: {ran} executions, {len(keys)} rows, "
        f"{time.monotonic() - started:.1f} s"
    )


def test_an_idempotent_function_fences_through_current_call(
    store: RedisStore, engine: sa.Engine, db_url: str
) -> None:
    from idemkey import current_call, idempotent

    runs: list[int] = []

    @idempotent(store, key=lambda order: f"order:{order}", name="book")
    def book(order: str) -> dict[str, Any]:
        call = current_call()
        runs.append(call.fence or 0)
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key=order, fence=call.fence))
            result = {"order": order, "fence": call.fence}
            call.save(result)  # into the row, with the commit: recoverable
            fenced(session, call)
        return result

    assert book("o1") == book("o1") == {"order": "o1", "fence": runs[0]}
    assert len(runs) == 1
    assert rows(db_url, "o1") == [("o1", runs[0])]
    with pytest.raises(LookupError):
        current_call()
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT result FROM idemkey_effects")).scalar() is not None


def test_records_lost_by_redis_still_commit_one_effect(
    store: RedisStore, engine: sa.Engine, db_url: str, real_client: redis.Redis, prefix: str
) -> None:
    """Redis forgets the record (its keys deleted): the retry's claim reads the committed row
    and replays it, whatever its fence; the work does not run again (tests/sql/test_truth.py
    restarts a real server for the same)."""
    runs: list[int] = []
    first = charge(store, engine, "k8", runs)
    real_client.delete(*real_client.keys(f"{prefix}:*"))
    assert charge(store, engine, "k8", runs) == first  # the first retry: from SQL
    assert len(runs) == 1
    assert rows(db_url, "k8") == [("k8", runs[0])]


def test_a_recovery_point_fences_its_own_transaction(
    real_client: redis.Redis, prefix: str, engine: sa.Engine, db_url: str
) -> None:
    """Each step can be fenced on its own row: a stale owner's step cannot commit after its
    successor's step did, and the successor's later steps are unaffected."""
    store = RedisStore(real_client, Policy(prefix=prefix, lease=LEASE), effects=Effects(engine))

    def charge_step(call: Any, key: str) -> dict[str, int]:
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key=key, fence=call.fence))
            fenced(session, call, step="charge")
        return {"fence": call.fence}

    old = guard(store, "order-9")
    old_call = old.__enter__()
    store._unwatch(old.record, old_call_owner(old))  # frozen before its step
    wait_until(lambda: lease_left(real_client, old.record) == -2, 5, "the old lease to lapse")
    with guard(store, "order-9") as call:
        assert call.takeover
        assert (call.fence or 0) > (old_call.fence or 0)
        assert call.step("charge", charge_step, call, "order-9:charge") == {"fence": call.fence}
        call.save("shipped")
    with Session(engine) as session:
        session.begin()
        session.execute(sa.insert(CHARGES).values(key="order-9:charge", fence=old_call.fence))
        with pytest.raises(LeaseLostError):
            fenced(session, old_call, step="charge")
        session.rollback()
    old.__exit__(None, None, None)
    assert rows(db_url, "order-9:charge") == [("order-9:charge", call.fence)]
    store.close()


def test_a_commit_with_nothing_saved_is_still_final(
    store: RedisStore, engine: sa.Engine, db_url: str
) -> None:
    """A block that commits its fenced transaction but saves nothing (then fails, so the key is
    released): the retry finds the effect committed with no result, and does not run; every
    retry says so (EffectCommittedError), and the effect stays single."""

    class Lost(Exception):
        pass

    committed: list[int] = []

    def commit_then_fail() -> None:
        with guard(store, "k9") as call:
            committed.append(call.fence or 0)
            with Session(engine) as session, session.begin():
                session.execute(sa.insert(CHARGES).values(key="k9", fence=call.fence))
                fenced(session, call)
            raise Lost  # nothing saved: released, as if the result were lost

    with pytest.raises(Lost):
        commit_then_fail()
    runs: list[int] = []
    for _ in range(2):
        with pytest.raises(EffectCommittedError):
            charge(store, engine, "k9", runs)
    assert runs == []
    assert rows(db_url, "k9") == [("k9", committed[0])]


def test_a_forged_effects_row_raises_no_undeclared_class(
    real_client: redis.Redis, prefix: str, engine: sa.Engine
) -> None:
    # Whoever can write the effects table names a class in a saved result: the takeover that
    # reads the row replays it through the guard's own check, as for a Redis record.
    store = RedisStore(real_client, Policy(prefix=prefix, lease=LEASE), effects=Effects(engine))
    record = record_for(prefix, "", "GUARD", "", "forged")
    assert isinstance(store.claim(record, payload_fingerprint(b""), heartbeat=False), Claimed)
    forged = b"\x03" + msgspec.msgpack.encode(["subprocess:CalledProcessError", "x", {"cmd": "x"}])
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    with engine.begin() as conn:  # the row the crashed claim's fenced commit would have left
        conn.execute(
            sa.insert(effects_table()).values(
                record=record.digest,
                fence=1,
                result=forged,
                created_at=now,
                expires_at=now + timedelta(hours=1),
            )
        )
    assert lapse(real_client, record) == 1
    try:
        with (
            pytest.raises(StoredFailureError) as raised,
            guard(store, "forged", cache_exceptions=(ValueError,)),
        ):
            pytest.fail("the block ran")
        assert raised.value.type_path == "subprocess:CalledProcessError"
    finally:
        store.close()
