"""1000 different /charges/{id} paths through each adapter: the Prometheus label sets of
``idemkey_events_total`` stay bounded (the route label is the template, never the path).
Real Redis, real prometheus_client."""

from __future__ import annotations

import asyncio
import io
import sys
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio
from prometheus_client import CollectorRegistry

from idemkey import AsyncRedisStore, Policy, RedisStore
from idemkey.contrib.prometheus import prometheus_hook
from idemkey.routes import ROUTE_UNKNOWN, Routes

PATHS = 1000
pytestmark = pytest.mark.redis


def label_sets(registry: CollectorRegistry) -> set[tuple[tuple[str, str], ...]]:
    found = set()
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name == "idemkey_events_total":
                found.add(tuple(sorted(sample.labels.items())))
    return found


def wsgi_app(environ: Any, start_response: Any) -> list[bytes]:
    start_response("201 Created", [("Content-Type", "text/plain")])
    return [b"ok"]


def drive_wsgi(app: Any) -> None:
    for n in range(PATHS):
        environ = {
            "REQUEST_METHOD": "POST", "SCRIPT_NAME": "", "PATH_INFO": f"/charges/{n}",
            "QUERY_STRING": "", "CONTENT_LENGTH": "0", "SERVER_NAME": "t", "SERVER_PORT": "80",
            "wsgi.input": io.BytesIO(), "wsgi.errors": sys.stderr, "wsgi.url_scheme": "http",
            "HTTP_IDEMPOTENCY_KEY": f"k{n}",
        }  # fmt: skip
        body = app(environ, lambda *a: None)
        assert b"".join(body) == b"ok"
        body.close()


def run_wsgi(url: str, policy: Policy, routes: Routes | None) -> None:
    from idemkey.adapters.wsgi import IdempotencyMiddleware

    client = redis.Redis.from_url(url)
    drive_wsgi(IdempotencyMiddleware(wsgi_app, RedisStore(client, policy), routes=routes))
    client.close()


def run_flask(url: str, policy: Policy) -> None:
    from flask import Flask

    from idemkey.adapters.flask import Idemkey

    client = redis.Redis.from_url(url)
    app = Flask(__name__)
    idem = Idemkey(app, RedisStore(client, policy))

    @app.post("/charges/<int:charge_id>")
    @idem.idempotent
    def charge(charge_id: int) -> tuple[str, int]:
        return "ok", 201

    drive_wsgi(app)
    client.close()


def run_django(url: str, policy: Policy) -> None:
    from django.test import Client
    from django.test.utils import override_settings

    from tests.adapters.harness_wsgi import _django
    from tests.frameworks.djangoproject import settings

    _django()
    client = redis.Redis.from_url(url)
    store = RedisStore(client, policy)
    with override_settings(
        ROOT_URLCONF=settings.ROOT_URLCONF,
        MIDDLEWARE=settings.MIDDLEWARE,
        ALLOWED_HOSTS=["*"],
        REDIS_URL=url,
        IDEMKEY={"STORE": store, "PREFIX": policy.prefix},
    ):
        django = Client()
        for n in range(PATHS):
            reply = django.post(f"/charges/{n}", headers={"Idempotency-Key": f"k{n}"})
            assert reply.status_code == 201
    client.close()


async def drive_asgi(app: Any, prefix: str = "/charges") -> None:
    """Plays an ASGI server, in batches of concurrent requests (no HTTP client in between)."""

    async def one(n: int) -> None:
        sent: list[dict[str, Any]] = []
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": f"{prefix}/{n}", "raw_path": f"{prefix}/{n}".encode(),
            "root_path": "", "query_string": b"", "server": ("t", 80), "client": ("c", 1),
            "headers": [(b"host", b"t"), (b"idempotency-key", b"k%d" % n)],
        }  # fmt: skip

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)
        assert sent[0]["status"] == 201, sent

    for start in range(0, PATHS, 50):
        await asyncio.gather(*(one(n) for n in range(start, start + 50)))


async def run_asgi(url: str, policy: Policy, framework: str) -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def charge(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok", status_code=201)

    client = redis.asyncio.Redis.from_url(url)
    store = AsyncRedisStore(client, policy)
    app: Any
    if framework == "asgi":
        from idemkey.adapters.asgi import IdempotencyMiddleware

        app = IdempotencyMiddleware(
            Starlette(routes=[Route("/charges/{id}", charge, methods=["POST"])]), store
        )
    elif framework == "starlette":
        from idemkey.adapters.starlette import Idempotency

        route = Route("/charges/{charge_id}", charge, methods=["POST"])
        app = Starlette(routes=[Idempotency(store).guard(route)])
    else:
        from fastapi import FastAPI

        from idemkey.adapters.fastapi import Idempotency

        idem = Idempotency(store)
        router = idem.router()

        @router.post("/charges/{charge_id}", status_code=201)
        async def create(charge_id: str) -> str:
            return "ok"

        app = FastAPI()
        app.include_router(router, prefix="/v1")
        await drive_asgi(app, "/v1/charges")
        await store.aclose()
        await client.aclose()
        return
    await drive_asgi(app)
    await store.aclose()
    await client.aclose()


EXPECTED_ROUTE = {
    "wsgi": ROUTE_UNKNOWN,
    "wsgi-routes": "/charges/{charge_id}",
    "flask": "/charges/<int:charge_id>",
    "django": "/charges/<int:charge_id>",
    "asgi": ROUTE_UNKNOWN,
    "starlette": "/charges/{charge_id}",
    "fastapi": "/v1/charges/{charge_id}",
}


@pytest.mark.parametrize("adapter", list(EXPECTED_ROUTE))
def test_a_thousand_paths_keep_the_label_sets_bounded(
    adapter: str, redis_url: str, prefix: str
) -> None:
    registry = CollectorRegistry()
    policy = Policy(prefix=prefix, on_event=prometheus_hook(registry))
    runners: dict[str, Callable[[], Any]] = {
        "wsgi": lambda: run_wsgi(redis_url, policy, None),
        "wsgi-routes": lambda: run_wsgi(redis_url, policy, Routes("/charges/{charge_id}")),
        "flask": lambda: run_flask(redis_url, policy),
        "django": lambda: run_django(redis_url, policy),
        "asgi": lambda: asyncio.run(run_asgi(redis_url, policy, "asgi")),
        "starlette": lambda: asyncio.run(run_asgi(redis_url, policy, "starlette")),
        "fastapi": lambda: asyncio.run(run_asgi(redis_url, policy, "fastapi")),
    }
    runners[adapter]()
    labels = label_sets(registry)
    route = EXPECTED_ROUTE[adapter]
    assert labels == {
        (("kind", "claimed"), ("method", "POST"), ("route", route)),
        (("kind", "completed"), ("method", "POST"), ("route", route)),
    }
    claimed = {"kind": "claimed", "method": "POST", "route": route}
    assert registry.get_sample_value("idemkey_events_total", claimed) == PATHS
