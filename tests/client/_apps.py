"""The payments endpoint the client tests call, behind each idemkey adapter.

One handler, three shells: the Flask extension (:func:`flask_app`), the WSGI middleware around
a bare WSGI app (:func:`wsgi_app`), and the ASGI middleware around a bare ASGI app
(:func:`asgi_app`). ``gunicorn 'tests.client._apps:wsgi_app()'`` and uvicorn load them by
name; the Redis URL and key prefix come from ``IDEMKEY_TEST_REDIS_URL`` and
``IDEMKEY_TEST_PREFIX``.

``POST /charges?call=<id>[&sleep=<seconds>]``: the ``call`` id names one *logical* call (so a
plain client that sends a new key per attempt still counts against the same call). The handler

* answers ``503`` with ``Retry-After: 1`` without doing anything if the test set
  ``{prefix}:shed:<id>`` (a load-shedding server; idemkey releases the key on a 5xx);
* otherwise counts an execution (``INCR {prefix}:runs:<id>``), sleeps ``sleep`` seconds (a
  slow payment provider), and answers ``201`` with a fresh charge id, the run number and the
  SHA-256 of the body it received; the first execution's answer is kept at
  ``{prefix}:first:<id>`` so a test can check that the client got exactly that one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
import uuid
from collections.abc import Iterable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

import redis
import redis.asyncio

from idemkey import AsyncRedisStore, Policy, RedisStore

LEASE = 10.0


def _settings() -> tuple[str, str]:
    return os.environ["IDEMKEY_TEST_REDIS_URL"], os.environ["IDEMKEY_TEST_PREFIX"]


def _answer(run: int, body: bytes) -> bytes:
    charge = {"charge": uuid.uuid4().hex, "run": run, "sha256": hashlib.sha256(body).hexdigest()}
    return json.dumps(charge).encode()


def _query(raw: str) -> tuple[str, float]:
    query = parse_qs(raw)
    return query.get("call", [""])[0], float(query.get("sleep", ["0"])[0])


def charge(client: redis.Redis, prefix: str, raw_query: str, body: bytes) -> tuple[int, bytes]:
    """The handler: ``(status, body)``; see the module docstring."""
    call, sleep = _query(raw_query)
    if client.getdel(f"{prefix}:shed:{call}"):
        return 503, b"busy"
    run = int(client.incr(f"{prefix}:runs:{call}"))
    time.sleep(sleep)
    answer = _answer(run, body)
    client.set(f"{prefix}:first:{call}", answer, nx=True, ex=600)
    return 201, answer


async def acharge(
    client: redis.asyncio.Redis, prefix: str, raw_query: str, body: bytes
) -> tuple[int, bytes]:
    call, sleep = _query(raw_query)
    if await client.getdel(f"{prefix}:shed:{call}"):
        return 503, b"busy"
    run = int(await client.incr(f"{prefix}:runs:{call}"))
    await asyncio.sleep(sleep)
    answer = _answer(run, body)
    await client.set(f"{prefix}:first:{call}", answer, nx=True, ex=600)
    return 201, answer


def _headers(status: int, body: bytes) -> list[tuple[str, str]]:
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    if status == 503:
        headers = [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))]
        headers.append(("Retry-After", "1"))
    return headers


def flask_app(url: str | None = None, prefix: str | None = None) -> Any:
    """The Flask extension guarding the handler."""
    from flask import Flask, request

    from idemkey.adapters.flask import Idemkey

    if url is None or prefix is None:
        url, prefix = _settings()
    client = redis.Redis.from_url(url)
    app = Flask(__name__)
    app.config.update(IDEMKEY_REDIS_URL=url, IDEMKEY_PREFIX=prefix, IDEMKEY_LEASE=LEASE)
    idem = Idemkey(app)

    @app.get("/health")
    def health() -> str:
        return "ok"

    @app.post("/charges")
    @idem.idempotent
    def charges() -> Any:
        status, body = charge(client, prefix, request.query_string.decode(), request.get_data())
        return body, status, _headers(status, body)

    return app


def wsgi_app(url: str | None = None, prefix: str | None = None) -> Any:
    """The WSGI middleware around a bare WSGI app."""
    from idemkey.adapters.wsgi import IdempotencyMiddleware

    if url is None or prefix is None:
        url, prefix = _settings()
    client = redis.Redis.from_url(url)

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] != "POST":
            start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
            return [b"ok"]
        length = int(environ.get("CONTENT_LENGTH") or 0)
        data = environ["wsgi.input"].read(length)
        status, body = charge(client, prefix, environ.get("QUERY_STRING", ""), data)
        start_response(f"{status} {'Created' if status == 201 else 'Busy'}", _headers(status, body))
        return [body]

    store = RedisStore(redis.Redis.from_url(url), Policy(prefix=prefix, lease=LEASE))
    return IdempotencyMiddleware(app, store)


def asgi_app(url: str | None = None, prefix: str | None = None) -> Any:
    """The ASGI middleware around a bare ASGI app."""
    from idemkey.adapters.asgi import IdempotencyMiddleware

    if url is None or prefix is None:
        url, prefix = _settings()
    client = redis.asyncio.Redis.from_url(url)

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":
            ok = [(b"content-type", b"text/plain"), (b"content-length", b"2")]
            await send({"type": "http.response.start", "status": 200, "headers": ok})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        data = b""
        while True:
            message = await receive()
            data += message.get("body", b"")
            if not message.get("more_body"):
                break
        query = scope.get("query_string", b"").decode()
        status, body = await acharge(client, prefix, query, data)
        headers = [(n.lower().encode(), v.encode()) for n, v in _headers(status, body)]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    store = AsyncRedisStore(redis.asyncio.Redis.from_url(url), Policy(prefix=prefix, lease=LEASE))
    return IdempotencyMiddleware(app, store)
