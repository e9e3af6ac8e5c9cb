"""fenced() and afenced() given what cannot work raise idemkey's typed errors, and release the key.

* A ``Session`` bound to nothing (SQLAlchemy's ``UnboundExecutionError`` before), or an object
  of the other flavour (an ``AsyncSession`` to ``fenced()``, a ``Session`` to ``afenced()``):
  ``ConfigurationError``, before anything runs.
* The effects table missing or not of the documented schema (SQLAlchemy's ``OperationalError``
  on SQLite, ``ProgrammingError`` on PostgreSQL, before): ``StoreError`` "effects upsert
  failed: ...", as the store built with ``effects=`` reports the same table ("effects lookup
  failed: ..."): the database's answer does not tell a missing migration from a wrong one or
  an outage, and both sides of one table fail alike. The caller's own writes flushed before the
  upsert keep their own exception (an ``IntegrityError`` stays one).

In every case a value saved before ``fenced()`` is not completed: the key is released, and the
next claim runs. Real SQLite files and PostgreSQL, a real Redis.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Session

from idemkey import AsyncRedisStore, Policy, RedisStore, aguard, guard
from idemkey.contrib.sqlalchemy import AsyncEffects, Effects, afenced, effects_table, fenced
from idemkey.errors import ConfigurationError, StoreError
from idemkey.records import record_for
from tests.sql.conftest import CHARGES, async_url

pytestmark = pytest.mark.redis


class Base(DeclarativeBase):
    pass


class Charge(Base):
    """A row in ``charges`` (tests/sql/conftest.py's CHARGES_DDL)."""

    __table__ = sa.Table(
        "charges",
        Base.metadata,
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("fence", sa.BigInteger),
        sa.Column("worker", sa.BigInteger),
    )
    __mapper_args__ = {"primary_key": [__table__.c.key, __table__.c.fence]}  # noqa: RUF012


@pytest.fixture
def store(real_client: redis.Redis, prefix: str, engine: sa.Engine) -> Iterator[RedisStore]:
    store = RedisStore(real_client, Policy(prefix=prefix, lease=0.3), effects=Effects(engine))
    yield store
    store.close()


@pytest.fixture
def missing() -> sa.Table:
    """An effects table the database does not have."""
    return effects_table(name=f"missing_{uuid.uuid4().hex[:8]}")


@pytest.fixture
def wrong(engine: sa.Engine) -> Iterator[sa.Table]:
    """An effects table of the wrong schema (no ``created_at``, no ``expires_at``)."""
    name = f"wrong_{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {name} (record VARCHAR(160), fence BIGINT)"))
    yield effects_table(name=name)
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE {name}"))


def released(store: RedisStore, key: str) -> bool:
    """The next claim of ``key`` runs (nothing was completed, nothing holds the key)."""
    with guard(store, key, payload=key) as call:
        return not call.replayed


def charge(store: RedisStore, key: str, write: Callable[[Any], None]) -> None:
    """Save, then ``write(call)`` (which fences): the block of a guard."""
    with guard(store, key, payload=key) as call:
        call.save("charged")
        write(call)
        call.save("charged")


def test_an_unbound_session_is_a_configuration_error(store: RedisStore) -> None:
    def unbound(call: Any) -> None:
        with Session() as session:
            fenced(session, call)

    with pytest.raises(ConfigurationError, match="bound"):
        charge(store, "k1", unbound)
    assert released(store, "k1")  # the value saved before fenced() was not completed


@pytest.mark.parametrize("through", ["session", "connection"])
@pytest.mark.parametrize("table", ["missing", "wrong"])
def test_an_effects_table_that_cannot_be_written_is_a_store_error(
    through: str, table: str, store: RedisStore, engine: sa.Engine, request: pytest.FixtureRequest
) -> None:
    effects: sa.Table = request.getfixturevalue(table)

    def write(call: Any) -> None:
        if through == "session":
            with Session(engine) as session, session.begin():
                session.add(Charge(key="k2", fence=call.fence))
                fenced(session, call, table=effects)
        else:
            with engine.begin() as conn:
                conn.execute(sa.insert(CHARGES).values(key="k2", fence=call.fence))
                fenced(conn, call, table=effects)

    with pytest.raises(StoreError, match="effects upsert failed") as raised:
        charge(store, "k2", write)
    assert isinstance(raised.value.__cause__, sa.exc.DBAPIError)
    assert released(store, "k2")
    with engine.connect() as conn:  # the business write rolled back with it
        assert conn.execute(sa.select(CHARGES.c.key).where(CHARGES.c.key == "k2")).all() == []
    # The store reading the same table says the same.
    found = Effects(engine, table=effects)
    with pytest.raises(StoreError, match="effects lookup failed"):
        found.find(record_for("p", "", "GUARD", "", "k2"))


def test_the_callers_flush_and_the_effects_table_fail_each_with_their_own_error(
    store: RedisStore, engine: sa.Engine, missing: sa.Table
) -> None:
    """The caller's pending writes are flushed before the upsert: their failure is theirs (an
    IntegrityError stays one); the upsert's own is the effects table's (StoreError)."""
    for key, error in [(None, sa.exc.IntegrityError), ("k3", StoreError)]:

        def write(call: Any, key: str | None = key) -> None:
            with Session(engine) as session, session.begin():
                session.add(Charge(key=key, fence=call.fence))  # key is NOT NULL
                fenced(session, call, table=missing)

        with pytest.raises(error):
            charge(store, "k3", write)
        assert released(store, "k3")


def test_a_session_of_the_other_flavour_is_a_configuration_error(
    store: RedisStore, engine: sa.Engine, db_url: str
) -> None:
    asynchronous = create_async_engine(async_url(db_url))

    def to_fenced(call: Any) -> None:
        fenced(AsyncSession(asynchronous), call)

    def to_afenced(call: Any) -> None:
        with Session(engine) as session:
            afenced(session, call).send(None)  # type: ignore[arg-type]

    for write in (to_fenced, to_afenced):
        with pytest.raises(ConfigurationError, match="afenced"):
            charge(store, "k4", write)
        assert released(store, "k4")


@pytest.mark.parametrize("through", ["unbound", "session", "connection"])
async def test_asyncio_the_same_errors(
    through: str, real_async_client: redis.asyncio.Redis, prefix: str, db_url: str
) -> None:
    engine = create_async_engine(async_url(db_url))
    store = AsyncRedisStore(
        real_async_client, Policy(prefix=prefix, lease=0.3), effects=AsyncEffects(engine)
    )
    missing = effects_table(name=f"missing_{uuid.uuid4().hex[:8]}")

    async def write(call: Any) -> None:
        if through == "unbound":
            async with AsyncSession() as session:
                await afenced(session, call)
        elif through == "session":
            async with AsyncSession(engine) as session, session.begin():
                await afenced(session, call, table=missing)
        else:
            async with engine.begin() as conn:
                await afenced(conn, call, table=missing)

    async def acharge() -> None:
        async with aguard(store, "k5", payload="k5") as call:
            call.save("charged")
            await write(call)

    try:
        with pytest.raises(ConfigurationError if through == "unbound" else StoreError):
            await acharge()
        async with aguard(store, "k5", payload="k5") as call:
            assert not call.replayed  # released
    finally:
        await store.aclose()
        await engine.dispose()


def test_an_unprotected_call_refuses_fenced_work(engine: sa.Engine, db_url: str) -> None:
    """Redis down under ``on_store_error="open"``: the block runs without a claim, so there is
    no fence to check. fenced() says so (``UnprotectedCallError``, a ``StoreError``), and the
    transaction rolls back with the caller's writes; a replay is still a ConfigurationError."""
    from idemkey.errors import UnprotectedCallError
    from tests._servers import free_port, no_retry

    def through_session(call: Any) -> None:
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key="open-1"))
            fenced(session, call)

    def through_connection(call: Any) -> None:
        with engine.begin() as conn:
            conn.execute(sa.insert(CHARGES).values(key="open-1"))
            fenced(conn, call)

    dead = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=no_retry())
    store = RedisStore(dead, Policy(on_store_error="open"), effects=Effects(engine))
    try:
        for work in (through_session, through_connection):
            with guard(store, "open-1") as call:
                assert call.fence is None
                with pytest.raises(UnprotectedCallError, match='on_store_error="open"') as raised:
                    work(call)
                assert isinstance(raised.value, StoreError)
    finally:
        store.close()
        dead.close()
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(CHARGES)).scalar() == 0


async def test_asyncio_an_unprotected_call_refuses_fenced_work(db_url: str) -> None:
    from idemkey.errors import UnprotectedCallError
    from tests._servers import free_port, no_async_retry

    engine = create_async_engine(async_url(db_url))
    dead = redis.asyncio.Redis(port=free_port(), socket_connect_timeout=1, retry=no_async_retry())
    store = AsyncRedisStore(dead, Policy(on_store_error="open"), effects=AsyncEffects(engine))

    async def work(call: Any) -> None:
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(sa.insert(CHARGES).values(key="open-2"))
            await afenced(session, call)

    try:
        async with aguard(store, "open-2") as call:
            with pytest.raises(UnprotectedCallError):
                await work(call)
        async with engine.connect() as conn:
            count = await conn.scalar(sa.select(sa.func.count()).select_from(CHARGES))
        assert count == 0
    finally:
        await store.aclose()
        await dead.aclose()
        await engine.dispose()


def unprotected_work(engine: sa.Engine) -> str:
    """A handler's fenced work through ``current_call()``: what it raised, by name (a
    ``StoreError``), or "committed"."""
    from idemkey import current_call

    try:
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key="open-3"))
            fenced(session, current_call())
    except StoreError as exc:  # anything else (LookupError before) fails the request
        return type(exc).__name__
    return "committed"


def nothing_committed(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(CHARGES)).scalar() == 0


def test_current_call_under_an_unprotected_run_refuses_fenced_work(engine: sa.Engine) -> None:
    """``fenced(session, current_call())``, the idiom of ``@idempotent`` functions and HTTP
    handlers, under ``on_store_error="open"`` with Redis down: ``UnprotectedCallError`` (a
    ``StoreError``), as ``fenced(session, call)`` in a guard block; before, ``LookupError``.
    The transaction rolls back; no call stays current after the function or the request (a
    thread serves the next request in the same context)."""
    import json

    from flask import Flask
    from werkzeug.test import Client

    from idemkey import current_call, idempotent
    from idemkey.adapters.flask import Idemkey
    from idemkey.adapters.wsgi import IdempotencyMiddleware as WsgiMiddleware
    from idemkey.errors import UnprotectedCallError
    from tests._servers import free_port, no_retry

    dead = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=no_retry())
    store = RedisStore(dead, Policy(on_store_error="open"), effects=Effects(engine))
    app = Flask(__name__)
    idem = Idemkey(app, store=store)

    @app.post("/charges")
    @idem.idempotent
    def create() -> tuple[dict[str, str], int]:
        return {"raised": unprotected_work(engine)}, 500

    def wsgi_app(environ: Any, start_response: Any) -> list[bytes]:
        start_response("500 Internal Server Error", [("Content-Type", "application/json")])
        return [json.dumps({"raised": unprotected_work(engine)}).encode()]

    def streaming_app(environ: Any, start_response: Any) -> Iterator[bytes]:
        # A generator app: its work runs while the server iterates the body.
        start_response("500 Internal Server Error", [("Content-Type", "application/json")])
        yield json.dumps({"raised": unprotected_work(engine)}).encode()

    @idempotent(store, key=lambda order: order, name="book")
    def book(order: str) -> str:
        return unprotected_work(engine)

    headers = {"Idempotency-Key": "k", "Content-Type": "application/json"}
    try:
        assert book("o-1") == UnprotectedCallError.__name__
        with pytest.raises(LookupError):
            current_call()  # nothing stays current after the function
        for web in (
            app.test_client(),
            Client(WsgiMiddleware(wsgi_app, store)),
            Client(WsgiMiddleware(streaming_app, store)),
        ):
            reply = web.post("/charges", data=b"{}", headers=headers)
            assert reply.get_json() == {"raised": UnprotectedCallError.__name__}
            reply.close()
            with pytest.raises(LookupError):
                current_call()  # nor after each request (the next one would see it)
    finally:
        store.close()
        dead.close()
    assert nothing_committed(engine)


async def test_asgi_current_call_under_an_unprotected_run_refuses_fenced_work(
    engine: sa.Engine,
) -> None:
    import json

    import httpx

    from idemkey import current_call
    from idemkey.adapters.asgi import IdempotencyMiddleware as AsgiMiddleware
    from idemkey.errors import UnprotectedCallError
    from tests._servers import free_port, no_async_retry

    dead = redis.asyncio.Redis(port=free_port(), socket_connect_timeout=1, retry=no_async_retry())
    store = AsyncRedisStore(dead, Policy(on_store_error="open"))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        body = json.dumps({"raised": unprotected_work(engine)}).encode()
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": body})

    transport = httpx.ASGITransport(app=AsgiMiddleware(app, store))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as web:
            reply = await web.post("/c", content=b"{}", headers={"Idempotency-Key": "k-a"})
        assert reply.json() == {"raised": UnprotectedCallError.__name__}
        with pytest.raises(LookupError):
            current_call()  # httpx ran the app in this task: nothing stays current
    finally:
        await store.aclose()
        await dead.aclose()
    assert nothing_committed(engine)


def test_django_current_call_under_an_unprotected_run_refuses_fenced_work(
    engine: sa.Engine, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/sql/_django_urls.py's view fences ``current_call()``: its UnprotectedCallError
    comes out of the view (Django's test client raises it), and no call stays current."""
    pytest.importorskip("django")
    from django.test import Client as DjangoClient
    from django.test.utils import override_settings

    from idemkey import current_call
    from idemkey.errors import UnprotectedCallError
    from tests._servers import free_port, no_retry
    from tests.adapters.harness_wsgi import _django

    _django()  # configure Django once per process, the way the adapter suite does
    monkeypatch.setenv("TRUTH_DB_URL", db_url)
    dead = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=no_retry())
    store = RedisStore(dead, Policy(on_store_error="open"))
    try:
        with (
            override_settings(
                ROOT_URLCONF="tests.sql._django_urls",
                MIDDLEWARE=["idemkey.adapters.django.IdempotencyMiddleware"],
                ALLOWED_HOSTS=["*"],
                IDEMKEY={"STORE": store, "GUARD": "all"},
            ),
            pytest.raises(UnprotectedCallError),
        ):
            DjangoClient().post("/charges", data=b"{}", content_type="application/json",
                                headers={"Idempotency-Key": "order-1"})  # fmt: skip
        with pytest.raises(LookupError):
            current_call()
    finally:
        store.close()
        dead.close()
    assert nothing_committed(engine)
