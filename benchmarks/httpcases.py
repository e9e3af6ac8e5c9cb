"""HTTP adapter cases: the same app with and without idemkey, in-process and over real HTTP.

For each adapter three cases: ``plain`` (the app alone), ``first`` (a new key every round:
claim + complete) and ``replay`` (one key, replayed). In-process, the app is called through
the WSGI or ASGI interface directly; over HTTP, gunicorn (gthread, one worker) or uvicorn (one
worker) serves it and the suite sends keep-alive requests with ``http.client``. Under a real
server two more: ``floor.first`` and ``floor.replay``, the same app under the same server doing
the floor's Redis work (http_apps: a bare claim, and a complete when it claimed), which the
server's ``first`` and ``replay`` are compared with (issue 39).

An adapter that cannot be imported, or answers wrongly in a check before timing, is skipped
with the reason; nothing is ever measured in its place.
"""

from __future__ import annotations

import http.client
import io
import sys
from collections.abc import Callable
from typing import Any

from idemkey import AsyncRedisStore, RedisStore

from .cases import PAYLOAD, Case, Context
from .http_apps import asgi_apps, flask_apps, wsgi_apps
from .servers import HttpServer, ServerError

__all__ = ["HttpBench", "asgi_scope", "call_asgi", "call_wsgi", "wsgi_environ"]

REPLAYED = "idempotent-replayed"
#: The group of the in-server floor rows (no target of their own: they are the reference).
FLOOR_GROUP = "http-floor"


def wsgi_environ(path: str, key: str, body: bytes = PAYLOAD) -> dict[str, Any]:
    return {
        "REQUEST_METHOD": "POST",
        "SCRIPT_NAME": "",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "SERVER_NAME": "bench",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_IDEMPOTENCY_KEY": key,
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": False,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }


def call_wsgi(app: Callable[..., Any], path: str, key: str) -> tuple[int, dict[str, str]]:
    """One request through a WSGI app: (status, headers with lower-case names)."""
    answer: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        answer[:] = [status, headers]
        return lambda data: None

    result = app(wsgi_environ(path, key), start_response)
    try:
        for _chunk in result:
            pass
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return int(answer[0][:3]), {k.lower(): v for k, v in answer[1]}


def asgi_scope(path: str, key: str, body: bytes = PAYLOAD) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            (b"idempotency-key", key.encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("bench", 80),
    }


async def call_asgi(app: Any, path: str, key: str) -> tuple[int, dict[str, str]]:
    """One request through an ASGI app: (status, headers with lower-case names)."""
    sent = False
    answer: dict[str, Any] = {}

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": PAYLOAD, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
            answer["headers"] = {k.decode().lower(): v.decode() for k, v in message["headers"]}

    await app(asgi_scope(path, key), receive, send)
    return answer["status"], answer["headers"]


def _check(answers: list[tuple[int, dict[str, str]]]) -> str | None:
    """None when (plain, first, replay) answered as they must, else what went wrong."""
    (plain, _), (first, _), (again, headers) = answers
    if plain != 201 or first != 201 or again != 201:
        return f"unexpected statuses plain={plain} first={first} replay={again}"
    if headers.get(REPLAYED) != "true":
        return "the retry was not answered as a replay (no Idempotent-Replayed: true)"
    return None


def _server_checks(
    post: Callable[[str, str], tuple[int, dict[str, str]]], paths: tuple[str, str], floor: str
) -> list[tuple[int, dict[str, str]]]:
    """(plain, first, replay) answers for :func:`_check`; the in-server floor must answer a
    new key and a replayed one (``post`` raises unless 201) and leave the replay's record
    complete before any timing."""
    answers = [post(paths[0], "check"), post(paths[1], "check"), post(paths[1], "check")]
    for key in ("check", "check", "replay"):
        post(floor, key)
    return answers


def _trio(
    name: str, run: Callable[[str, str], Any], is_async: bool, paths: tuple[str, str],
    ctx: Context, floors: tuple[str, str], note: str, floor_path: str | None = None,
) -> list[Case]:  # fmt: skip
    """plain, first and replay; with ``floor_path`` (a real server) also the in-server floor
    rows ``<name>.floor.first`` / ``.floor.replay``, the floor's Redis work done by the same
    app under the same server, which first and replay are divided by (``server_floor``)."""
    plain_path, guarded_path = paths
    keys = ctx.keys(name)
    plain_name = f"{name}.plain"
    if floor_path is not None:
        trio = _trio(name, run, is_async, paths, ctx, floors, note)
        trio[1].server_floor, trio[2].server_floor = f"{name}.floor.first", f"{name}.floor.replay"
        return trio + _floor_pair(name, run, floor_path, ctx, floors, note)
    if is_async:

        async def plain(i: int) -> None:
            await run(plain_path, keys[i])

        async def first(i: int) -> None:
            await run(guarded_path, keys[i])

        async def replay(i: int) -> None:
            await run(guarded_path, "replay")

    else:

        def plain(i: int) -> None:
            run(plain_path, keys[i])

        def first(i: int) -> None:
            run(guarded_path, keys[i])

        def replay(i: int) -> None:
            run(guarded_path, "replay")

    return [
        Case(plain_name, "http", plain, is_async=is_async, note=f"{note}, no idemkey"),
        Case(f"{name}.first", "http", first, is_async=is_async, floor=floors[0],
             baseline=plain_name, note=f"{note}, new key"),
        Case(f"{name}.replay", "http", replay, is_async=is_async, floor=floors[1],
             baseline=plain_name, note=f"{note}, replay"),
    ]  # fmt: skip


def _floor_pair(
    name: str, run: Callable[[str, str], Any], path: str, ctx: Context,
    floors: tuple[str, str], note: str,
) -> list[Case]:  # fmt: skip
    """The in-server floor of a real-server trio (sync: the suite's HTTP client is)."""
    keys = ctx.keys(f"{name}.floor")

    def first(i: int) -> None:
        run(path, keys[i])

    def replay(i: int) -> None:
        run(path, "replay")

    plain_name = f"{name}.plain"
    return [
        Case(f"{name}.floor.first", FLOOR_GROUP, first, floor=floors[0], baseline=plain_name,
             note=f"{note}, the app + bare claim + complete in the server"),
        Case(f"{name}.floor.replay", FLOOR_GROUP, replay, floor=floors[1], baseline=plain_name,
             note=f"{note}, the app + one bare claim in the server"),
    ]  # fmt: skip


class HttpBench:
    """Builds the adapter cases and owns the HTTP servers they need."""

    def __init__(self, ctx: Context, url: str, real_http: bool = True) -> None:
        self.ctx = ctx
        self.url = url
        self.real_http = real_http
        self.skipped: dict[str, str] = {}
        self.servers: list[HttpServer] = []
        self._connections: list[http.client.HTTPConnection] = []
        self.store = RedisStore(ctx.client, ctx.policy)
        self.astore = AsyncRedisStore(ctx.aclient, ctx.policy)
        ctx.stores += [self.store, self.astore]

    async def cases(self) -> list[Case]:
        cases: list[Case] = []
        sync_floors = ("floor.first", "floor.replay")
        async_floors = ("afloor.first", "afloor.replay")
        # In-process WSGI
        try:
            plain, guarded = wsgi_apps(self.store)
        except ImportError as exc:
            self.skipped["wsgi"] = f"idemkey.adapters.wsgi cannot be imported: {exc}"
        else:
            apps = {"/p": plain, "/g": guarded}

            def wsgi(path: str, key: str) -> tuple[int, dict[str, str]]:
                return call_wsgi(apps[path], path, key)

            cases += self._checked(
                "wsgi", [wsgi("/p", "check"), wsgi("/g", "check"), wsgi("/g", "check")],
                _trio("wsgi", wsgi, False, ("/p", "/g"), self.ctx, sync_floors,
                      "WSGI middleware, in-process"),
            )  # fmt: skip
        # In-process Flask
        try:
            flask_app = flask_apps(self.store)
        except ImportError as exc:
            self.skipped["flask"] = f"idemkey.adapters.flask cannot be imported: {exc}"
        else:

            def flask(path: str, key: str) -> tuple[int, dict[str, str]]:
                return call_wsgi(flask_app, path, key)

            paths = ("/flask/plain", "/flask/guarded")
            cases += self._checked(
                "flask",
                [flask(paths[0], "check"), flask(paths[1], "check"), flask(paths[1], "check")],
                _trio("flask", flask, False, paths, self.ctx, sync_floors,
                      "Flask extension, in-process"),
            )  # fmt: skip
        # In-process ASGI
        try:
            aplain, aguarded = asgi_apps(self.astore)
        except ImportError as exc:
            self.skipped["asgi"] = f"idemkey.adapters.asgi cannot be imported: {exc}"
        else:
            aapps = {"/p": aplain, "/g": aguarded}

            async def asgi(path: str, key: str) -> tuple[int, dict[str, str]]:
                return await call_asgi(aapps[path], path, key)

            checks = [await asgi("/p", "check"), await asgi("/g", "check"),
                      await asgi("/g", "check")]  # fmt: skip
            cases += self._checked(
                "asgi", checks,
                _trio("asgi", asgi, True, ("/p", "/g"), self.ctx, async_floors,
                      "ASGI middleware, in-process"),
            )  # fmt: skip
        if self.real_http:
            cases += self._real_http(sync_floors, async_floors)
        return cases

    def _checked(
        self, name: str, answers: list[tuple[int, dict[str, str]]], cases: list[Case]
    ) -> list[Case]:
        problem = _check(answers)
        if problem is not None:
            self.skipped[name] = problem
            return []
        return cases

    def _http(self, server: HttpServer) -> Callable[[str, str], tuple[int, dict[str, str]]]:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        self._connections.append(conn)

        def post(path: str, key: str) -> tuple[int, dict[str, str]]:
            conn.request("POST", path, PAYLOAD,
                         {"Content-Type": "application/json", "Idempotency-Key": key})  # fmt: skip
            response = conn.getresponse()
            response.read()
            if response.status != 201:
                raise RuntimeError(f"POST {path} answered {response.status}")
            return response.status, {k.lower(): v for k, v in response.getheaders()}

        return post

    def _real_http(self, sync_floors: tuple[str, str], async_floors: tuple[str, str]) -> list[Case]:
        env = {"IDEMKEY_BENCH_REDIS_URL": self.url, "IDEMKEY_BENCH_PREFIX": self.ctx.prefix}
        cases: list[Case] = []
        wsgi_side = [n for n in ("wsgi", "flask") if n not in self.skipped]
        if wsgi_side:
            try:
                server = HttpServer("gunicorn", "benchmarks.http_apps:make_wsgi()", env)
            except ServerError as exc:
                for name in wsgi_side:
                    self.skipped[f"gunicorn.{name}"] = f"gunicorn did not start: {exc}"
            else:
                self.servers.append(server)
                post = self._http(server)
                for name in wsgi_side:
                    paths = (f"/{name}/plain", f"/{name}/guarded")
                    try:
                        answers = _server_checks(post, paths, f"/{name}/floor")
                    except (RuntimeError, OSError, http.client.HTTPException) as exc:
                        self.skipped[f"gunicorn.{name}"] = f"check request failed: {exc}"
                        continue
                    cases += self._checked(
                        f"gunicorn.{name}", answers,
                        _trio(f"gunicorn.{name}", post, False, paths, self.ctx, sync_floors,
                              f"{name} under gunicorn, real HTTP", f"/{name}/floor"),
                    )  # fmt: skip
        if "asgi" not in self.skipped:
            try:
                server = HttpServer("uvicorn", "benchmarks.http_apps:make_asgi", env)
            except ServerError as exc:
                self.skipped["uvicorn.asgi"] = f"uvicorn did not start: {exc}"
            else:
                self.servers.append(server)
                post = self._http(server)
                paths = ("/asgi/plain", "/asgi/guarded")
                try:
                    answers = _server_checks(post, paths, "/asgi/floor")
                except (RuntimeError, OSError, http.client.HTTPException) as exc:
                    self.skipped["uvicorn.asgi"] = f"check request failed: {exc}"
                else:
                    cases += self._checked(
                        "uvicorn.asgi", answers,
                        _trio("uvicorn.asgi", post, False, paths, self.ctx, async_floors,
                              "ASGI under uvicorn, real HTTP", "/asgi/floor"),
                    )  # fmt: skip
        return cases

    def close(self) -> None:
        for conn in self._connections:
            conn.close()
        for server in self.servers:
            server.close()
