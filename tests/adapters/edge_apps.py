"""Apps that tests/adapters/test_edges*.py serve with real servers (gunicorn, werkzeug, uvicorn).

``IDEMKEY_TEST_REDIS_URL`` and ``IDEMKEY_TEST_PREFIX`` come from the environment. Every handler
counts its runs in Redis (``INCR {prefix}:runs:<key>``), where the test reads them, since the
server runs in another process. Each answers JSON naming what it saw of the body.

Run with werkzeug's own server: ``python -m idemkey_edge_apps <flask|wsgi> <port>`` (the copy
edge_servers.py makes of this file).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio
from flask import Flask, request

from idemkey import AsyncRedisStore, Policy, RedisStore
from idemkey.adapters.asgi import IdempotencyMiddleware as AsgiMiddleware
from idemkey.adapters.flask import Idemkey
from idemkey.adapters.wsgi import IdempotencyMiddleware
from idemkey.routes import Routes, route

if TYPE_CHECKING:
    from collections.abc import Iterable

    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from idemkey.adapters.asgi import Receive, Scope, Send


def _settings() -> tuple[str, str]:
    return os.environ["IDEMKEY_TEST_REDIS_URL"], os.environ["IDEMKEY_TEST_PREFIX"]


def _answer(run: int, body: bytes, **extra: Any) -> bytes:
    digest = hashlib.sha256(body).hexdigest()[:16]
    return json.dumps({"run": run, "size": len(body), "sha": digest, **extra}).encode()


def flask_app() -> Flask:
    """The Flask extension; ``/form`` has a before_request hook that parses ``request.form``
    (as CSRF protection does), ``/stream-read`` one that reads ``request.stream`` first."""
    url, prefix = _settings()
    app = Flask(__name__)
    app.config.update(IDEMKEY_REDIS_URL=url, IDEMKEY_PREFIX=prefix, IDEMKEY_LEASE=10.0)
    idem = Idemkey(app)
    counter = redis.Redis.from_url(url)

    def run() -> int:
        return int(counter.incr(f"{prefix}:runs:{request.headers.get('Idempotency-Key')}"))

    @app.before_request
    def early_readers() -> None:
        if request.path == "/form":
            request.form.get("csrf_token")  # parses (and consumes) the body
        elif request.path == "/stream-read":
            request.stream.read()

    @app.get("/health")
    def health() -> str:
        return "ok"

    @app.post("/form")
    @idem.idempotent
    def form() -> Any:
        return _answer(run(), request.get_data(), amount=request.form.get("amount")), 201

    @app.post("/cafés")
    @app.post("/stream-read")
    @app.post("/charges")
    @idem.idempotent
    def charges() -> Any:
        return _answer(run(), request.get_data()), 201

    @app.post("/json")
    @idem.idempotent(fingerprint="json")
    def as_json() -> Any:
        return _answer(run(), request.get_data()), 201

    def without_nonce(_request: object, body: bytes) -> bytes:
        payload = json.loads(body)
        payload.pop("nonce", None)
        return json.dumps(payload, sort_keys=True).encode()

    @app.post("/nonce")
    @idem.idempotent(fingerprint=without_nonce)
    def with_nonce() -> Any:
        return _answer(run(), request.get_data()), 201

    @app.post("/reason")
    @idem.idempotent
    def reason() -> Any:
        run()
        response = app.response_class(b'{"ok":true}', content_type="application/json")
        response.status = "201 Charged OK"
        response.headers["Location"] = "/charges/1"
        return response

    @app.post("/empty")
    @idem.idempotent
    def empty() -> Any:
        run()
        response = app.response_class(status=204)
        del response.headers["Content-Type"]
        return response

    return app


#: What the ``*_routes`` apps guard: non-ASCII routes, which a WSGI server hands over as
#: PEP 3333's latin-1 text of the path's UTF-8 bytes.
ROUTES = Routes(route("/cafés"), route("/menüs/{item}"))


def wsgi_routes_app() -> IdempotencyMiddleware:
    """:func:`wsgi_app` guarding :data:`ROUTES` only."""
    return wsgi_app(ROUTES)


def asgi_routes_app() -> AsgiMiddleware:
    """:func:`asgi_app` guarding :data:`ROUTES` only."""
    return asgi_app(ROUTES)


#: What the ``*_mounted`` apps guard, served under the prefix ``/api``: a route written relative
#: to the mount and one written with the prefix (tests/adapters/test_root_path.py).
MOUNTED = Routes(route("/charges"), route("/api/refunds"))


def wsgi_mounted_app() -> IdempotencyMiddleware:
    """:func:`wsgi_app` guarding :data:`MOUNTED` only."""
    return wsgi_app(MOUNTED)


def asgi_mounted_app() -> AsgiMiddleware:
    """:func:`asgi_app` guarding :data:`MOUNTED` only."""
    return asgi_app(MOUNTED)


def wsgi_app(routes: Routes | None = None) -> IdempotencyMiddleware:
    """The WSGI middleware around a plain PEP 3333 app."""
    url, prefix = _settings()
    counter = redis.Redis.from_url(url)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if environ["REQUEST_METHOD"] == "GET":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok"]
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        run = int(counter.incr(f"{prefix}:runs:{environ.get('HTTP_IDEMPOTENCY_KEY')}"))
        if path == "/reason":
            start_response("201 Charged OK", [("Content-Type", "application/json")])
            return [b'{"ok":true}']
        if path == "/empty":
            start_response("204 No Content", [("X-Run", str(run))])
            return []
        if path == "/control":  # gunicorn refuses these (500); werkzeug and waitress send them
            data = _answer(run, body)
            start_response(
                "201 Charged\x01OK",
                [("Content-Type", "application/json"), ("X-Note", "a\x01b"), ("X-Del", "a\x7fb")],
            )
            return [data]
        if path == "/big":  # 2 MiB in 8 blocks, declared: over max_response_bytes (1 MiB)
            block = b"x" * (256 * 1024)
            start_response(
                "201 Created",
                [
                    ("Content-Type", "application/octet-stream"),
                    ("Content-Length", str(8 * len(block))),
                ],
            )
            return (block for _ in range(8))
        data = _answer(run, body)
        # Content-Length first and a repeated Link: a replay keeps order and lines as sent.
        start_response(
            "201 Created",
            [
                ("Content-Length", str(len(data))),
                ("Link", "</charges/1>; rel=self"),
                ("Content-Type", "application/json"),
                ("Link", "</receipts/1>; rel=receipt"),
            ],
        )
        return [data]

    store = RedisStore(redis.Redis.from_url(url), Policy(prefix=prefix, lease=10.0))
    return IdempotencyMiddleware(app, store, routes=routes)


def asgi_app(routes: Routes | None = None) -> AsgiMiddleware:
    """The ASGI middleware around a plain ASGI app (uvicorn: ``--factory``)."""
    url, prefix = _settings()
    client = redis.asyncio.Redis.from_url(url)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        status = 201
        if scope["method"] == "GET":
            status, data = 200, b"ok"
        else:
            key = dict(scope["headers"]).get(b"idempotency-key", b"").decode()
            data = _answer(int(await client.incr(f"{prefix}:runs:{key}")), body)
        headers = [
            (b"content-length", b"%d" % len(data)),
            (b"link", b"</charges/1>; rel=self"),
            (b"content-type", b"application/json"),
            (b"link", b"</receipts/1>; rel=receipt"),
        ]
        if scope["path"] == "/empty":
            status, data, headers = 204, b"", [(b"x-run", b"1")]
        elif scope["path"] == "/padded":  # a value h11 refuses to send (uvicorn, hypercorn)
            headers.append((b"x-note", b" padded"))
        elif scope["path"] == "/control":  # h11 sends these (uvicorn, hypercorn), gunicorn 500
            headers += [(b"x-note", b"a\x01b"), (b"x-del", b"a\x7fb")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    store = AsyncRedisStore(client, Policy(prefix=prefix, lease=10.0))
    return AsgiMiddleware(app, store, routes=routes)


def __getattr__(name: str) -> Any:
    """``idemkey_edge_apps:asgi`` (or ``asgi_routes``, ``asgi_mounted``), built on first
    access, for daphne (which takes no factory)."""
    if name in ("asgi", "asgi_routes", "asgi_mounted"):
        app = globals()[name] = globals()[f"{name}_app"]()
        return app
    raise AttributeError(name)


if __name__ == "__main__":  # werkzeug's development server, threaded, as `flask run` uses it
    from werkzeug.serving import run_simple

    kind, port = sys.argv[1], int(sys.argv[2])
    run_simple("127.0.0.1", port, globals()[f"{kind}_app"](), threaded=True)


def shortcl_wsgi_app() -> IdempotencyMiddleware:
    """A WSGI app that declares ``Content-Length: 100`` and sends 19 bytes (a miscounted
    length): tests/adapters/test_short_bodies.py."""
    url, prefix = _settings()
    counter = redis.Redis.from_url(url)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] == "GET":  # the readiness probe
            start_response("200 OK", [("Content-Length", "2")])
            return [b"ok"]
        key = environ.get("HTTP_IDEMPOTENCY_KEY", "")
        run = int(counter.incr(f"{prefix}:runs:{key}"))
        start_response("201 Created", [("Content-Length", "100"), ("Content-Type", "text/x")])
        return [b'{"run":%d,"size":12}' % run]

    store = RedisStore(redis.Redis.from_url(url), Policy(prefix=prefix, lease=10.0))
    return IdempotencyMiddleware(app, store)


def shortcl_asgi_app() -> AsgiMiddleware:
    """The ASGI twin of :func:`shortcl_wsgi_app` (uvicorn: ``--factory``)."""
    url, prefix = _settings()
    client = redis.asyncio.Redis.from_url(url)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        if scope["method"] == "GET":  # the readiness probe
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        key = dict(scope["headers"]).get(b"idempotency-key", b"").decode()
        run = int(await client.incr(f"{prefix}:runs:{key}"))
        headers = [(b"content-length", b"100"), (b"content-type", b"text/x")]
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"run":%d,"size":12}' % run})

    store = AsyncRedisStore(client, Policy(prefix=prefix, lease=10.0))
    return AsgiMiddleware(app, store)
