"""The apps tests/steps/test_failures_http.py serves with real servers (uvicorn, gunicorn).

A declared failure (``CardDeclined``) is rendered by the framework's own exception handler as a
402, a transient one (``ConnectionError``) as a 503. Every handler run is counted in Redis
(``INCR {prefix}:runs:<Idempotency-Key>``). Served as a top-level module copied next to the
log (see the test), so idemkey comes from PYTHONPATH.
"""

from __future__ import annotations

import os
from typing import Any

import redis
import redis.asyncio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from flask import Flask
from flask import request as flask_request

from idemkey import AsyncRedisStore, Policy
from idemkey.adapters.fastapi import Idempotency, IdempotentRoute
from idemkey.adapters.flask import Idemkey


class CardDeclined(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(f"card declined: {code}")
        self.code = code


def _settings() -> tuple[str, str]:
    return os.environ["IDEMKEY_TEST_REDIS_URL"], os.environ["IDEMKEY_TEST_PREFIX"]


def fastapi_app() -> FastAPI:
    url, prefix = _settings()
    client = redis.asyncio.Redis.from_url(url)
    # wait: a retry sent while the 503's release is still on its way waits for it (rather than
    # a 409 in flight), as a client retrying at once would want.
    policy = Policy(prefix=prefix, scope=lambda _: "t", wait=5)
    idem = Idempotency(AsyncRedisStore(client, policy))
    app = FastAPI()
    app.router.route_class = IdempotentRoute

    @app.exception_handler(CardDeclined)
    async def declined(request: Request, exc: CardDeclined) -> JSONResponse:
        return JSONResponse({"error": str(exc), "code": exc.code}, status_code=402)

    @app.exception_handler(ConnectionError)
    async def unavailable(request: Request, exc: ConnectionError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=503)

    @app.get("/health")
    async def health() -> str:
        return "ok"

    @app.post("/charges", dependencies=[idem.guard()])
    async def charge(request: Request, card: str) -> dict[str, Any]:
        key = request.headers.get("idempotency-key")
        runs = int(await client.incr(f"{prefix}:runs:{key}"))
        if card == "declined":
            raise CardDeclined("insufficient_funds")
        if card == "flaky" and runs == 1:
            raise ConnectionError("the PSP timed out")
        return {"charged": True, "runs": runs}

    return app


def flask_app() -> Flask:
    url, prefix = _settings()
    app = Flask(__name__)
    app.config.update(IDEMKEY_REDIS_URL=url, IDEMKEY_PREFIX=prefix)
    idem = Idemkey(app, policy=Policy(prefix=prefix, scope=lambda _: "t", wait=5))
    counter = redis.Redis.from_url(url)

    @app.errorhandler(CardDeclined)
    def declined(exc: CardDeclined) -> Any:
        return {"error": str(exc), "code": exc.code}, 402

    @app.errorhandler(ConnectionError)
    def unavailable(exc: ConnectionError) -> Any:
        return {"error": str(exc)}, 503

    @app.get("/health")
    def health() -> str:
        return "ok"

    @app.post("/charges")
    @idem.idempotent
    def charge() -> Any:
        key = flask_request.headers.get("Idempotency-Key")
        runs = int(counter.incr(f"{prefix}:runs:{key}"))
        card = flask_request.args["card"]
        if card == "declined":
            raise CardDeclined("insufficient_funds")
        if card == "flaky" and runs == 1:
            raise ConnectionError("the PSP timed out")
        return {"charged": True, "runs": runs}

    return app
