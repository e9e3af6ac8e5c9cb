"""The fenced HTTP apps of tests/sql/test_http_truth.py, served by real servers.

``gunicorn tests.sql._http_app:flask_app`` and ``uvicorn tests.sql._http_app:fastapi_app``,
configured by the environment: ``TRUTH_REDIS_URL``, ``TRUTH_PREFIX``, ``TRUTH_DB_URL``
(sync driver URL), ``TRUTH_LEASE`` (seconds) and, for a staged crash, ``TRUTH_FAULT`` with
``TRUTH_FAULT_ONCE`` (a file: the fault strikes once, when the file does not exist yet):

* ``kill-before-complete``: the process SIGKILLs itself when the response is about to
  complete in Redis (after the handler's commit and after its response went into the row);
* ``kill-before-record``: it SIGKILLs itself when the response is about to be written into
  the committed row (the commit is done, nothing else is).

Each handler is the documented fenced pattern (docs/effects.md): one business row in
``charges`` and ``fenced()`` in one transaction, answered 201 with a body of its own.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
import sqlalchemy as sa
from fastapi import FastAPI
from flask import Flask
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from idemkey import AsyncRedisStore, Policy, RedisStore, current_call
from idemkey.adapters.fastapi import Idempotency, IdempotentRoute
from idemkey.adapters.flask import Idemkey
from idemkey.contrib.sqlalchemy import AsyncEffects, Effects, afenced, fenced

CHARGES = sa.table("charges", sa.column("key"), sa.column("fence"), sa.column("worker"))
ENV = os.environ


def _strike(fault: str) -> None:
    """Die here (SIGKILL: no cleanup, no finally) when this is the staged fault, once."""
    once = Path(ENV.get("TRUTH_FAULT_ONCE", "/nonexistent/never"))
    if ENV.get("TRUTH_FAULT") == fault and not once.exists():
        once.write_text("struck")
        os.kill(os.getpid(), signal.SIGKILL)


class Store(RedisStore):
    def complete(self, *args: Any, **kwargs: Any) -> bool:
        _strike("kill-before-complete")
        return super().complete(*args, **kwargs)


class AsyncStore(AsyncRedisStore):
    async def complete(self, *args: Any, **kwargs: Any) -> bool:
        _strike("kill-before-complete")
        return await super().complete(*args, **kwargs)


class DyingEffects(Effects):
    def record(self, *args: Any, **kwargs: Any) -> bool:
        _strike("kill-before-record")
        return super().record(*args, **kwargs)


class AsyncDyingEffects(AsyncEffects):
    async def record(self, *args: Any, **kwargs: Any) -> bool:
        _strike("kill-before-record")
        return await super().record(*args, **kwargs)


def _policy() -> Policy:
    lease = float(ENV.get("TRUTH_LEASE", "30"))
    return Policy(prefix=ENV["TRUTH_PREFIX"], lease=lease, wait=lease * 4)


def _async_url(url: str) -> str:
    return url.replace("sqlite://", "sqlite+aiosqlite://", 1) if url.startswith("sqlite") else url


def make_flask_app() -> Flask:
    engine = sa.create_engine(ENV["TRUTH_DB_URL"])
    store = Store(
        redis.Redis.from_url(ENV["TRUTH_REDIS_URL"]), _policy(), effects=DyingEffects(engine)
    )
    app = Flask(__name__)
    app.config["TRUTH_STORE"], app.config["TRUTH_ENGINE"] = store, engine  # a test closes them
    idem = Idemkey(app, store=store)

    @app.get("/health")
    def health() -> str:
        return "ok"

    @app.post("/charges")
    @idem.idempotent
    def create_charge() -> tuple[dict[str, Any], int]:
        call = current_call()
        with Session(engine) as session, session.begin():
            session.execute(
                sa.insert(CHARGES).values(key="flask", fence=call.fence, worker=os.getpid())
            )
            fenced(session, call)
        return {"charge": "flask", "worker": os.getpid()}, 201

    return app


def make_fastapi_app() -> FastAPI:
    engine = create_async_engine(_async_url(ENV["TRUTH_DB_URL"]))
    client = redis.asyncio.Redis.from_url(ENV["TRUTH_REDIS_URL"])
    store = AsyncStore(client, _policy(), effects=AsyncDyingEffects(engine))
    idem = Idempotency(store)
    app = FastAPI()
    app.state.truth_store, app.state.truth_engine = store, engine  # a test closes them
    app.router.route_class = IdempotentRoute

    @app.get("/health")
    async def health() -> str:
        return "ok"

    @app.post("/charges", status_code=201, dependencies=[idem.guard()])
    async def create_charge() -> dict[str, Any]:
        call = current_call()
        async with AsyncSession(engine) as session, session.begin():
            insert = sa.insert(CHARGES).values(key="fastapi", fence=call.fence, worker=os.getpid())
            await session.execute(insert)
            await afenced(session, call)
        return {"charge": "fastapi", "worker": os.getpid()}

    return app


# Built on import by the servers only (the tests import the factories).
if "TRUTH_DB_URL" in ENV:
    flask_app = make_flask_app()
    fastapi_app = make_fastapi_app()
