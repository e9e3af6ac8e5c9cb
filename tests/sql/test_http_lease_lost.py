"""The loser of docs/effects.md ("its successor claims ... one already past its claim gets
LeaseLostError from fenced()"), through a real ``afenced()`` on SQLite: Redis forgets the key
mid-handler, a duplicate claims it and commits; the first handler's ``afenced()`` refuses.
Its client gets the typed 409 ``lease_lost`` problem (not FastAPI's 500), and the retry
replays the duplicate's committed response."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._servers import RedisServer

pytestmark = pytest.mark.redis

KEYED = {"Idempotency-Key": "order-1", "Content-Type": "application/json"}


async def test_a_fastapi_loser_of_fenced_gets_a_typed_409_and_its_retry_replays(
    redis_server_factory: Callable[..., RedisServer], tmp_path: Path
) -> None:
    pytest.importorskip("aiosqlite")
    import redis.asyncio
    from fastapi import FastAPI
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    from idemkey import AsyncRedisStore, Policy, current_call
    from idemkey.adapters.asgi import IdempotencyMiddleware
    from idemkey.contrib.sqlalchemy import AsyncEffects, afenced

    server = redis_server_factory()
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'effects.db'}")
    effects = AsyncEffects(engine)
    await effects.create()
    client = redis.asyncio.Redis.from_url(server.url)
    store = AsyncRedisStore(client, Policy(prefix="lost"), effects=effects)
    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, store=store)  # inside FastAPI's 500 layer
    runs: list[int] = []
    duplicate: list[httpx.Response] = []

    @app.post("/charges", status_code=201)
    async def charge() -> dict[str, Any]:
        runs.append(len(runs) + 1)
        me, call = runs[-1], current_call()
        if me == 1:  # Redis forgets the key; a duplicate claims it and commits first
            await client.flushall()
            duplicate.append(await web.post("/charges", content=b"{}", headers=KEYED))
        async with AsyncSession(engine) as session, session.begin():
            await afenced(session, call)
        return {"by": me}

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as web:
            first = await web.post("/charges", content=b"{}", headers=KEYED)
            retry = await web.post("/charges", content=b"{}", headers=KEYED)
    finally:
        await store.aclose()
        await client.aclose()
        await engine.dispose()
    assert duplicate[0].status_code == 201, duplicate[0].text
    assert first.status_code == 409, first.text
    assert first.headers["content-type"] == "application/problem+json"
    assert first.headers["retry-after"] == "1"
    assert (first.json()["code"], first.json()["retry"]) == ("lease_lost", "same_key")
    assert (retry.status_code, retry.json()) == (201, {"by": 2})
    assert retry.headers["idempotent-replayed"] == "true"
    assert runs == [1, 2]
