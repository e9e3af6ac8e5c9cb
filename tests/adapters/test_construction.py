"""The integrations refuse a wrong argument when the app is built, not at its first request.

On main, every middleware and integration took any object for its store, policy and routes:
an AsyncRedisStore under the WSGI middleware or Flask answered its first keyed request with a
500 (an AssertionError, a coroutine never awaited), a sync RedisStore under ASGI, FastAPI or
Starlette a 500 on every request (``object Claimed can't be used in 'await' expression``), a raw
redis client an AttributeError (``'Redis' object has no attribute 'policy'``), ``policy={...}``
and ``routes=[route(...)]`` an AttributeError. Each is a ConfigurationError now, raised by the
constructor, naming the parameter and what it takes. Flask's ``IDEMKEY_REDIS_*`` keys other
than ``IDEMKEY_REDIS_URL`` were accepted and never read (a password, a database, a timeout
silently dropped), and a non-str ``IDEMKEY_REDIS_URL`` was an AttributeError.

No Redis is needed: a store is built on a client of a dead URL, which no check reaches.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio
from flask import Flask

from idemkey import AsyncRedisStore, ConfigurationError, Policy, RedisStore
from idemkey.routes import Routes, exempt, route

DEAD = "redis://127.0.0.1:1/0"


def sync_store() -> RedisStore:
    return RedisStore(redis.Redis.from_url(DEAD))


def async_store() -> AsyncRedisStore:
    return AsyncRedisStore(redis.asyncio.Redis.from_url(DEAD))


def wsgi(store: object, policy: object = None, routes: object = None) -> object:
    from idemkey.adapters.wsgi import IdempotencyMiddleware

    return IdempotencyMiddleware(lambda e, s: [], store, policy, routes=routes)  # type: ignore[arg-type]


def asgi(store: object, policy: object = None, routes: object = None) -> object:
    from idemkey.adapters.asgi import IdempotencyMiddleware

    async def app(scope: Any, receive: Any, send: Any) -> None: ...

    return IdempotencyMiddleware(app, store, policy, routes=routes)  # type: ignore[arg-type]


def fastapi(store: object, policy: object = None) -> object:
    from idemkey.adapters.fastapi import Idempotency

    return Idempotency(store, policy)  # type: ignore[arg-type]


def starlette(store: object, policy: object = None) -> object:
    from idemkey.adapters.starlette import Idempotency

    return Idempotency(store, policy)  # type: ignore[arg-type]


def flask(store: object, policy: object = None) -> object:
    from idemkey.adapters.flask import Idemkey

    return Idemkey(store=store, policy=policy)  # type: ignore[arg-type]


def flask_init_app(store: object, policy: object = None) -> object:
    from idemkey.adapters.flask import Idemkey

    app = Flask("construction")
    app.config["IDEMKEY_REDIS_URL"] = DEAD
    Idemkey(policy=policy).init_app(app, store=store)  # type: ignore[arg-type]
    return app


Build = Callable[..., object]
SYNC: dict[str, tuple[Build, str]] = {
    "wsgi": (wsgi, "IdempotencyMiddleware"),
    "flask": (flask, "Idemkey"),
    "flask-init_app": (flask_init_app, "init_app"),
}
ASYNC: dict[str, tuple[Build, str]] = {
    "asgi": (asgi, "IdempotencyMiddleware"),
    "fastapi": (fastapi, "Idempotency"),
    "starlette": (starlette, "Idempotency"),
}
EVERY = {**SYNC, **ASYNC}


@pytest.mark.parametrize("name", SYNC)
def test_a_sync_integration_refuses_an_async_store_and_a_raw_client(name: str) -> None:
    build, call = SYNC[name]
    with pytest.raises(ConfigurationError) as raised:
        build(async_store())
    said = str(raised.value)
    assert said.startswith(f"{call}(store=...): expected an idemkey.RedisStore, got an Async")
    assert "RedisStore(redis.Redis(" in said  # what to build instead
    with pytest.raises(ConfigurationError, match=re.escape(f"{call}(store=...)")) as raised:
        build(redis.Redis.from_url(DEAD))
    assert "a Redis client (redis.client.Redis), not a store: pass RedisStore(client)" in str(
        raised.value
    )
    build(sync_store())  # the right kind is taken


@pytest.mark.parametrize("name", ASYNC)
def test_an_async_integration_refuses_a_sync_store_and_a_raw_client(name: str) -> None:
    build, call = ASYNC[name]
    with pytest.raises(ConfigurationError) as raised:
        build(sync_store())
    said = str(raised.value)
    assert said.startswith(f"{call}(store=...): expected an idemkey.AsyncRedisStore, got a Redis")
    assert "AsyncRedisStore(redis.asyncio.Redis(" in said
    with pytest.raises(ConfigurationError, match=re.escape("not a store: pass AsyncRedisStore(")):
        build(redis.asyncio.Redis.from_url(DEAD))
    build(async_store())


@pytest.mark.parametrize("name", EVERY)
def test_a_policy_that_is_no_policy_is_refused(name: str) -> None:
    build, call = EVERY[name]
    store = sync_store() if name in SYNC else async_store()
    with pytest.raises(ConfigurationError) as raised:
        build(store, {"ttl": 5})
    call = "Idemkey" if call == "init_app" else call  # the policy is the constructor's
    said = str(raised.value)
    assert said.startswith(f"{call}(policy=...): expected an idemkey.Policy or None, got dict")
    build(store, Policy(ttl=60))


@pytest.mark.parametrize("name", ["wsgi", "asgi"])
@pytest.mark.parametrize(
    ("routes", "says"),
    [
        ([route("/charges")], "got list: write routes=Routes(*[...])"),
        (route("/charges"), "got a single route: write routes=Routes(route(...))"),
        (exempt("/login"), "got a single route: write routes=Routes(route(...))"),
        ("/charges", "got the string '/charges': write routes=Routes('/charges')"),
        ({"/charges": {}}, "got dict: build one, Routes(route('/charges', ttl=60), ...)"),
    ],
    ids=["list", "route", "exempt", "str", "dict"],
)
def test_routes_that_are_no_routes_are_refused_naming_routes(
    name: str, routes: object, says: str
) -> None:
    build, _ = EVERY[name]
    store = sync_store() if name == "wsgi" else async_store()
    with pytest.raises(ConfigurationError) as raised:
        build(store, routes=routes)
    expected = f"IdempotencyMiddleware(routes=...): expected a Routes(...) or None, {says}"
    assert str(raised.value) == expected
    build(store, routes=Routes("/charges", route("/refunds", ttl=60), exempt("/login")))


def flask_config(**config: object) -> object:
    from idemkey.adapters.flask import Idemkey

    app = Flask("config")
    app.config.update(config)
    return Idemkey(app)


@pytest.mark.parametrize("key", ["IDEMKEY_REDIS_PASSWORD", "IDEMKEY_REDIS_DB", "IDEMKEY_REDIS_X"])
def test_a_flask_redis_key_idemkey_does_not_read_is_refused(key: str) -> None:
    # Each was accepted and silently unused: the client ran without the password, on db 0.
    with pytest.raises(ConfigurationError) as raised:
        flask_config(IDEMKEY_REDIS_URL=DEAD, **{key: "3"})
    said = str(raised.value)
    assert said.startswith(f"{key} (Flask config): not a key idemkey reads; the only "), said
    assert "IDEMKEY_REDIS_URL" in said
    assert "redis://:password@host:6379/0" in said


def test_a_flask_redis_key_is_refused_with_a_store_given_too() -> None:
    from idemkey.adapters.flask import Idemkey

    app = Flask("config")
    app.config["IDEMKEY_REDIS_SOCKET_TIMEOUT"] = 5
    with pytest.raises(ConfigurationError, match=r"IDEMKEY_REDIS_SOCKET_TIMEOUT \(Flask config\)"):
        Idemkey(app, store=sync_store())


@pytest.mark.parametrize("url", [6379, b"redis://127.0.0.1:1/0", ["redis://127.0.0.1:1/0"]])
def test_a_flask_redis_url_that_is_no_string_is_refused(url: object) -> None:
    with pytest.raises(ConfigurationError) as raised:
        flask_config(IDEMKEY_REDIS_URL=url)
    assert str(raised.value).startswith(
        f"IDEMKEY_REDIS_URL (Flask config): expected a URL string, got {type(url).__name__}"
    )
    flask_config(IDEMKEY_REDIS_URL=DEAD)  # a str is taken


# ---- a scope function that returns no str: a problem answer, not a traceback ---------------
# Its result is known only per request, so this one is answered, not refused at construction:
# on main, the ConfigurationError left the middleware (a 500 with a traceback, the server's
# own error page), as a Django SCOPE returning None for an anonymous user did.

NOT_STR = {"None": None, "int": 42, "bytes": b"tenant-1"}


def _wsgi_call(
    store: RedisStore, scope: Callable[..., object]
) -> tuple[str, dict[str, str], bytes, int]:
    from idemkey.adapters.wsgi import IdempotencyMiddleware
    from tests.adapters.harness_wsgi import environ_for

    runs: list[int] = []

    def app(environ: Any, start_response: Any) -> list[bytes]:
        runs.append(1)
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [b"made"]

    middleware = IdempotencyMiddleware(app, store, store.policy.replace(scope=scope))
    sent: dict[str, Any] = {}

    def start_response(
        status: str, headers: list[tuple[str, str]], exc_info: object = None
    ) -> None:
        sent.update(status=status, headers=dict(headers))

    environ = environ_for("POST", "/charges", [("Idempotency-Key", "k-1")], b"{}")
    body = b"".join(middleware(environ, start_response))
    return sent["status"], sent["headers"], body, len(runs)


async def _asgi_call(
    store: AsyncRedisStore, scope: Callable[..., object]
) -> tuple[int, dict[str, str], bytes, int]:
    from idemkey.adapters.asgi import IdempotencyMiddleware

    runs: list[int] = []

    async def app(asgi_scope: Any, receive: Any, send: Any) -> None:
        runs.append(1)
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"made"})

    middleware = IdempotencyMiddleware(app, store, store.policy.replace(scope=scope))
    messages: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    http = {"type": "http", "method": "POST", "path": "/charges", "query_string": b"",
            "headers": [(b"idempotency-key", b"k-1")]}  # fmt: skip
    await middleware(http, receive, send)
    head, body = messages[0], b"".join(m.get("body", b"") for m in messages[1:])
    headers = {n.decode("latin-1"): v.decode("latin-1") for n, v in head["headers"]}
    return head["status"], headers, body, len(runs)


def _assert_problem(
    headers: dict[str, str], body: bytes, caplog: pytest.LogCaptureFixture, got: str
) -> None:
    import json

    assert headers["Content-Type"] == "application/problem+json"
    problem = json.loads(body)
    assert (problem["status"], problem["code"], problem["retry"]) == (500, "invalid_scope", "never")
    errors = [r for r in caplog.records if r.name == "idemkey" and r.levelname == "ERROR"]
    assert len(errors) == 1, caplog.text
    assert f"returned {got}, not a str" in errors[0].getMessage()
    assert errors[0].exc_info is None  # one line, no traceback


@pytest.mark.parametrize("got", NOT_STR)
def test_a_scope_returning_no_str_is_a_500_problem_and_claims_nothing_under_wsgi(
    sync_client: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture, got: str
) -> None:
    store = RedisStore(sync_client, Policy(prefix=prefix))
    with caplog.at_level("ERROR", logger="idemkey"):
        status, headers, body, runs = _wsgi_call(store, lambda request: NOT_STR[got])
    assert (status[:3], runs) == ("500", 0)
    _assert_problem(headers, body, caplog, type(NOT_STR[got]).__name__)
    assert list(sync_client.scan_iter(match=f"{prefix}*")) == []  # nothing claimed
    # The same request with a str scope runs, once.
    status, _, body, runs = _wsgi_call(store, lambda request: "tenant-1")
    assert (status[:3], body, runs) == ("201", b"made", 1)


@pytest.mark.parametrize("got", NOT_STR)
async def test_a_scope_returning_no_str_is_a_500_problem_and_claims_nothing_under_asgi(
    async_client: redis.asyncio.Redis, prefix: str, caplog: pytest.LogCaptureFixture, got: str
) -> None:
    store = AsyncRedisStore(async_client, Policy(prefix=prefix))
    with caplog.at_level("ERROR", logger="idemkey"):
        status, headers, body, runs = await _asgi_call(store, lambda request: NOT_STR[got])
    assert (status, runs) == (500, 0)
    _assert_problem(headers, body, caplog, type(NOT_STR[got]).__name__)
    assert [key async for key in async_client.scan_iter(match=f"{prefix}*")] == []
    status, _, body, runs = await _asgi_call(store, lambda request: "tenant-1")
    assert (status, body, runs) == (201, b"made", 1)
