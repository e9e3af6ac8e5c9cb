"""The Flask app (with the extension) that test_gunicorn.py serves with gunicorn.

``gunicorn 'tests.adapters.gunicorn_app:create_app()'`` with ``IDEMKEY_TEST_REDIS_URL`` and
``IDEMKEY_TEST_PREFIX`` in the environment. Workers are processes, so the handler counts its
runs in Redis (INCR), where the test can read them.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from flask import Flask, request

from idemkey.adapters.flask import Idemkey

idem = Idemkey()


def create_app() -> Flask:
    url = os.environ["IDEMKEY_TEST_REDIS_URL"]
    prefix = os.environ["IDEMKEY_TEST_PREFIX"]
    app = Flask(__name__)
    app.config.update(IDEMKEY_REDIS_URL=url, IDEMKEY_PREFIX=prefix, IDEMKEY_LEASE=10.0)
    idem.init_app(app)
    counter = redis.Redis.from_url(url)

    @app.get("/health")
    def health() -> str:
        return "ok"

    @app.post("/charges")
    @idem.idempotent
    def charges() -> Any:
        key = request.headers["Idempotency-Key"]
        run = counter.incr(f"{prefix}:runs:{key}")
        amount = (request.get_json() or {})["amount"]
        return {"key": key, "amount": amount, "run": run, "pid": os.getpid()}, 201

    return app
