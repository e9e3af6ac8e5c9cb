"""HTTP handlers fence their own transactions: ``idemkey.current_call()`` is the request's claim.

Through the Flask extension and the WSGI middleware (werkzeug's test client) and the ASGI
middleware (httpx's ASGI transport), on a real Redis: the handler's fenced transaction commits
once with the claim's fence, a replay does not run it, and no call stays current afterwards.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio
import sqlalchemy as sa
from flask import Flask
from sqlalchemy.orm import Session
from werkzeug.test import Client

from idemkey import AsyncRedisStore, Policy, RedisStore, current_call
from idemkey.adapters.asgi import IdempotencyMiddleware as AsgiMiddleware
from idemkey.adapters.flask import Idemkey
from idemkey.adapters.wsgi import IdempotencyMiddleware as WsgiMiddleware
from idemkey.contrib.sqlalchemy import fenced
from tests.sql.conftest import CHARGES

pytestmark = pytest.mark.redis

KEYED = {"Idempotency-Key": "http-1", "Content-Type": "application/json"}


def charge(engine: sa.Engine) -> bytes:
    """The handler's work: one fenced transaction, whatever the framework."""
    call = current_call()
    with Session(engine) as session, session.begin():
        session.execute(sa.insert(CHARGES).values(key="http", fence=call.fence))
        fenced(session, call)
    return json.dumps({"fence": call.fence}).encode()


def committed(engine: sa.Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(CHARGES.c.key, CHARGES.c.fence))]


def test_flask_and_wsgi_handlers_fence_through_current_call(
    real_client: redis.Redis, prefix: str, engine: sa.Engine
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix))
    app = Flask(__name__)
    idem = Idemkey(app, store=store)

    @app.post("/charges")
    @idem.idempotent
    def create() -> tuple[bytes, int]:
        return charge(engine), 201

    def wsgi_app(environ: Any, start_response: Any) -> list[bytes]:
        start_response("201 Created", [("Content-Type", "application/json")])
        return [charge(engine)]

    fences = []
    for web, path in ((Client(app), "/charges"), (Client(WsgiMiddleware(wsgi_app, store)), "/w")):
        first = web.post(path, data=b"{}", headers=KEYED)
        assert first.status_code == 201, first.get_data()
        fences.append(json.loads(first.get_data())["fence"])
        first.close()  # the WSGI iterable's end: the record completes here
        again = web.post(path, data=b"{}", headers=KEYED)
        assert again.headers["Idempotent-Replayed"] == "true"
    # One per route (each its own record, its own claim's fence), none on replay.
    assert committed(engine) == [("http", fence) for fence in fences]
    with pytest.raises(LookupError):
        current_call()  # nothing stays current after the requests
    store.close()


async def test_asgi_handlers_fence_through_current_call(
    real_async_client: redis.asyncio.Redis, prefix: str, engine: sa.Engine
) -> None:
    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        body = charge(engine)  # a sync engine in a test app is fine; real apps use afenced
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": body})

    transport = httpx.ASGITransport(app=AsgiMiddleware(app, store))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as web:
        first = await web.post("/charges", content=b"{}", headers=KEYED)
        again = await web.post("/charges", content=b"{}", headers=KEYED)
    fence = first.json()["fence"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert committed(engine) == [("http", fence)]
    await store.aclose()
