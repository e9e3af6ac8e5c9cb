"""A response whose body ends short of its declared ``Content-Length`` (a miscounted length, a
middleware that shrinks the body and keeps the header): the server stops mid-body, so the
first client gets a cut answer. idemkey stores it as any answer that did not finish after its
head went out: complete, without its body (``Idempotent-Body-Not-Kept: true``), never the short
bytes replayed as a whole answer under a ``Content-Length`` that fits them.

In process for the WSGI and ASGI middlewares and Django, and through gunicorn and uvicorn.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest
from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse
from django.urls import path

from idemkey import AsyncRedisStore, Policy, RedisStore
from idemkey.adapters.asgi import IdempotencyMiddleware as AsgiMiddleware
from idemkey.adapters.django import idempotent
from idemkey.adapters.wsgi import IdempotencyMiddleware
from tests.adapters.edge_servers import servers
from tests.adapters.harness import store_on
from tests.adapters.harness_wsgi import environ_for
from tests.adapters.test_asgi import call, http_scope, start
from tests.adapters.test_wsgi import Recorder, Server
from tests.frameworks.test_django import project

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from idemkey.adapters.asgi import Receive, Scope, Send
    from tests.adapters.edge_servers import Server as EdgeServer

__all__ = ["project", "servers"]  # the fixtures, imported

BODY = b'{"run":1,"size":12}'  # 19 bytes, under a declared 100


@pytest.fixture
def wsgi_store(redis_url: str, prefix: str) -> Iterator[RedisStore]:
    with store_on(redis_url, Policy(prefix=prefix, lease=2, ttl=60)) as store:
        yield store


def _not_kept(status: str, headers: dict[str, str], body: bytes) -> None:
    assert headers.get("Idempotent-Replayed") == "true"
    assert headers.get("Idempotent-Body-Not-Kept") == "true"
    assert body == b""
    assert status[:3] in ("200", "201")


@pytest.mark.redis
@pytest.mark.parametrize(
    "chunks", [[BODY], [BODY[:9], BODY[9:]], [BODY, b""]], ids=["one", "two", "empty-last"]
)
def test_wsgi_a_body_short_of_its_length_is_not_kept(
    wsgi_store: RedisStore, chunks: list[bytes]
) -> None:
    app = Recorder(chunks, length=100)
    middleware = IdempotencyMiddleware(app, wsgi_store)
    assert Server().call(middleware) == BODY  # what the server had to send: it stops there
    replay = Server()
    body = replay.call(middleware)
    _not_kept(replay.status, dict(replay.headers), body)
    assert app.runs == 1


@pytest.mark.redis
def test_wsgi_a_write_short_of_its_length_is_not_kept(wsgi_store: RedisStore) -> None:
    runs = []

    def legacy(environ: WSGIEnvironment, start_response: StartResponse) -> Any:
        runs.append(1)
        start_response("201 Created", [("Content-Length", "100")])(BODY)
        return []

    middleware = IdempotencyMiddleware(legacy, wsgi_store)
    assert Server().call(middleware) == BODY
    replay = Server()
    body = replay.call(middleware)
    _not_kept(replay.status, dict(replay.headers), body)
    assert runs == [1]


@pytest.mark.redis
def test_wsgi_a_body_of_its_length_is_still_kept(wsgi_store: RedisStore) -> None:
    middleware = IdempotencyMiddleware(Recorder([BODY[:9], BODY[9:]], length=19), wsgi_store)
    Server().call(middleware)
    replay = Server()
    assert replay.call(middleware) == BODY
    assert "Idempotent-Body-Not-Kept" not in dict(replay.headers)


@pytest.mark.parametrize(
    "bodies", [[BODY], [BODY[:9], BODY[9:]], [BODY, b""]], ids=["one", "two", "empty-last"]
)
async def test_asgi_a_body_short_of_its_length_is_not_kept(
    asgi_store: AsyncRedisStore, bodies: list[bytes]
) -> None:
    runs = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        runs.append(1)
        head = start(201)
        head["headers"].append((b"content-length", b"100"))
        await send(head)
        for index, body in enumerate(bodies):
            more = index < len(bodies) - 1
            await send({"type": "http.response.body", "body": body, "more_body": more})

    middleware = AsgiMiddleware(app, asgi_store)
    assert (await call(middleware, b"{}")).body == BODY
    replay = await call(middleware, b"{}")
    assert (replay.status, replay.headers["idempotent-replayed"], replay.body) == (201, "true", b"")
    assert replay.headers["idempotent-body-not-kept"] == "true"
    assert runs == [1]


# Through real servers: gunicorn sends the 19 bytes and closes, uvicorn (h11) refuses the
# short end and closes; the replay is whole.


@pytest.mark.redis
@pytest.mark.parametrize(
    "served",
    [("gunicorn", "shortcl_wsgi"), ("uvicorn", "shortcl_asgi")],
    ids=["gunicorn", "uvicorn"],
)
def test_a_server_replays_a_short_body_as_not_kept(
    servers: Callable[[str, str], EdgeServer], served: tuple[str, str]
) -> None:
    server = servers(*served)
    key = uuid.uuid4().hex
    headers = [("Idempotency-Key", key), ("Content-Type", "application/json")]
    first = server.post("/shortcl", b'{"amount":1}', headers)
    assert (first.status, first.header("Content-Length"), first.body) == (201, "100", BODY)
    replay = server.post("/shortcl", b'{"amount":1}', headers)
    assert replay.status == 201
    assert replay.header("Idempotent-Replayed") == "true"
    assert replay.header("Idempotent-Body-Not-Kept") == "true"
    assert replay.body == b""
    assert server.runs(key) == 1


DJANGO_RUNS: list[str] = []


@idempotent
def django_short(request: HttpRequest) -> HttpResponse:
    DJANGO_RUNS.append(request.headers["Idempotency-Key"])
    response = HttpResponse(BODY, status=201)
    response["Content-Length"] = "100"  # a middleware shrank the body and kept the header
    return response


urlpatterns = [path("shortcl", django_short)]


@pytest.mark.redis
@pytest.mark.parametrize("under", ["wsgi", "asgi"])
def test_django_a_body_short_of_its_length_is_not_kept(project: dict[str, Any], under: str) -> None:
    from django.test import AsyncClient, Client
    from django.test.utils import override_settings

    key = uuid.uuid4().hex
    headers = {"Idempotency-Key": key}
    with override_settings(ROOT_URLCONF=__name__):
        for _ in range(2):
            if under == "wsgi":
                answer = Client().post("/shortcl", headers=headers)
            else:
                answer = async_to_sync(AsyncClient().post)("/shortcl", headers=headers)
    assert (answer.status_code, answer.content) == (201, b"")
    assert answer.headers["Idempotent-Replayed"] == "true"
    assert answer.headers["Idempotent-Body-Not-Kept"] == "true"
    assert DJANGO_RUNS.count(key) == 1


@pytest.mark.redis
def test_wsgi_a_304_with_a_length_has_no_body_to_fall_short(wsgi_store: RedisStore) -> None:
    def not_modified(environ: WSGIEnvironment, start_response: StartResponse) -> Any:
        start_response("304 Not Modified", [("Content-Length", "100")])
        return []

    middleware = IdempotencyMiddleware(not_modified, wsgi_store)
    Server().call(middleware)
    replay = Server()
    assert replay.call(middleware) == b""
    assert dict(replay.headers).get("Idempotent-Replayed") == "true"
    assert "Idempotent-Body-Not-Kept" not in dict(replay.headers)


async def test_asgi_a_304_with_a_length_has_no_body_to_fall_short(
    asgi_store: AsyncRedisStore,
) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        head = {"type": "http.response.start", "status": 304, "headers": []}
        head["headers"].append((b"content-length", b"100"))
        await send(head)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    middleware = AsgiMiddleware(app, asgi_store)
    await call(middleware, b"{}")
    replay = await call(middleware, b"{}")
    assert (replay.status, replay.headers["idempotent-replayed"]) == (304, "true")
    assert "idempotent-body-not-kept" not in replay.headers


@pytest.mark.redis
def test_flask_a_body_short_of_its_length_is_not_kept(wsgi_store: RedisStore) -> None:
    """Flask's view answered 19 bytes under ``Content-Length: 100``: the extension stored the
    19 bytes and replayed them under a length that fit them."""
    from flask import Flask, Response

    from idemkey.adapters.flask import Idemkey

    app = Flask("short")
    idem = Idemkey(app, store=wsgi_store)
    runs: list[int] = []

    @app.post("/short")
    @idem.idempotent
    def short() -> Response:
        runs.append(1)
        answer = Response(b'{"run":1,"size":12}', status=201, content_type="application/json")
        answer.headers["Content-Length"] = "100"
        return answer

    client = app.test_client()
    headers = {"Idempotency-Key": "f1"}
    client.post("/short", data=b'{"amount":1}', headers=headers)
    again = client.post("/short", data=b'{"amount":1}', headers=headers)
    assert (again.status_code, again.headers.get("Idempotent-Replayed")) == (201, "true")
    assert again.headers.get("Idempotent-Body-Not-Kept") == "true"
    assert again.data == b""
    assert runs == [1]


# The WARNING names the route template or ``<unknown>``, never the client's path: a server
# hands over the path percent-decoded (``%0A``, ``%1B`` arrive raw) and as long as it came.
HOSTILE_PATH = "/charges/\nWARNING forged line\r\x1b[31m" + "x" * 3000


def _one_bounded_warning(caplog: pytest.LogCaptureFixture) -> str:
    warnings = [r.getMessage() for r in caplog.records if r.name == "idemkey"]
    short = [message for message in warnings if "short of its Content-Length" in message]
    assert len(short) == 1, warnings
    message = short[0]
    assert not any(char in message for char in "\n\r\x1b"), repr(message[:80])
    assert len(message) < 200, len(message)
    assert "<unknown>" in message
    return message


@pytest.mark.redis
def test_wsgi_the_short_body_warning_never_carries_the_clients_path(
    wsgi_store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    middleware = IdempotencyMiddleware(Recorder([BODY], length=100), wsgi_store)
    server = Server()
    environ = environ_for("POST", HOSTILE_PATH, [("Idempotency-Key", "k")], b"{}")
    with caplog.at_level("WARNING", logger="idemkey"):
        result = middleware(environ, server.start_response)
        try:
            assert b"".join(result) == BODY
        finally:
            getattr(result, "close", lambda: None)()
    _one_bounded_warning(caplog)


async def test_asgi_the_short_body_warning_never_carries_the_clients_path(
    asgi_store: AsyncRedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        head = start(201)
        head["headers"].append((b"content-length", b"100"))
        await send(head)
        await send({"type": "http.response.body", "body": BODY, "more_body": False})

    middleware = AsgiMiddleware(app, asgi_store)
    with caplog.at_level("WARNING", logger="idemkey"):
        answer = await call(middleware, b"{}", scope=http_scope(path=HOSTILE_PATH))
    assert answer.body == BODY
    _one_bounded_warning(caplog)
