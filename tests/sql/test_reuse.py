"""The database refuses a reused key as Redis does, and keeps each prefix's rows apart.

* A committed row keeps the fingerprint of the request that committed it: after Redis forgot
  the record, the same key with another payload (another HTTP body) is key reuse
  (``KeyReuseError``, 422), the claim is released and the row untouched, and the first
  request's own retry still replays from the row. The same for a step's row: another payload
  does not resume someone else's committed step (docs/steps.md).
* Stores with their own ``Policy.prefix`` sharing one effects table are two sets of rows: one
  never replays the other's result.
* Rows written before (idemkey 0.3's layout: no fingerprint, the bare digest as the key) are
  still found and replayed by the configuration that wrote them; they cannot be compared.

A private ``redis-server`` that keeps nothing on disk is restarted to make Redis forget; real
SQLite files and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from flask import Flask, request
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from idemkey import AsyncRedisStore, Policy, RedisStore, aguard, current_call, guard
from idemkey._codec import encode_value
from idemkey.adapters.flask import Idemkey
from idemkey.contrib._sql_effects import row_key
from idemkey.contrib.sqlalchemy import AsyncEffects, Effects, afenced, effects_table, fenced
from idemkey.errors import KeyReuseError
from idemkey.guard._call import GUARD_METHOD
from idemkey.records import record_for
from tests._servers import RedisServer
from tests.sql.conftest import CHARGES, async_url

pytestmark = pytest.mark.redis


@pytest.fixture
def server(redis_server_factory: Callable[..., RedisServer]) -> RedisServer:
    return redis_server_factory()  # --save "" --appendonly no: a restart forgets every key


@pytest.fixture(params=["default", "own"])
def store_prefix(request: pytest.FixtureRequest, prefix: str) -> str:
    """The default prefix (rows keyed by the bare digest, as before) and a prefix of its own."""
    return "idemkey" if request.param == "default" else prefix


@pytest.fixture
def client(server: RedisServer) -> Iterator[redis.Redis]:
    client = server.client()
    yield client
    client.close()


@pytest.fixture
def store(client: redis.Redis, store_prefix: str, engine: sa.Engine) -> Iterator[RedisStore]:
    store = RedisStore(client, Policy(prefix=store_prefix), effects=Effects(engine))
    yield store
    store.close()


def forget(server: RedisServer, client: redis.Redis) -> None:
    """Redis restarts without persistence: every record is gone."""
    server.restart()
    assert client.dbsize() == 0


def business_rows(engine: sa.Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        query = sa.select(CHARGES.c.key, CHARGES.c.worker).order_by(CHARGES.c.key)
        return [tuple(row) for row in conn.execute(query)]


def effects_rows(engine: sa.Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        query = sa.text("SELECT record, fence, result FROM idemkey_effects ORDER BY record")
        return [tuple(row) for row in conn.execute(query)]


@pytest.mark.parametrize("saved_after_commit", [False, True], ids=["saved_in", "saved_after"])
def test_another_payload_after_redis_forgot_is_key_reuse_and_the_first_still_replays(
    server: RedisServer,
    client: redis.Redis,
    store: RedisStore,
    engine: sa.Engine,
    saved_after_commit: bool,
) -> None:
    """``saved_after``: the commit marks the row committed with no result, and the guard
    records the result into it as the block exits (``Call.outdated_fence``), keeping the
    fingerprint: the first request's retry replays it from the row, another payload is 422."""
    runs: list[int] = []

    def charge(amount: int) -> Any:
        with guard(store, "inv-1", payload={"amount": amount}) as call:
            if call.replayed:
                return call.result, True
            runs.append(amount)
            with Session(engine) as session, session.begin():
                session.execute(sa.insert(CHARGES).values(key="inv-1", worker=amount))
                fenced(session, call)
                if not saved_after_commit:
                    call.save({"amount": amount})
            if saved_after_commit:
                call.save({"amount": amount})
            return call.result, False

    assert charge(1000) == ({"amount": 1000}, False)
    with pytest.raises(KeyReuseError):
        charge(5)  # Redis has the record
    forget(server, client)
    before = effects_rows(engine)
    for _ in range(2):
        with pytest.raises(KeyReuseError):
            charge(5)  # the database says the same: the claim is released each time
    assert effects_rows(engine) == before  # nothing overwritten
    assert charge(1000) == ({"amount": 1000}, True)  # the first request's retry: its answer
    assert charge(1000) == ({"amount": 1000}, True)  # from Redis again
    assert runs == [1000]
    assert business_rows(engine) == [("inv-1", 1000)]


async def test_aguard_a_result_recorded_after_the_commit_keeps_the_fingerprint(
    server: RedisServer, store_prefix: str, db_url: str
) -> None:
    """The late write of a result (saved after the commit) into the row keeps the request's
    fingerprint there: another payload is still key reuse after Redis forgot."""
    engine = create_async_engine(async_url(db_url))
    client = server.async_client()
    store = AsyncRedisStore(client, Policy(prefix=store_prefix), effects=AsyncEffects(engine))
    runs: list[int] = []

    async def charge(amount: int) -> Any:
        async with aguard(store, "ag-1", payload={"amount": amount}) as call:
            if call.replayed:
                return call.result, True
            runs.append(amount)
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(sa.insert(CHARGES).values(key="ag-1", worker=amount))
                await afenced(session, call)
            call.save({"amount": amount})  # after the commit: recorded into the row
            return call.result, False

    try:
        assert await charge(1000) == ({"amount": 1000}, False)
        server.restart()
        with pytest.raises(KeyReuseError):
            await charge(5)
        assert await charge(1000) == ({"amount": 1000}, True)
        assert runs == [1000]
    finally:
        await store.aclose()
        await client.aclose()
        await engine.dispose()


def test_a_row_committed_without_its_result_refuses_another_payload_as_key_reuse(
    server: RedisServer, client: redis.Redis, store: RedisStore, engine: sa.Engine
) -> None:
    """Another payload is key reuse, not the first request's lost answer (EffectCommittedError
    stays the first request's)."""
    from idemkey import EffectCommittedError

    block = guard(store, "lost-1", payload={"amount": 1000})
    call = block.__enter__()
    with Session(engine) as session, session.begin():
        session.execute(sa.insert(CHARGES).values(key="lost-1", worker=1000))
        fenced(session, call)
    forget(server, client)  # and the process is gone: its block never exits
    with pytest.raises(KeyReuseError), guard(store, "lost-1", payload={"amount": 5}):
        pytest.fail("the work must not run")
    with pytest.raises(EffectCommittedError), guard(store, "lost-1", payload={"amount": 1000}):
        pytest.fail("the work must not run again")
    assert business_rows(engine) == [("lost-1", 1000)]


def test_a_step_row_is_not_resumed_by_another_payload(
    server: RedisServer, client: redis.Redis, store: RedisStore, engine: sa.Engine
) -> None:
    charged: list[int] = []

    def charge(call: Any, amount: int) -> dict[str, int]:
        charged.append(amount)
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key="order-77", worker=amount))
            fenced(session, call, step="charge")
        return {"charged": amount}

    def place(amount: int, *, fail_after_charge: bool = False) -> Any:
        with guard(store, "order:77", payload={"amount": amount}) as call:
            if call.replayed:
                return call.result
            got = call.step("charge", charge, call, amount)
            if fail_after_charge:
                raise RuntimeError("the shipping service is down")
            call.save({"charge": got})
            return call.result

    with pytest.raises(RuntimeError):
        place(1000, fail_after_charge=True)  # released, its finished step kept
    with pytest.raises(KeyReuseError):
        place(5)  # Redis: the released record with steps stays bound to its payload
    forget(server, client)
    for _ in range(2):
        with pytest.raises(KeyReuseError):
            place(5)  # the step's row says the same
    assert charged == [1000]
    assert place(1000) == {"charge": {"charged": 1000}}  # resumes after its committed step
    assert charged == [1000]
    assert business_rows(engine) == [("order-77", 1000)]


def test_an_http_body_after_redis_forgot_is_422_and_the_first_body_replays(
    server: RedisServer, client: redis.Redis, store: RedisStore, engine: sa.Engine
) -> None:
    """docs/effects.md's Flask sample: a ``coffee`` body with the ``tea`` order's key is 422,
    before and after Redis forgot, and never gets the ``tea`` order back."""
    app = Flask(__name__)
    idem = Idemkey(app, store=store)

    @app.post("/orders")
    @idem.idempotent
    def create_order() -> tuple[dict[str, Any], int]:
        sku = request.json["sku"]  # type: ignore[index]
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key=sku, worker=1))
            fenced(session, current_call())
        return {"sku": sku}, 201

    web = app.test_client()
    headers = {"Idempotency-Key": "order-5", "Authorization": "Bearer sk_test_1"}

    def post(sku: str) -> tuple[int, Any, str | None]:
        reply = web.post("/orders", json={"sku": sku}, headers=headers)
        return reply.status_code, reply.get_json(), reply.headers.get("Idempotent-Replayed")

    assert post("tea") == (201, {"sku": "tea"}, None)
    assert post("coffee")[0] == 422
    forget(server, client)
    for _ in range(2):
        status, body, _ = post("coffee")
        assert status == 422, body
    assert post("tea") == (201, {"sku": "tea"}, "true")
    assert business_rows(engine) == [("tea", 1)]


def test_stores_with_their_own_prefix_share_the_table_without_replaying_each_other(
    client: redis.Redis, prefix: str, engine: sa.Engine
) -> None:
    """Two services (billing, mailer), each with its own prefix, guard the same key with the
    same payload: each runs its own job once and replays its own result."""
    effects = Effects(engine)
    stores = {
        name: RedisStore(client, Policy(prefix=name_prefix), effects=effects)
        for name, name_prefix in (
            ("default", "idemkey"),
            ("billing", f"{prefix}-billing"),
            ("mailer", f"{prefix}-mailer"),
        )
    }
    ran: list[str] = []

    def job(service: str) -> Any:
        with guard(stores[service], "invoice:123", payload=b"") as call:
            if call.replayed:
                return call.result
            ran.append(service)
            with Session(engine) as session, session.begin():
                fenced(session, call)
                call.save({"service": service})
            return call.result

    try:
        for _ in range(2):
            for service in stores:
                assert job(service) == {"service": service}
        assert ran == list(stores)
        assert len(effects_rows(engine)) == 3
    finally:
        for each in stores.values():
            each.close()


def test_a_long_prefix_and_a_long_step_name_fit_the_row_key(
    client: redis.Redis, engine: sa.Engine
) -> None:
    """The row key holds any prefix the Policy takes (VARCHAR(160), enforced by PostgreSQL),
    with a step name of the longest length steps allow (100 characters)."""
    store = RedisStore(client, Policy(prefix="p" * 500), effects=Effects(engine))
    name = "s" * 100

    def step(call: Any) -> str:
        with Session(engine) as session, session.begin():
            fenced(session, call, step=name)
        return "done"

    try:
        with guard(store, "k" * 255) as call:
            assert call.step(name, step, call) == "done"
            with Session(engine) as session, session.begin():
                fenced(session, call)
                call.save("all done")
    finally:
        store.close()
    assert max(len(row[0]) for row in effects_rows(engine)) <= 160


def insert_legacy_row(engine: sa.Engine, row: str, result: bytes) -> None:
    """A row as idemkey 0.3 wrote it: the bare digest (``#step``) as the key, the result as
    it is, no fingerprint."""
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(effects_table()).values(
                record=row,
                fence=1,
                result=result,
                created_at=now,
                expires_at=now + timedelta(hours=1),
            )
        )


def test_rows_written_before_are_still_found_and_replayed(
    client: redis.Redis, store: RedisStore, store_prefix: str, engine: sa.Engine
) -> None:
    """0.3's rows (and main's before this layout) hold no fingerprint: they are used as before,
    by the same configuration, whatever the payload (they cannot be compared)."""
    record = record_for(store_prefix, "", GUARD_METHOD, "", "old-1")
    insert_legacy_row(engine, record.digest, encode_value({"old": 1}))
    stepped = record_for(store_prefix, "", GUARD_METHOD, "", "old-2")
    insert_legacy_row(engine, f"{stepped.digest}#charge", encode_value({"charged": 1000}))

    with guard(store, "old-1", payload={"amount": 1000}) as call:
        assert (call.replayed, call.result) == (True, {"old": 1})
    client.flushdb()
    with guard(store, "old-1", payload={"amount": 5}) as call:
        assert (call.replayed, call.result) == (True, {"old": 1})  # not comparable: as before

    def never(*_: Any) -> None:
        pytest.fail("the committed step ran again")

    with guard(store, "old-2", payload={"amount": 1000}) as call:
        assert call.step("charge", never) == {"charged": 1000}
        call.save("resumed")


def test_a_row_of_another_prefix_in_the_new_layout_is_not_taken_for_an_old_one(
    client: redis.Redis, prefix: str, engine: sa.Engine
) -> None:
    """A store with its own prefix still reads 0.3's rows at the bare digest, but a row the
    default prefix writes there now is the default prefix's: it is not replayed."""
    effects = Effects(engine)
    default = RedisStore(client, Policy(prefix="idemkey"), effects=effects)
    own = RedisStore(client, Policy(prefix=prefix), effects=effects)
    try:
        with (
            guard(default, "shared", payload=b"") as call,
            Session(engine) as session,
            session.begin(),
        ):
            fenced(session, call)
            call.save("default's")
        with guard(own, "shared", payload=b"") as call:
            assert not call.replayed
            call.save("own")
        assert len(effects_rows(engine)) == 1  # the own prefix's claim committed nothing
    finally:
        default.close()
        own.close()


def test_the_default_prefix_keeps_the_row_key_0_3_wrote() -> None:
    """Rows of the default prefix are where 0.3 wrote them; any other prefix has rows of its
    own (the digest does not hold the prefix: two prefixes share it)."""
    default = record_for("idemkey", "", GUARD_METHOD, "", "k")
    billing = record_for("billing", "", GUARD_METHOD, "", "k")
    assert billing.digest == default.digest
    assert row_key(default, None) == row_key(default, None, legacy=True) == default.digest
    assert row_key(default, "charge") == f"{default.digest}#charge"
    assert row_key(billing, None).startswith(f"{billing.digest}@")
    assert row_key(billing, "charge") == f"{row_key(billing, None)}#charge"
    assert row_key(billing, "charge", legacy=True) == f"{billing.digest}#charge"


def test_a_transaction_fenced_in_a_thread_given_the_claims_context_keeps_the_fingerprint(
    server: RedisServer, client: redis.Redis, store: RedisStore, engine: sa.Engine
) -> None:
    """fenced() reads the request's fingerprint from the context the claim ran in: a worker
    thread handed that context (``contextvars.copy_context().run``, as ``asyncio.to_thread``
    does) commits a row that still refuses another payload."""

    def commit(call: Any, amount: int) -> None:
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key="t-1", worker=amount))
            fenced(session, call)
            call.save({"amount": amount})

    def charge(amount: int) -> Any:
        with guard(store, "t-1", payload={"amount": amount}) as call:
            if not call.replayed:
                with ThreadPoolExecutor(1) as pool:
                    pool.submit(contextvars.copy_context().run, commit, call, amount).result()
            return call.result

    assert charge(1000) == {"amount": 1000}
    forget(server, client)
    with pytest.raises(KeyReuseError):
        charge(5)
    assert charge(1000) == {"amount": 1000}
    assert business_rows(engine) == [("t-1", 1000)]


def test_a_transaction_fenced_in_a_thread_without_the_claims_context_keeps_the_fingerprint(
    server: RedisServer, client: redis.Redis, store: RedisStore, engine: sa.Engine
) -> None:
    """A plain ``threading.Thread`` starts with an empty context: the row still keeps the
    request's fingerprint (the call carries it), so after Redis forgot, another payload is
    key reuse, not the first request's replay."""

    def commit(call: Any, amount: int) -> None:
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key="t-2", worker=amount))
            fenced(session, call)
            call.save({"amount": amount})

    def charge(amount: int) -> Any:
        with guard(store, "t-2", payload={"amount": amount}) as call:
            if not call.replayed:
                worker = threading.Thread(target=commit, args=(call, amount))
                worker.start()
                worker.join(timeout=30)
                assert not worker.is_alive()
            return call.result

    assert charge(1000) == {"amount": 1000}
    forget(server, client)
    with pytest.raises(KeyReuseError):
        charge(5)
    assert charge(1000) == {"amount": 1000}  # the first request's retry: from the row
    assert business_rows(engine) == [("t-2", 1000)]


async def test_aguard_a_transaction_fenced_in_a_plain_executor_keeps_the_fingerprint(
    server: RedisServer, store_prefix: str, db_url: str
) -> None:
    """``loop.run_in_executor`` with a plain executor runs without the claim's context (only
    ``asyncio.to_thread`` copies it): the row keeps the fingerprint all the same, and a
    step's row too."""
    sync_engine = sa.create_engine(db_url)
    client = server.async_client()
    effects = AsyncEffects(create_async_engine(async_url(db_url)))
    store = AsyncRedisStore(client, Policy(prefix=store_prefix), effects=effects)
    charged: list[int] = []

    def commit(call: Any, amount: int, step: str | None) -> dict[str, int]:
        charged.append(amount)
        with Session(sync_engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key="ex-1", worker=amount))
            fenced(session, call, step=step)
            if step is None:
                call.save({"amount": amount})
        return {"charged": amount}

    async def charge(amount: int) -> Any:
        async with aguard(store, "ex-1", payload={"amount": amount}) as call:
            if call.replayed:
                return call.result
            loop = asyncio.get_running_loop()
            with ThreadPoolExecutor(1) as pool:
                await loop.run_in_executor(pool, commit, call, amount, None)
            return call.result

    async def place(amount: int) -> Any:
        async with aguard(store, "ex-2", payload={"amount": amount}) as call:
            loop = asyncio.get_running_loop()
            with ThreadPoolExecutor(1) as pool:
                got = await call.step(
                    "charge", lambda: loop.run_in_executor(pool, commit, call, amount, "charge")
                )
            raise RuntimeError(f"the shipping service is down after {got}")

    try:
        assert await charge(1000) == {"amount": 1000}
        with pytest.raises(RuntimeError):
            await place(1000)  # released, its committed step kept
        server.restart()  # Redis forgets both
        with pytest.raises(KeyReuseError):
            await charge(5)
        with pytest.raises(KeyReuseError):
            await place(5)  # the step's row is not resumed by another payload
        assert await charge(1000) == {"amount": 1000}
        assert charged == [1000, 1000]
    finally:
        await store.aclose()
        await client.aclose()
        await effects.engine.dispose()
        sync_engine.dispose()


def test_a_step_run_in_a_thread_without_the_claims_context_keeps_the_fingerprint(
    server: RedisServer, client: redis.Redis, store: RedisStore, engine: sa.Engine
) -> None:
    """The whole ``call.step`` in a plain thread: its fenced transaction commits the row, then
    the step runner records the step's result into it, both outside the claim's context; the
    row keeps the fingerprint through both, so another payload does not resume the step."""
    charged: list[int] = []

    def charge(call: Any, amount: int) -> dict[str, int]:
        charged.append(amount)
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key="t-3", worker=amount))
            fenced(session, call, step="charge")
        return {"charged": amount}

    def in_plain_thread(work: Callable[[], Any]) -> Any:
        """``work()`` in a ``threading.Thread`` (an empty context): its value or its error."""
        outcome: list[Any] = []

        def run() -> None:
            try:
                outcome.append((True, work()))
            except Exception as exc:
                outcome.append((False, exc))

        worker = threading.Thread(target=run)
        worker.start()
        worker.join(timeout=30)
        (ok, value), *_ = outcome
        if not ok:
            raise value
        return value

    def place(amount: int, *, fail_after_charge: bool = False) -> Any:
        with guard(store, "t-3", payload={"amount": amount}) as call:
            got = in_plain_thread(lambda: call.step("charge", charge, call, amount))
            if fail_after_charge:
                raise RuntimeError("the shipping service is down")
            call.save({"charge": got})
            return call.result

    with pytest.raises(RuntimeError):
        place(1000, fail_after_charge=True)  # released, its committed step kept
    forget(server, client)
    with pytest.raises(KeyReuseError):
        place(5)  # the thread's call.step refuses it: nothing saved, the key released
    assert place(1000) == {"charge": {"charged": 1000}}  # resumes after its committed step
    assert charged == [1000]
    assert business_rows(engine) == [("t-3", 1000)]
