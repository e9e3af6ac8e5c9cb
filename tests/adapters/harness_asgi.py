"""ASGI harnesses: Starlette, FastAPI and Litestar apps guarded by the ASGI middleware.

Each harness owns an asyncio loop running in a background thread; ``request`` submits an httpx
call through ``httpx.ASGITransport`` to that loop and waits for it, so the shared suite drives
every adapter with the same sync, thread-safe client. The Redis client, the store and the app
are all created inside that loop, because asyncio Redis connections belong to one loop.

Two ways to install the middleware are covered: the Starlette and Litestar apps are wrapped
(``IdempotencyMiddleware(app, ...)``, outermost), the FastAPI app uses ``app.add_middleware``
(inside Starlette's error middleware, so an exception reaches idemkey before it becomes a 500).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import fakeredis
import httpx
import redis.asyncio

from idemkey import AsyncRedisStore
from idemkey.adapters.asgi import IdempotencyMiddleware
from tests.adapters.harness import GLIDE_SCHEME, VALKEY_PY_SCHEME, Answer, Backend, Reply

if TYPE_CHECKING:
    from idemkey import Policy
    from idemkey.adapters.asgi import ASGIApp
    from tests.adapters.harness import HarnessFactory

__all__ = ["HARNESSES", "AsgiHarness", "fastapi_harness", "litestar_harness", "starlette_harness"]

T = TypeVar("T")
REQUEST_TIMEOUT = 30.0
# Builds the guarded app from the routes' backend, the store and the policy (inside the loop).
AppBuilder = Callable[[Backend, AsyncRedisStore, "Policy"], "ASGIApp"]


def _raw(headers: Sequence[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in headers]


async def _stream(chunks: Any) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


class AsgiHarness:
    """A guarded ASGI app plus a sync, thread-safe client (see tests/adapters/harness.py)."""

    def __init__(self, name: str, build: AppBuilder, redis_url: str | None, policy: Policy) -> None:
        self.name = name
        self.backend = Backend(policy.max_response_bytes)
        self.executions = self.backend.executions
        self.gate = self.backend.gate
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"harness-{name}")
        self._thread.start()
        try:
            self.run(self._open(build, redis_url, policy))
        except BaseException:
            self._stop_loop()
            raise

    async def _open(self, build: AppBuilder, redis_url: str | None, policy: Policy) -> None:
        if redis_url is None:
            server = fakeredis.FakeServer(version=(7, 0))
            self.redis: Any = fakeredis.FakeAsyncRedis(server=server, decode_responses=False)
        elif redis_url.startswith(VALKEY_PY_SCHEME):
            import valkey.asyncio

            self.redis = valkey.asyncio.Valkey.from_url(redis_url, decode_responses=False)
        elif redis_url.startswith(GLIDE_SCHEME):
            from tests.store._both import glide_client_for

            self.redis = await glide_client_for("redis://" + redis_url.split("://", 1)[1])
        else:
            self.redis = redis.asyncio.Redis.from_url(redis_url, decode_responses=False)
        self.store = AsyncRedisStore(self.redis, policy)
        self.app = build(self.backend, self.store, policy)
        # raise_app_exceptions=False: an exception that escapes the app is a 500, as a server
        # would answer it. The transport is called without an httpx.Client, which would keep
        # the Set-Cookie it gets and send it back, changing the default (credential) scope.
        self.transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = REQUEST_TIMEOUT) -> T:
        """Run ``coro`` on the harness loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        body: bytes = b"",
    ) -> Reply:
        chunked = any(
            n.lower() == "transfer-encoding" and "chunked" in v.lower() for n, v in headers
        )
        # A chunked body goes in two pieces with no length, as a streaming client sends it.
        half = len(body) // 2
        content: Any = _stream([body[:half], body[half:]]) if chunked else body
        url = "http://testserver" + path
        raw = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers]
        request = httpx.Request(method, url, headers=raw, content=content)
        return self.run(self._send(request))

    async def _send(self, request: httpx.Request) -> Reply:
        response = await self.transport.handle_async_request(request)
        body = await response.aread()
        decoded = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in response.headers.raw]
        return Reply(response.status_code, decoded, body)

    def close(self) -> None:
        self.gate.set()  # let a /slow handler still waiting finish
        try:
            self.run(self._aclose())
        finally:
            self._stop_loop()

    async def _aclose(self) -> None:
        await self.transport.aclose()
        await self.store.aclose()
        # redis-py, valkey-py and fakeredis: aclose(); valkey-glide: close().
        close = getattr(self.redis, "aclose", None) or self.redis.close
        with contextlib.suppress(Exception):
            await close()
        # Shielded store writes or handlers still running: end them before the loop closes.
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        await self.loop.shutdown_asyncgens()
        await self.loop.shutdown_default_executor()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(REQUEST_TIMEOUT)
        self.loop.close()


# ---- Starlette ------------------------------------------------------------------------------


def _starlette_routes(backend: Backend) -> list[Any]:
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    def respond(answer: Answer) -> Response:
        response = Response(answer.body, status_code=answer.status)
        response.raw_headers.extend(_raw(answer.headers))
        return response

    def charge(name: str, status: int = 201) -> Callable[[Any], Awaitable[Response]]:
        async def endpoint(request: Any) -> Response:
            return respond(backend.charge(name, await request.body(), status))

        return endpoint

    def simple(name: str, status: int) -> Callable[[Any], Awaitable[Response]]:
        async def endpoint(request: Any) -> Response:
            return respond(backend.simple(name, status))

        return endpoint

    async def status(request: Any) -> Response:
        return respond(backend.simple("status", request.path_params["code"]))

    async def explode(request: Any) -> Response:
        return respond(backend.explode())

    async def slow(request: Any) -> Response:
        return respond(await asyncio.to_thread(backend.slow))

    async def big(request: Any) -> Response:
        return respond(backend.big())

    async def stream(request: Any) -> Response:
        code, headers, chunks = backend.stream()
        response = StreamingResponse(_stream(chunks), status_code=code)
        response.raw_headers.extend(_raw(headers))
        return response

    async def matrix(request: Any) -> Response:
        answer = backend.matrix(request.path_params["kind"])
        if answer.status == 204:  # Starlette's Response adds a length for any body
            response = Response(None, status_code=answer.status)
        else:
            response = Response(answer.body, status_code=answer.status)
        response.raw_headers.extend(_raw(answer.headers))
        return response

    return [
        Route("/matrix/{kind}", matrix, methods=["POST"]),
        Route("/charges", charge("charges"), methods=["POST"]),
        Route("/charges", simple("list", 200), methods=["GET"]),
        Route("/refunds", charge("refunds"), methods=["POST"]),
        Route("/charges/1", charge("patch", 200), methods=["PATCH"]),
        Route("/charges/1", simple("put", 200), methods=["PUT"]),
        Route("/charges/1", simple("delete", 204), methods=["DELETE"]),
        Route("/explode", explode, methods=["POST"]),
        Route("/fail500", simple("fail500", 500), methods=["POST"]),
        Route("/declined", simple("declined", 402), methods=["POST"]),
        Route("/status/{code:int}", status, methods=["POST"]),
        Route("/slow", slow, methods=["POST"]),
        Route("/big", big, methods=["POST"]),
        Route("/stream", stream, methods=["POST"]),
    ]


def build_starlette(backend: Backend, store: AsyncRedisStore, policy: Policy) -> ASGIApp:
    from starlette.applications import Starlette

    return IdempotencyMiddleware(Starlette(routes=_starlette_routes(backend)), store, policy)


def build_fastapi(backend: Backend, store: AsyncRedisStore, policy: Policy) -> ASGIApp:
    from fastapi import FastAPI

    app = FastAPI(routes=_starlette_routes(backend))
    app.add_middleware(IdempotencyMiddleware, store=store, policy=policy)
    return app


# ---- Litestar -------------------------------------------------------------------------------


def build_litestar(backend: Backend, store: AsyncRedisStore, policy: Policy) -> ASGIApp:
    from litestar import Litestar, Request, Response, route
    from litestar.response import Stream
    from litestar.response.base import ASGIResponse

    def respond(answer: Answer) -> Response[bytes]:
        # Litestar sets Content-Type from media_type; every answer has at most one line a name.
        headers = {n: v for n, v in answer.headers if n.lower() != "content-type"}
        media_type = next((v for n, v in answer.headers if n.lower() == "content-type"), None)
        return Response(
            answer.body, status_code=answer.status, headers=headers, media_type=media_type
        )

    def charge(path: str, method: str, name: str, status: int = 201) -> Any:
        @route(path, http_method=method, name=name)
        async def endpoint(request: Request[Any, Any, Any]) -> Response[bytes]:
            return respond(backend.charge(name, await request.body(), status))

        return endpoint

    def simple(path: str, method: str, name: str, status: int) -> Any:
        # The decorator's status only passes Litestar's checks (a 204 handler must return
        # None); the Response carries the real one.
        @route(path, http_method=method, name=name, status_code=200)
        async def endpoint() -> Response[bytes]:
            return respond(backend.simple(name, status))

        return endpoint

    @route("/status/{code:int}", http_method="POST")
    async def status(request: Request[Any, Any, Any]) -> Response[bytes]:
        return respond(backend.simple("status", request.path_params["code"]))

    @route("/explode", http_method="POST")
    async def explode() -> Response[bytes]:
        return respond(backend.explode())

    @route("/slow", http_method="POST")
    async def slow() -> Response[bytes]:
        return respond(await asyncio.to_thread(backend.slow))

    @route("/big", http_method="POST")
    async def big() -> Response[bytes]:
        return respond(backend.big())

    @route("/stream", http_method="POST")
    async def stream() -> Stream:
        code, headers, chunks = backend.stream()
        return Stream(_stream(chunks), status_code=code, headers=dict(headers))

    @route("/matrix/{kind:str}", http_method="POST")
    async def matrix(request: Request[Any, Any, Any]) -> ASGIResponse:
        # Raw header lines: two Set-Cookie or Link lines need more than a headers dict.
        answer = backend.matrix(request.path_params["kind"])
        return ASGIResponse(body=answer.body, status_code=answer.status, headers=answer.headers)

    handlers = [
        matrix,
        charge("/charges", "POST", "charges"),
        charge("/refunds", "POST", "refunds"),
        charge("/charges/1", "PATCH", "patch", 200),
        simple("/charges", "GET", "list", 200),
        simple("/charges/1", "PUT", "put", 200),
        simple("/charges/1", "DELETE", "delete", 204),
        simple("/fail500", "POST", "fail500", 500),
        simple("/declined", "POST", "declined", 402),
        status,
        explode,
        slow,
        big,
        stream,
    ]
    app = Litestar(
        route_handlers=handlers,
        signature_namespace={
            "Request": Request,
            "Response": Response,
            "Stream": Stream,
            "ASGIResponse": ASGIResponse,
        },
        logging_config=None,
    )
    return IdempotencyMiddleware(app, store, policy)


# ---- factories ------------------------------------------------------------------------------


def starlette_harness(redis_url: str | None, policy: Policy) -> AsgiHarness:
    return AsgiHarness("starlette", build_starlette, redis_url, policy)


def fastapi_harness(redis_url: str | None, policy: Policy) -> AsgiHarness:
    return AsgiHarness("fastapi", build_fastapi, redis_url, policy)


def litestar_harness(redis_url: str | None, policy: Policy) -> AsgiHarness:
    return AsgiHarness("litestar", build_litestar, redis_url, policy)


HARNESSES: dict[str, HarnessFactory] = {
    "starlette": starlette_harness,
    "fastapi": fastapi_harness,
    "litestar": litestar_harness,
}
