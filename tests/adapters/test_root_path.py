"""A route behind a path prefix (ASGI ``root_path``, WSGI ``SCRIPT_NAME``) is guarded whether it
is written relative to the mount or with the prefix, on every server: uvicorn's ``path`` holds
the root path, hypercorn's and daphne's does not, a WSGI path is ``SCRIPT_NAME + PATH_INFO``.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemkey import AsyncRedisStore, Policy, RedisStore
from idemkey.adapters.asgi import IdempotencyMiddleware as AsgiMiddleware
from idemkey.adapters.wsgi import IdempotencyMiddleware
from idemkey.routes import Routes, exempt, route
from tests.adapters.edge_servers import Server
from tests.adapters.harness import async_redis, sync_redis
from tests.adapters.harness_wsgi import environ_for

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from idemkey.adapters.asgi import Message, Receive, Scope, Send

BODY = b'{"amount":1}'
WRITTEN = [pytest.param("/charges", id="relative"), pytest.param("/api/charges", id="prefixed")]


def wsgi_post(app: IdempotencyMiddleware, key: str) -> tuple[str, dict[str, str]]:
    environ = environ_for("POST", "/charges", [("Idempotency-Key", key)], BODY)
    environ["SCRIPT_NAME"] = "/api"
    answer: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        answer.update(status=status, headers=dict(headers))
        return lambda data: None

    body = app(environ, start_response)
    b"".join(body)
    getattr(body, "close", lambda: None)()
    return answer["status"], answer["headers"]


@pytest.mark.parametrize("written", WRITTEN)
def test_wsgi_guards_a_route_written_either_way_under_script_name(written: str) -> None:
    runs: list[str] = []

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        runs.append(environ["PATH_INFO"])
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [b"done"]

    store = RedisStore(sync_redis(None), Policy(prefix="rp" + uuid.uuid4().hex[:8]))
    middleware = IdempotencyMiddleware(app, store, routes=Routes(route(written)))
    assert wsgi_post(middleware, "k1")[0] == "201 Created"
    status, headers = wsgi_post(middleware, "k1")
    assert (status, headers.get("Idempotent-Replayed")) == ("201 Created", "true")
    assert runs == ["/charges"]


def asgi_post(app: AsgiMiddleware, scope: Scope) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(app(dict(scope), receive, send))
    return sent


def asgi_scope(path: str, key: str) -> dict[str, Any]:
    return {
        "type": "http", "method": "POST", "path": path, "root_path": "/api", "query_string": b"",
        "headers": [(b"idempotency-key", key.encode()), (b"content-length", b"12")],
    }  # fmt: skip


def asgi_counting(runs: list[str]) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        runs.append(scope["path"])
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    return app


#: The path a server gives for ``POST /api/charges`` served with ``--root-path /api``.
SERVER_PATHS = [
    pytest.param("/api/charges", id="uvicorn"),
    pytest.param("/charges", id="hypercorn-daphne"),
]


@pytest.mark.parametrize("server_path", SERVER_PATHS)
@pytest.mark.parametrize("written", WRITTEN)
def test_asgi_guards_a_route_written_either_way_under_root_path(
    written: str, server_path: str
) -> None:
    runs: list[str] = []
    store = AsyncRedisStore(async_redis(None), Policy(prefix="rp" + uuid.uuid4().hex[:8]))
    middleware = AsgiMiddleware(asgi_counting(runs), store, routes=Routes(route(written)))
    first = asgi_post(middleware, asgi_scope(server_path, "k1"))
    second = asgi_post(middleware, asgi_scope(server_path, "k1"))
    assert first[0]["status"] == second[0]["status"] == 201
    assert (b"idempotent-replayed", b"true") in [(n.lower(), v) for n, v in second[0]["headers"]]
    assert runs == [server_path]


def test_asgi_an_exemption_on_the_servers_path_holds_behind_a_prefix() -> None:
    """The path the server gives decides when it matches anything: its exemption holds even
    where the prefixed spelling matches a route (and a route it matches keeps naming the
    record)."""
    runs: list[str] = []
    store = AsyncRedisStore(async_redis(None), Policy(prefix="rp" + uuid.uuid4().hex[:8]))
    routes = Routes(route("/{rest:path}", require_key=True), exempt("/login"))
    middleware = AsgiMiddleware(asgi_counting(runs), store, routes=routes)
    scope = asgi_scope("/login", "k1")
    scope["headers"] = []  # no key: an exempt request runs, a guarded one would get a 400
    assert asgi_post(middleware, scope)[0]["status"] == 201
    assert runs == ["/login"]


# ---- through real servers ------------------------------------------------------------------

#: server -> (extra arguments, environment, what a client puts before the mount's path).
#: uvicorn, hypercorn and daphne take ``--root-path`` as a proxy's stripped prefix: the client
#: asks for ``/charges``; gunicorn takes ``SCRIPT_NAME`` (from its environment) as a prefix the
#: client sends, ``/api/charges``.
MOUNTS: dict[str, tuple[list[str], dict[str, str], str]] = {
    "uvicorn": (["--root-path", "/api"], {}, ""),
    "hypercorn": (["--root-path", "/api"], {}, ""),
    "daphne": (["--root-path", "/api"], {}, ""),
    "gunicorn": ([], {"SCRIPT_NAME": "/api"}, "/api"),
}


@pytest.fixture(scope="module")
def mounted(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Server]]:
    """Each server of :data:`MOUNTS` serving ``edge_apps.MOUNTED`` under ``/api``."""
    running: dict[str, Server] = {}
    try:
        for name, (args, env, sent) in MOUNTS.items():
            app = "wsgi_mounted" if name == "gunicorn" else "asgi_mounted"
            log = tmp_path_factory.mktemp("mounted") / f"{name}.log"
            running[name] = Server(
                name, app, redis_url, log, args=args, env=env, health=f"{sent}/health"
            )
        yield running
    finally:
        for server in running.values():
            server.close()


@pytest.mark.redis
@pytest.mark.parametrize("name", list(MOUNTS))
@pytest.mark.parametrize(
    "path", [pytest.param("/charges", id="relative"), pytest.param("/refunds", id="prefixed")]
)
def test_a_mounted_route_written_either_way_runs_once_on_every_server(
    mounted: dict[str, Server], name: str, path: str
) -> None:
    """``edge_apps.MOUNTED`` guards ``/charges`` (written relative to the mount) and
    ``/api/refunds`` (written with the prefix): a keyed retry replays on every server."""
    server = mounted[name]
    path = MOUNTS[name][2] + path
    key = "rp-" + uuid.uuid4().hex[:8]
    headers = [("Idempotency-Key", key), ("Content-Type", "application/json")]
    first = server.post(path, BODY, headers)
    second = server.post(path, BODY, headers)
    assert first.status == second.status == 201, server.log_text()
    assert second.header("Idempotent-Replayed") == "true", (second, server.log_text())
    assert server.runs(key) == 1
