"""routes= on the WSGI and ASGI middlewares: only chosen routes are guarded, with their options;
an unguarded request costs no Redis call and no body read. Real Redis."""

from __future__ import annotations

import io
import json
import sys
from typing import TYPE_CHECKING, Any

import httpx
import redis
import redis.asyncio

from idemkey import AsyncRedisStore, Event, Policy, RedisStore
from idemkey.adapters.asgi import IdempotencyMiddleware as AsgiMiddleware
from idemkey.adapters.wsgi import IdempotencyMiddleware as WsgiMiddleware
from idemkey.routes import ROUTE_UNKNOWN, Routes, exempt, route

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

ROUTES = Routes(
    route("/charges"),
    route("/charges/{charge_id}/refund", required=False),
    route("/v1/{rest:path}"),
    exempt("/v1/login"),
)


class CountingRedis(redis.Redis):
    commands = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        type(self).commands += 1
        return super().execute_command(*args, **options)


class CountingAsyncRedis(redis.asyncio.Redis):
    commands = 0

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        type(self).commands += 1
        return await super().execute_command(*args, **options)


# ---- WSGI -----------------------------------------------------------------------------------


class Echo:
    """A WSGI app that answers with its body and whether it got the server's own input."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> list[bytes]:
        self.runs += 1
        length = int(environ.get("CONTENT_LENGTH") or 0)
        untouched = environ["wsgi.input"] is environ["test.server_input"]
        body = json.dumps(
            {"run": self.runs, "body": environ["wsgi.input"].read(length).decode(),
             "untouched": untouched}
        ).encode()  # fmt: skip
        start_response("200 OK", [("Content-Type", "application/json")])
        return [body]


def call(app: Any, path: str, key: str | None = None, body: bytes = b"{}") -> tuple[int, Any]:
    stream = io.BytesIO(body)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST", "SCRIPT_NAME": "", "PATH_INFO": path, "QUERY_STRING": "",
        "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": "application/json",
        "SERVER_NAME": "t", "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.input": stream, "test.server_input": stream, "wsgi.errors": sys.stderr,
        "wsgi.url_scheme": "http", "wsgi.version": (1, 0), "wsgi.multithread": False,
        "wsgi.multiprocess": False, "wsgi.run_once": False,
    }  # fmt: skip
    if key is not None:
        environ["HTTP_IDEMPOTENCY_KEY"] = key
    status: list[str] = []
    chunks = app(environ, lambda s, h, *e: status.append(s))
    data = b"".join(chunks)
    getattr(chunks, "close", lambda: None)()
    return int(status[0][:3]), json.loads(data) if data.startswith(b"{") else data


def test_wsgi_guards_only_the_chosen_routes(redis_url: str, prefix: str) -> None:
    events: list[Event] = []
    client = CountingRedis.from_url(redis_url)
    store = RedisStore(client, Policy(prefix=prefix, on_event=events.append))
    app = WsgiMiddleware(Echo(), store, routes=ROUTES)
    CountingRedis.commands = 0
    for path in ("/login", "/v1/login", "/charges/ch_1"):
        status, answer = call(app, path, key="k", body=b'{"a": 1}')
        assert status == 200
        assert answer["untouched"] is True  # the middleware never read the body
        assert answer["body"] == '{"a": 1}'
    assert CountingRedis.commands == 0  # nor called Redis
    assert call(app, "/charges")[0] == 400  # guarded: the key is required
    first = call(app, "/charges", key="k")
    assert call(app, "/charges", key="k") == first
    assert call(app, "/charges/ch_1/refund")[0] == 200  # required=False on this route
    assert call(app, "/v1/anything/here", key="v")[0] == 200
    assert {e.route for e in events} == {"/charges", "/v1/{rest:path}"}
    store.close()
    client.close()


def pep3333(path: str) -> str:
    """``path`` as a WSGI server hands it over: its UTF-8 bytes as latin-1 text (PEP 3333)."""
    return path.encode("utf-8").decode("latin-1")


def test_wsgi_guards_a_non_ascii_route_as_asgi_does(redis_url: str, prefix: str) -> None:
    # gunicorn, waitress, granian and werkzeug's server give PATH_INFO "/cafÃ©s" for /cafés:
    # matched as it came, the route never was, and every request ran unguarded.
    events: list[Event] = []
    client = redis.Redis.from_url(redis_url)
    store = RedisStore(client, Policy(prefix=prefix, on_event=events.append))
    routes = Routes(route("/cafés"), route("/menüs/{item}"), exempt("/menüs/thé"))
    app = WsgiMiddleware(Echo(), store, routes=routes)
    assert call(app, pep3333("/cafés"))[0] == 400  # guarded: the key is required
    first = call(app, pep3333("/cafés"), key="k")
    assert call(app, pep3333("/cafés"), key="k") == first  # the replay: one run
    assert call(app, pep3333("/menüs/café"), key="m")[1]["run"] == 2
    assert call(app, pep3333("/menüs/café"), key="m")[1]["run"] == 2
    assert call(app, pep3333("/menüs/thé"), key="m")[1]["untouched"] is True  # exempt
    assert {e.route for e in events} == {"/cafés", "/menüs/{item}"}
    store.close()
    client.close()


def test_wsgi_without_routes_keeps_guarding_every_path_by_method(
    redis_url: str, prefix: str
) -> None:
    events: list[Event] = []
    client = redis.Redis.from_url(redis_url)
    app = WsgiMiddleware(Echo(), RedisStore(client, Policy(prefix=prefix, on_event=events.append)))
    assert call(app, "/login")[0] == 400  # today's behaviour: every POST needs a key
    assert call(app, "/login", key="k")[0] == 200
    assert {e.route for e in events} == {ROUTE_UNKNOWN}  # never the concrete path
    client.close()


# ---- ASGI -----------------------------------------------------------------------------------


async def test_asgi_guards_only_the_chosen_routes(redis_url: str, prefix: str) -> None:
    events: list[Event] = []
    runs = {"n": 0}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        runs["n"] += 1
        message = await receive()
        body = json.dumps(
            {"run": runs["n"], "body": message["body"].decode(),
             "untouched": receive is scope["test.receive"]}
        ).encode()  # fmt: skip
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    client = CountingAsyncRedis.from_url(redis_url)
    store = AsyncRedisStore(client, Policy(prefix=prefix, on_event=events.append))
    guarded = AsgiMiddleware(app, store, routes=ROUTES)

    async def tagged(scope: Any, receive: Any, send: Any) -> None:
        scope["test.receive"] = receive  # the server's receive, to compare with the app's
        await guarded(scope, receive, send)

    transport = httpx.ASGITransport(app=tagged)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        CountingAsyncRedis.commands = 0
        for path in ("/login", "/v1/login", "/charges/ch_1"):
            reply = await http.post(path, content=b"abc", headers={"Idempotency-Key": "k"})
            assert reply.json()["untouched"] is True
            assert reply.json()["body"] == "abc"
        assert CountingAsyncRedis.commands == 0
        assert (await http.post("/charges", content=b"x")).status_code == 400
        key = {"Idempotency-Key": "k"}
        first = await http.post("/charges", content=b"x", headers=key)
        again = await http.post("/charges", content=b"x", headers=key)
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.json() == first.json()
        assert (await http.post("/charges/ch_9/refund", content=b"x")).status_code == 200
    assert {e.route for e in events} == {"/charges"}
    await store.aclose()
    await client.aclose()
