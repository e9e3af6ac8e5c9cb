"""HTTP responses recorded with their fenced effect: a retry after Redis forgot the key, or
after the worker died between its commit and the Redis completion, replays the original
status and body with ``Idempotent-Replayed: true`` and the handler does not run again. A
worker that died between its commit and the write of its response gets the documented 409
``response_lost`` on every retry (docs/effects.md).

The apps are tests/sql/_http_app.py: a Flask view and a FastAPI route in the documented
fenced pattern, in process (werkzeug's client, httpx's ASGI transport) and under real servers
(gunicorn, uvicorn) that SIGKILL themselves at the staged point.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from werkzeug.test import Client

from tests._servers import AppServer, RedisServer, wait_until
from tests.sql.conftest import CHARGES

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
KEYED = {"Idempotency-Key": "order-1", "Content-Type": "application/json"}
LEASE = 1.0


@pytest.fixture
def server(redis_server_factory: Callable[..., RedisServer]) -> RedisServer:
    return redis_server_factory()  # keeps nothing on disk: a restart forgets every key


@pytest.fixture
def env(
    server: RedisServer, prefix: str, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    values = {
        "TRUTH_REDIS_URL": server.url,
        "TRUTH_PREFIX": prefix,
        "TRUTH_DB_URL": db_url,
        "TRUTH_LEASE": str(LEASE),
        "TRUTH_FAULT_ONCE": str(tmp_path / "struck"),
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def business_rows(db_url: str, key: str) -> list[tuple[Any, ...]]:
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            query = sa.select(CHARGES.c.fence, CHARGES.c.worker).where(CHARGES.c.key == key)
            return [tuple(row) for row in conn.execute(query)]
    finally:
        engine.dispose()


def test_a_flask_view_replays_its_response_from_sql_after_redis_forgot(
    env: dict[str, str], server: RedisServer
) -> None:
    from tests.sql._http_app import make_flask_app

    app = make_flask_app()
    web = Client(app)
    first = web.post("/charges", data=b"{}", headers=KEYED)
    assert first.status_code == 201, first.get_data()
    body = first.get_data()
    first.close()
    server.restart()
    again = web.post("/charges", data=b"{}", headers=KEYED)  # the very first retry
    assert again.status_code == 201, again.get_data()
    assert again.get_data() == body
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Content-Type"] == first.headers["Content-Type"]
    assert len(business_rows(env["TRUTH_DB_URL"], "flask")) == 1
    store = app.config["TRUTH_STORE"]
    store.close()
    store.client.close()
    app.config["TRUTH_ENGINE"].dispose()


async def test_a_fastapi_route_replays_its_response_from_sql_after_redis_forgot(
    env: dict[str, str], server: RedisServer
) -> None:
    from tests.sql._http_app import make_fastapi_app

    app = make_fastapi_app()
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as web:
            first = await web.post("/charges", content=b"{}", headers=KEYED)
            assert first.status_code == 201, first.text
            server.restart()
            again = await web.post("/charges", content=b"{}", headers=KEYED)
    finally:
        await app.state.truth_store.aclose()
        await app.state.truth_store.client.aclose()
        await app.state.truth_engine.dispose()
    assert again.status_code == 201, again.text
    assert again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true"
    assert len(business_rows(env["TRUTH_DB_URL"], "fastapi")) == 1


def test_the_plain_wsgi_and_asgi_middlewares_replay_from_sql_after_redis_forgot(
    env: dict[str, str], server: RedisServer
) -> None:
    """The shared driver records the response for every adapter: the WSGI middleware here,
    and the ASGI one (Starlette's, FastAPI's) through an asyncio loop of its own."""
    import asyncio

    import redis.asyncio
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
    from sqlalchemy.orm import Session

    from idemkey import AsyncRedisStore, Policy, RedisStore, current_call
    from idemkey.adapters.asgi import IdempotencyMiddleware as Asgi
    from idemkey.adapters.wsgi import IdempotencyMiddleware as Wsgi
    from idemkey.contrib.sqlalchemy import AsyncEffects, Effects, afenced, fenced
    from tests.sql.conftest import async_url

    url, policy = env["TRUTH_DB_URL"], Policy(prefix=env["TRUTH_PREFIX"])
    engine = sa.create_engine(url)

    def wsgi_app(environ: Any, start_response: Any) -> list[bytes]:
        call = current_call()
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key="wsgi", fence=call.fence))
            fenced(session, call)
        start_response("201 Created", [("Content-Type", "text/plain"), ("X-Order", "w1")])
        return [b"wsgi order"]

    store = RedisStore(server.client(), policy, effects=Effects(engine))
    web = Client(Wsgi(wsgi_app, store))
    first = web.post("/w", data=b"{}", headers=KEYED)
    assert (first.status_code, first.get_data()) == (201, b"wsgi order")
    first.close()
    server.restart()
    again = web.post("/w", data=b"{}", headers=KEYED)
    assert (again.status_code, again.get_data()) == (201, b"wsgi order")
    assert again.headers["X-Order"] == "w1"
    assert again.headers["Idempotent-Replayed"] == "true"
    store.close()
    store.client.close()
    engine.dispose()

    async def asgi() -> tuple[httpx.Response, httpx.Response]:
        aengine = create_async_engine(async_url(url))
        client = redis.asyncio.Redis.from_url(server.url)
        astore = AsyncRedisStore(client, policy, effects=AsyncEffects(aengine))

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await receive()
            call = current_call()
            async with AsyncSession(aengine) as session, session.begin():
                await session.execute(sa.insert(CHARGES).values(key="asgi", fence=call.fence))
                await afenced(session, call)
            await send({"type": "http.response.start", "status": 201, "headers": []})
            await send({"type": "http.response.body", "body": b"asgi order"})

        transport = httpx.ASGITransport(app=Asgi(app, astore))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as web:
                first = await web.post("/a", content=b"{}", headers=KEYED)
                server.restart()
                again = await web.post("/a", content=b"{}", headers=KEYED)
        finally:
            await astore.aclose()
            await client.aclose()
            await aengine.dispose()
        return first, again

    first_a, again_a = asyncio.run(asgi())
    assert (first_a.status_code, first_a.content) == (201, b"asgi order")
    assert (again_a.status_code, again_a.content) == (201, b"asgi order")
    assert again_a.headers["Idempotent-Replayed"] == "true"
    assert len(business_rows(url, "wsgi")) == len(business_rows(url, "asgi")) == 1


def test_a_django_view_replays_its_response_from_sql_after_redis_forgot(
    env: dict[str, str], server: RedisServer
) -> None:
    pytest.importorskip("django")
    from django.test import Client as DjangoClient
    from django.test.utils import override_settings

    from idemkey import Policy, RedisStore
    from idemkey.contrib.sqlalchemy import Effects
    from tests.adapters.harness_wsgi import _django

    _django()  # configure Django once per process, the way the adapter suite does
    engine = sa.create_engine(env["TRUTH_DB_URL"])
    store = RedisStore(server.client(), Policy(prefix=env["TRUTH_PREFIX"]), effects=Effects(engine))
    settings = {"STORE": store, "GUARD": "all", "LEASE": 10.0}  # LEASE: a store made anew
    try:
        with override_settings(
            ROOT_URLCONF="tests.sql._django_urls",
            MIDDLEWARE=["idemkey.adapters.django.IdempotencyMiddleware"],
            ALLOWED_HOSTS=["*"],
            IDEMKEY=settings,
        ):
            web = DjangoClient()
            first = web.post("/charges", data=b"{}", content_type="application/json",
                             headers={"Idempotency-Key": "order-1"})  # fmt: skip
            assert first.status_code == 201, first.content
            server.restart()
            again = web.post("/charges", data=b"{}", content_type="application/json",
                             headers={"Idempotency-Key": "order-1"})  # fmt: skip
    finally:
        store.close()
        store.client.close()
        engine.dispose()
    assert again.status_code == 201, again.content
    assert again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true"
    assert len(business_rows(env["TRUTH_DB_URL"], "django")) == 1


# Real servers, killed at the staged point.


def _serve(kind: str, env: dict[str, str], fault: str, log: Path) -> AppServer:
    """The app of ``kind`` on its real server, on a free port, ready once /health answers."""

    def command(port: int) -> list[str]:
        if kind == "flask":  # gunicorn: its master respawns the killed worker
            argv = ["-m", "gunicorn", "-w", "1", "-b", f"127.0.0.1:{port}"]
            argv += ["tests.sql._http_app:flask_app"]
        else:
            argv = ["-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port)]
            argv += ["tests.sql._http_app:fastapi_app"]
        return [sys.executable, *argv]

    return AppServer(
        command,
        log=log,
        cwd=ROOT,
        env={**env, "TRUTH_FAULT": fault},
        name=f"the {kind} server",
        timeout=90,
    )


@pytest.fixture
def serve(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[[str, str], str]]:
    servers: list[AppServer] = []

    def start(kind: str, fault: str) -> str:
        log = tmp_path / f"{kind}-{len(servers)}.log"
        servers.append(_serve(kind, env, fault, log))
        return servers[-1].url

    yield start
    for server in servers:
        server.close()


def _post(base: str) -> httpx.Response | None:
    """The staged request: None when the worker died before the answer reached us."""
    try:
        return httpx.post(f"{base}/charges", content=b"{}", headers=KEYED, timeout=30)
    except httpx.TransportError:
        return None


def _after_the_kill(kind: str, base: str, serve: Callable[[str, str], str]) -> str:
    """Where the retry goes: gunicorn's respawned worker, or a new uvicorn process."""
    if kind == "flask":
        return base
    return serve(kind, "")


@pytest.mark.parametrize("kind", ["flask", "fastapi"])
def test_a_worker_killed_after_its_commit_before_redis_heard_is_replayed(
    kind: str, env: dict[str, str], serve: Callable[[str, str], str]
) -> None:
    base = serve(kind, "kill-before-complete")
    first = _post(base)  # may have its 201 already: the completion comes after the body
    wait_until(Path(env["TRUTH_FAULT_ONCE"]).exists, timeout=10, message="the fault striking")
    rows = business_rows(env["TRUTH_DB_URL"], kind)
    assert len(rows) == 1  # committed, then killed
    retry_at = _after_the_kill(kind, base, serve)
    # The first retry waits out the dead worker's lease (Policy.wait), takes the record over
    # and finds the response in the committed row.
    again = httpx.post(f"{retry_at}/charges", content=b"{}", headers=KEYED, timeout=30)
    assert again.status_code == 201, again.text
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == {"charge": kind, "worker": rows[0][1]}  # the dead worker's answer
    if first is not None:
        assert again.content == first.content
    assert business_rows(env["TRUTH_DB_URL"], kind) == rows


@pytest.mark.parametrize("kind", ["flask", "fastapi"])
def test_a_worker_killed_between_its_commit_and_its_response_is_answered_409(
    kind: str, env: dict[str, str], serve: Callable[[str, str], str]
) -> None:
    base = serve(kind, "kill-before-record")
    _post(base)  # ASGI sends the body before the completion: the client may have its 201
    wait_until(Path(env["TRUTH_FAULT_ONCE"]).exists, timeout=10, message="the fault striking")
    rows = business_rows(env["TRUTH_DB_URL"], kind)
    assert len(rows) == 1
    retry_at = _after_the_kill(kind, base, serve)
    for _ in range(2):  # every retry: the same answer, the handler never runs again
        again = httpx.post(f"{retry_at}/charges", content=b"{}", headers=KEYED, timeout=30)
        assert again.status_code == 409, again.text
        assert again.json()["code"] == "response_lost"
        assert "Retry-After" not in again.headers
    assert business_rows(env["TRUTH_DB_URL"], kind) == rows
