"""Remembered failures through the HTTP adapters, on real servers: FastAPI, Starlette (a guarded
route; the plain ASGI middleware in the app's middleware list, and around the whole app) and
ASGI Django on uvicorn; Flask (the extension, with its constructor and in an app factory with
a blueprint), the plain WSGI middleware around a Flask app and WSGI Django on gunicorn. A
declared exception is the framework's to render (an exception handler, an errorhandler, a
middleware's ``process_exception``), and the response it renders is what idemkey stores and
replays.

What a user relies on: a 402 from a card declined is replayed as the same 402 with
``Idempotent-Replayed: true`` (status, header lines and body as first sent), the handler not
run again; a transient exception (the framework's 503) releases the key, and the retry runs
and succeeds; an exception no handler renders (the framework's 500) releases it too.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests._servers import AppServer

APP = Path(__file__).with_name("failure_apps.py")


def uvicorn(factory: str) -> Callable[[int], list[str]]:
    return lambda port: [
        sys.executable, "-m", "uvicorn", "--factory", f"idemkey_failure_apps:{factory}",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
    ]  # fmt: skip


def gunicorn(factory: str) -> Callable[[int], list[str]]:
    return lambda port: [
        sys.executable, "-m", "gunicorn", "--workers", "1", "--bind", f"127.0.0.1:{port}",
        "--log-level", "warning", f"idemkey_failure_apps:{factory}()",
    ]  # fmt: skip


COMMANDS = {
    "fastapi": uvicorn("fastapi_app"),
    "starlette-route": uvicorn("starlette_app"),
    "asgi-middleware": uvicorn("asgi_app"),
    "asgi-around-starlette": uvicorn("asgi_around_app"),
    "django-asgi-guard-all": uvicorn("django_asgi_app"),
    "flask": gunicorn("flask_app"),
    "flask-factory-blueprint": gunicorn("flask_factory_app"),
    "wsgi-middleware": gunicorn("wsgi_app"),
    "django-wsgi-decorated": gunicorn("django_wsgi_app"),
}
# What differs between a first answer and its replay, by design: the marker and what the
# server adds to every response.
PER_RESPONSE = {"idempotent-replayed", "date", "server"}


def lines(answer: httpx.Response) -> list[tuple[str, str]]:
    """The answer's header lines in order, without the per-response ones."""
    return [(n, v) for n, v in answer.headers.multi_items() if n.lower() not in PER_RESPONSE]


@pytest.fixture(params=sorted(COMMANDS))
def server(
    request: pytest.FixtureRequest, redis_url: str, tmp_path: Path
) -> Iterator[tuple[AppServer, str]]:
    prefix = "f" + uuid.uuid4().hex[:12]
    (tmp_path / "idemkey_failure_apps.py").write_text(APP.read_text())
    started = AppServer(
        COMMANDS[request.param], log=tmp_path / "server.log", cwd=tmp_path,
        redis_url=redis_url, prefix=prefix, name=request.param,
    )  # fmt: skip
    yield started, prefix
    started.close()


def test_a_declared_failure_replays_as_its_stored_response_and_a_transient_one_runs_again(
    server: tuple[AppServer, str], redis_url: str
) -> None:
    app, prefix = server
    counter = redis.Redis.from_url(redis_url)
    with httpx.Client(base_url=app.url, timeout=20) as http:
        answers = [
            http.post("/charges", params={"card": "declined"}, headers={"Idempotency-Key": "k1"})
            for _ in range(3)
        ]
        assert [a.status_code for a in answers] == [402, 402, 402]
        assert {a.json()["error"] for a in answers} == {"card declined: insufficient_funds"}
        assert [a.headers.get("Idempotent-Replayed") for a in answers] == [None, "true", "true"]
        assert answers[1].content == answers[2].content == answers[0].content
        assert lines(answers[1]) == lines(answers[2]) == lines(answers[0])
        assert answers[0].headers["Decline-Code"] == "insufficient_funds"
        assert counter.get(f"{prefix}:runs:k1") == b"1"

        flaky = [
            http.post("/charges", params={"card": "flaky"}, headers={"Idempotency-Key": "k2"})
            for _ in range(3)
        ]
        assert [a.status_code for a in flaky] == [503, 200, 200]
        assert flaky[1].json() == flaky[2].json() == {"charged": True, "runs": 2}
        assert [a.headers.get("Idempotent-Replayed") for a in flaky] == [None, None, "true"]
        assert counter.get(f"{prefix}:runs:k2") == b"2"

        # An exception no handler renders: the framework's 500 (or the exception itself, out
        # through idemkey, where the 500 is rendered outside it) releases the key every time.
        # Each on a connection of its own: uvicorn closes one an app raised on, even once its
        # 500 is sent, and the next request on it would race that close.
        bug = {"Idempotency-Key": "k3", "Connection": "close"}
        bugs = [http.post("/charges", params={"card": "bug"}, headers=bug) for _ in range(2)]
        assert [a.status_code for a in bugs] == [500, 500]
        assert [a.headers.get("Idempotent-Replayed") for a in bugs] == [None, None]
        assert counter.get(f"{prefix}:runs:k3") == b"2"
    counter.close()


async def test_a_starlette_handler_for_exception_is_outside_a_guarded_route(
    real_async_client: redis.asyncio.Redis, prefix: str
) -> None:
    """Starlette runs a handler registered for ``Exception`` (or 500) in its outermost
    middleware: the declared exception has left the guarded route, releasing the key, before
    that handler renders it, so the 402 it answers is not stored (docs/steps.md says so, and
    says to register the class itself)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from idemkey import AsyncRedisStore, Policy
    from idemkey.adapters.starlette import Idempotency

    class Declined(Exception):
        pass

    async def charge(request: Request) -> Response:
        await real_async_client.incr(f"{prefix}:runs")
        raise Declined("card declined")

    async def everything(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": str(exc)}, status_code=402)

    idem = Idempotency(
        AsyncRedisStore(real_async_client, Policy(prefix=prefix, scope=lambda _: "t"))
    )
    app = Starlette(
        routes=[idem.guard(Route("/charges", charge, methods=["POST"]))],
        exception_handlers={Exception: everything},
    )
    transport = httpx.ASGITransport(app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        answers = [await http.post("/charges", headers={"Idempotency-Key": "k"}) for _ in range(2)]
    assert [a.status_code for a in answers] == [402, 402]
    assert [a.headers.get("Idempotent-Replayed") for a in answers] == [None, None]
    assert await real_async_client.get(f"{prefix}:runs") == b"2"
