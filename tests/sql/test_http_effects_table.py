"""HTTP handlers and the store's Effects, as guards have them (test_effects_table_and_lost.py).

* A custom effects table (``Effects(engine, table=effects_table(md, name=...))``): ``fenced()``
  without ``table=`` in a handler under the WSGI middleware or the Flask extension wrote
  ``idemkey_effects``, since an HTTP handler's call did not know its store; after Redis forgot,
  the retry found no row in the store's table and ran the handler again.
* Redis lost the record after the handler's fenced row committed: the ``lease_lost`` event
  said "a retry runs the work again", false: the row holds the effect and the response.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from flask import Flask
from sqlalchemy.orm import Session
from werkzeug.test import Client

from idemkey import Policy, RedisStore, current_call
from idemkey.adapters.flask import Idemkey
from idemkey.adapters.wsgi import IdempotencyMiddleware as WsgiMiddleware
from idemkey.contrib.sqlalchemy import Effects, effects_table, fenced
from tests.sql.conftest import CHARGES
from tests.sql.test_effects_table_and_lost import charged, forget

pytestmark = pytest.mark.redis

KEYED = {"Idempotency-Key": "http-t", "Content-Type": "application/json"}


@pytest.fixture
def custom(engine: sa.Engine) -> Iterator[sa.Table]:
    table = effects_table(sa.MetaData(), name="my_http_effects")
    table.drop(engine, checkfirst=True)
    table.create(engine)
    yield table
    table.drop(engine, checkfirst=True)


def handler(engine: sa.Engine, key: str, runs: list[int], lose: Any = None) -> bytes:
    """The documented fenced pattern, ``table=`` left out; ``lose`` runs after the commit."""
    call = current_call()
    runs.append(1)
    with Session(engine) as session, session.begin():
        session.execute(sa.insert(CHARGES).values(key=key, fence=call.fence, worker=len(runs)))
        fenced(session, call)
    if lose is not None:
        lose()
    return json.dumps({"run": len(runs)}).encode()


def rows(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() or 0)


def wsgi_client(store: RedisStore, engine: sa.Engine, runs: list[int], lose: Any = None) -> Client:
    def app(environ: Any, start_response: Any) -> list[bytes]:
        body = handler(engine, "wsgi", runs, lose)
        start_response("201 Created", [("Content-Type", "application/json")])
        return [body]

    return Client(WsgiMiddleware(app, store))


def flask_client(store: RedisStore, engine: sa.Engine, runs: list[int]) -> Client:
    app = Flask(__name__)
    idem = Idemkey(app, store=store)

    @app.post("/w")
    @idem.idempotent
    def create() -> tuple[bytes, int]:
        return handler(engine, "flask", runs), 201

    return Client(app)


@pytest.mark.parametrize("make", [wsgi_client, flask_client], ids=["wsgi", "flask"])
def test_a_handler_fences_in_the_store_effects_table_and_replays_after_redis_forgot(
    real_client: redis.Redis, prefix: str, engine: sa.Engine, custom: sa.Table, make: Any
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix), effects=Effects(engine, table=custom))
    runs: list[int] = []
    web = make(store, engine, runs)
    try:
        first = web.post("/w", data=b"{}", headers=KEYED)
        assert first.status_code == 201, first.get_data()
        body = first.get_data()
        first.close()  # the WSGI iterable's end: the record completes here
        forget(real_client, prefix)
        again = web.post("/w", data=b"{}", headers=KEYED)
        assert again.status_code == 201, again.get_data()
        assert again.get_data() == body
        assert again.headers["Idempotent-Replayed"] == "true"
        again.close()
        assert runs == [1]
        assert rows(engine, custom) == 1
        assert rows(engine, effects_table()) == 0
    finally:
        store.close()


def test_lease_lost_after_a_handler_committed_says_the_effect_committed(
    real_client: redis.Redis, prefix: str, engine: sa.Engine
) -> None:
    events: list[Any] = []
    policy = Policy(prefix=prefix, on_event=events.append)
    store = RedisStore(real_client, policy, effects=Effects(engine))
    runs: list[int] = []
    web = wsgi_client(store, engine, runs, lose=lambda: forget(real_client, prefix))
    try:
        first = web.post("/w", data=b"{}", headers=KEYED)
        assert first.status_code == 201, first.get_data()
        body = first.get_data()
        first.close()
        [event] = [e for e in events if e.kind == "lease_lost"]
        assert "committed in the database with its result" in event.detail
        assert "a retry replays it" in event.detail
        assert "nothing of this run is stored" not in event.detail
        assert "a retry runs the work again" not in event.detail
        again = web.post("/w", data=b"{}", headers=KEYED)
        assert again.get_data() == body
        assert again.headers["Idempotent-Replayed"] == "true"
        again.close()
        assert runs == [1]
        assert charged(engine, "wsgi") == [1]
    finally:
        store.close()


async def test_an_asgi_handler_fences_in_the_store_effects_table(
    real_async_client: Any,
    real_client: redis.Redis,
    prefix: str,
    engine: sa.Engine,
    db_url: str,
    custom: sa.Table,
) -> None:
    """The asyncio driver's twin: afenced() in an ASGI app, the table left out."""
    import httpx
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    from idemkey import AsyncRedisStore
    from idemkey.adapters.asgi import IdempotencyMiddleware as AsgiMiddleware
    from idemkey.contrib.sqlalchemy import AsyncEffects, afenced
    from tests.sql.conftest import async_url

    aengine = create_async_engine(async_url(db_url))
    store = AsyncRedisStore(
        real_async_client, Policy(prefix=prefix), effects=AsyncEffects(aengine, table=custom)
    )
    runs: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        call = current_call()
        runs.append(1)
        async with AsyncSession(aengine) as session, session.begin():
            await session.execute(sa.insert(CHARGES).values(key="asgi", fence=call.fence))
            await afenced(session, call)
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"asgi order"})

    transport = httpx.ASGITransport(app=AsgiMiddleware(app, store))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as web:
            first = await web.post("/a", content=b"{}", headers=KEYED)
            assert first.status_code == 201, first.text
            forget(real_client, prefix)
            again = await web.post("/a", content=b"{}", headers=KEYED)
        assert (again.status_code, again.content) == (201, b"asgi order")
        assert again.headers["Idempotent-Replayed"] == "true"
        assert runs == [1]
        assert rows(engine, custom) == 1
        assert rows(engine, effects_table()) == 0
    finally:
        await store.aclose()
        await aengine.dispose()
