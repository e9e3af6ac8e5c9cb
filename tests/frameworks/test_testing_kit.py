"""idemkey.testing and its pytest plugin, as a user's own test suite uses them.

The main test writes a small user project (a Flask, a FastAPI and a Django app, each with its
tests, and a conftest.py that enables ``idemkey.pytest_plugin``) and runs pytest on it in a
subprocess, as the user would; every test in it must pass. No Redis server: that is the point
of the kit.
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from idemkey import ConfigurationError, guard
from idemkey.http import Headers, Request, begin
from idemkey.policy import Policy
from idemkey.testing import disabled, fake_async_store, fake_store
from tests._servers import user_environ

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
pytest_plugins = ["idemkey.pytest_plugin"]
"""

FLASK = """
import pytest
from flask import Flask

from idemkey.adapters.flask import Idemkey

def make_app(store):
    app = Flask(__name__)
    idem = Idemkey(app, store)
    runs = []

    @app.post("/charges")
    @idem.idempotent
    def charges():
        runs.append(1)
        return {"run": len(runs)}, 201

    return app

def test_a_retry_is_replayed(idemkey_store):
    client = make_app(idemkey_store).test_client()
    first = client.post("/charges", json={}, headers={"Idempotency-Key": "k"})
    again = client.post("/charges", json={}, headers={"Idempotency-Key": "k"})
    assert again.json == first.json == {"run": 1}
    assert again.headers["Idempotent-Replayed"] == "true"
    assert client.post("/charges", json={}).status_code == 400

def test_idemkey_off_with_the_fixture(idemkey_store, idemkey_disabled):
    client = make_app(idemkey_store).test_client()
    assert client.post("/charges", json={}).status_code == 201  # no key needed
    assert client.post("/charges", json={}, headers={"Idempotency-Key": "k"}).json == {"run": 2}

@pytest.mark.idemkey_disabled
def test_idemkey_off_with_the_marker(idemkey_store):
    client = make_app(idemkey_store).test_client()
    assert client.post("/charges", json={}).status_code == 201

def test_each_test_gets_an_empty_store(idemkey_store):
    client = make_app(idemkey_store).test_client()
    assert client.post("/charges", json={}, headers={"Idempotency-Key": "k"}).json == {"run": 1}
"""

FASTAPI = """
import httpx
import pytest
from fastapi import FastAPI

from idemkey.adapters.fastapi import Idempotency, IdempotentRoute

def make_app(store):
    idem = Idempotency(store)
    app = FastAPI()
    app.router.route_class = IdempotentRoute
    runs = []

    @app.post("/charges", status_code=201, dependencies=[idem.guard()])
    async def charges():
        runs.append(1)
        return {"run": len(runs)}

    return app

def client(app):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")

@pytest.mark.asyncio
async def test_a_retry_is_replayed(idemkey_async_store):
    async with client(make_app(idemkey_async_store)) as http:
        first = await http.post("/charges", headers={"Idempotency-Key": "k"})
        again = await http.post("/charges", headers={"Idempotency-Key": "k"})
        assert again.json() == first.json() == {"run": 1}
        assert again.headers["Idempotent-Replayed"] == "true"

@pytest.mark.asyncio
async def test_idemkey_off(idemkey_async_store, idemkey_disabled):
    async with client(make_app(idemkey_async_store)) as http:
        assert (await http.post("/charges")).status_code == 201
"""

DJANGO = """
import django
from django.conf import settings
from django.http import JsonResponse
from django.urls import path

from idemkey.adapters.django import idempotent
from idemkey.testing import fake_store

RUNS = []

@idempotent
def charges(request):
    RUNS.append(1)
    return JsonResponse({"run": len(RUNS)}, status=201)

urlpatterns = [path("charges", charges)]

settings.configure(
    SECRET_KEY="user-tests", ALLOWED_HOSTS=["*"], ROOT_URLCONF=__name__, INSTALLED_APPS=[],
    MIDDLEWARE=["idemkey.adapters.django.IdempotencyMiddleware"],
    IDEMKEY={"STORE": fake_store()},
)
django.setup()

from django.test import Client

def test_a_retry_is_replayed():
    client = Client()
    first = client.post("/charges", headers={"Idempotency-Key": "k"})
    again = client.post("/charges", headers={"Idempotency-Key": "k"})
    assert again.json() == first.json() == {"run": 1}
    assert again.headers["Idempotent-Replayed"] == "true"

def test_idemkey_off(idemkey_disabled):
    assert Client().post("/charges").status_code == 201
"""


def test_a_users_flask_fastapi_and_django_tests_run_on_the_kit(tmp_path: Path) -> None:
    for name, text in {
        # A project sets the loop scope pytest-asyncio asks for: unset, pytest-asyncio 1.5 warns
        # at start-up under pytest 9.2, and -W error stops the run.
        "pytest.ini": "[pytest]\nasyncio_default_fixture_loop_scope = function\n",
        "conftest.py": CONFTEST,
        "test_flask_app.py": FLASK,
        "test_fastapi_app.py": FASTAPI,
        "test_django_app.py": DJANGO,
    }.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    env = user_environ(PYTHONPATH=str(ROOT), IDEMKEY_REDIS_URL="")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error", "."],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "8 passed" in result.stdout, result.stdout


def test_fake_stores_run_the_real_scripts() -> None:
    store = fake_store(prefix="kit")
    for _ in range(2):
        with guard(store, "k", payload=b"p") as call:
            if not call.replayed:
                call.save("done")
    assert call.replayed
    assert call.result == "done"
    assert fake_store().client is not store.client  # every store its own server


async def test_the_async_fake_store() -> None:
    from idemkey import aguard

    store = fake_async_store(wait=0.5)
    assert store.policy.wait == 0.5
    for _ in range(2):
        async with aguard(store, "k", payload=b"p") as call:
            if not call.replayed:
                call.save("done")
    assert call.result == "done"
    await store.aclose()


def test_disabled_turns_every_http_integration_off_in_every_thread() -> None:
    request = Request("POST", "/charges", "", Headers([]))
    assert begin(Policy(), request) is not None  # a 400: the key is missing
    seen: list[object] = []
    with disabled():
        with disabled():  # nested blocks count
            pass
        thread = threading.Thread(target=lambda: seen.append(begin(Policy(), request)))
        thread.start()
        thread.join(10)
        assert begin(Policy(), request) is None
    assert seen == [None]  # the app's thread saw it too
    assert begin(Policy(), request) is not None  # on again after the last block


async def test_disabled_decorates_an_async_function_for_its_whole_await() -> None:
    """``@disabled()`` on an ``async def`` held idemkey off only while the coroutine was
    created: its body ran guarded (a 400 for the missing key), a decorated async helper or
    fixture silently under idemkey."""
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request as StarletteRequest
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from idemkey.adapters.asgi import IdempotencyMiddleware

    async def charge(request: StarletteRequest) -> JSONResponse:
        return JSONResponse({"id": "ch_1"}, status_code=201)

    store = fake_async_store()
    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/charges", charge, methods=["POST"])]), store
    )

    async def post() -> int:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return (await client.post("/charges")).status_code

    @disabled()
    async def unguarded() -> int:
        await asyncio.sleep(0)  # the body runs past a suspension, still off
        return await post()

    created = unguarded()
    assert await post() == 400  # on until the coroutine runs
    assert await created == 201
    assert await post() == 400  # on again after it
    assert inspect.iscoroutinefunction(unguarded)  # pytest-asyncio and frameworks see it async
    await store.aclose()


def test_disabled_decorates_a_function_and_refuses_a_generator_function() -> None:
    request = Request("POST", "/charges", "", Headers([]))

    @disabled()
    def unguarded() -> object:
        return begin(Policy(), request)

    assert unguarded() is None
    assert begin(Policy(), request) is not None

    def rows() -> Iterator[object]:  # pragma: no cover
        yield begin(Policy(), request)

    async def async_rows() -> AsyncIterator[object]:  # pragma: no cover
        yield begin(Policy(), request)

    for generator_function in (rows, async_rows):
        with pytest.raises(ConfigurationError, match="with disabled"):
            disabled()(generator_function)


def test_a_missing_fakeredis_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ConfigurationError, match=r"idemkey-redis\[testing\]"):
        fake_store()
