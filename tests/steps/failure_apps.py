"""The apps tests/steps/test_failures_http.py serves with real servers (uvicorn, gunicorn).

A declared failure (``CardDeclined``) is rendered by the framework's own exception handling as
a 402 (FastAPI's and Starlette's ``exception_handler``, Flask's ``errorhandler``, a Django
middleware's ``process_exception``), a transient one (``ConnectionError``) as a 503; a bug
(``LookupError``) has no handler and is each framework's own 500. Every
handler run is counted in Redis (``INCR {prefix}:runs:<Idempotency-Key>``). Served as a
top-level module copied next to the log (see the test), so idemkey comes from PYTHONPATH; a
Django factory configures the process's settings, so each server serves one app.
"""

from __future__ import annotations

import os
from typing import Any

import redis
import redis.asyncio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from flask import Blueprint, Flask
from flask import request as flask_request
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request as StarletteRequest
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from idemkey import AsyncRedisStore, Policy, RedisStore
from idemkey.adapters import asgi, wsgi
from idemkey.adapters.fastapi import Idempotency, IdempotentRoute
from idemkey.adapters.flask import Idemkey
from idemkey.adapters.starlette import Idempotency as StarletteIdempotency


class CardDeclined(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(f"card declined: {code}")
        self.code = code


# A header line of the app's own next to Content-Type, so a replay's header lines and their
# order are compared, not only one line.
_DECLINED_HEADERS = {"Decline-Code": "insufficient_funds"}


def _declined(exc: CardDeclined) -> dict[str, str]:
    return {"error": str(exc), "code": exc.code}


def _settings() -> tuple[str, str]:
    return os.environ["IDEMKEY_TEST_REDIS_URL"], os.environ["IDEMKEY_TEST_PREFIX"]


def _policy(prefix: str) -> Policy:
    # wait: a retry sent while the 503's release is still on its way waits for it (rather than
    # a 409 in flight), as a client retrying at once would want.
    return Policy(prefix=prefix, scope=lambda _: "t", wait=5)


def _charge(runs: int, card: str) -> dict[str, Any]:
    """The work every app does: a declined card is declined on every run, a flaky PSP fails
    its first, and a bug (an exception no handler renders) fails every run."""
    if card == "declined":
        raise CardDeclined("insufficient_funds")
    if card == "flaky" and runs == 1:
        raise ConnectionError("the PSP timed out")
    if card == "bug":
        raise LookupError(f"no such card: {card}")
    return {"charged": True, "runs": runs}


def fastapi_app() -> FastAPI:
    url, prefix = _settings()
    client = redis.asyncio.Redis.from_url(url)
    idem = Idempotency(AsyncRedisStore(client, _policy(prefix)))
    app = FastAPI()
    app.router.route_class = IdempotentRoute

    @app.exception_handler(CardDeclined)
    async def declined(request: Request, exc: CardDeclined) -> JSONResponse:
        return JSONResponse(_declined(exc), status_code=402, headers=_DECLINED_HEADERS)

    @app.exception_handler(ConnectionError)
    async def unavailable(request: Request, exc: ConnectionError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=503)

    @app.get("/health")
    async def health() -> str:
        return "ok"

    @app.post("/charges", dependencies=[idem.guard()])
    async def charge(request: Request, card: str) -> dict[str, Any]:
        key = request.headers.get("idempotency-key")
        return _charge(int(await client.incr(f"{prefix}:runs:{key}")), card)

    return app


def flask_app() -> Flask:
    url, prefix = _settings()
    app = Flask(__name__)
    app.config.update(IDEMKEY_REDIS_URL=url, IDEMKEY_PREFIX=prefix)
    idem = Idemkey(app, policy=_policy(prefix))
    counter = redis.Redis.from_url(url)

    @app.errorhandler(CardDeclined)
    def declined(exc: CardDeclined) -> Any:
        return _declined(exc), 402, _DECLINED_HEADERS

    @app.errorhandler(ConnectionError)
    def unavailable(exc: ConnectionError) -> Any:
        return {"error": str(exc)}, 503

    @app.get("/health")
    def health() -> str:
        return "ok"

    @app.post("/charges")
    @idem.idempotent
    def charge() -> Any:
        key = flask_request.headers.get("Idempotency-Key")
        return _charge(int(counter.incr(f"{prefix}:runs:{key}")), flask_request.args["card"])

    return app


# ---- Starlette: a guarded route, and the plain ASGI middleware around the app ----------------


def _starlette(where: str) -> Any:
    url, prefix = _settings()
    client = redis.asyncio.Redis.from_url(url)
    store = AsyncRedisStore(client, _policy(prefix))

    async def charge(request: StarletteRequest) -> Response:
        key = request.headers.get("idempotency-key")
        runs = int(await client.incr(f"{prefix}:runs:{key}"))
        return JSONResponse(_charge(runs, request.query_params["card"]))

    async def declined(request: StarletteRequest, exc: Exception) -> Response:
        assert isinstance(exc, CardDeclined)
        return JSONResponse(_declined(exc), status_code=402, headers=_DECLINED_HEADERS)

    async def unavailable(request: StarletteRequest, exc: Exception) -> Response:
        return JSONResponse({"error": str(exc)}, status_code=503)

    async def health(request: StarletteRequest) -> Response:
        return PlainTextResponse("ok")

    route = Route("/charges", charge, methods=["POST"])
    handlers = {CardDeclined: declined, ConnectionError: unavailable}
    if where == "route":  # idem.guard wraps the route's own app, inside Starlette's handling
        guarded = StarletteIdempotency(store).guard(route)
        return Starlette(routes=[Route("/health", health), guarded], exception_handlers=handlers)
    if where == "middleware":  # the app's middleware: between Starlette's two exception layers
        return Starlette(
            routes=[Route("/health", health), route],
            middleware=[Middleware(asgi.IdempotencyMiddleware, store=store)],
            exception_handlers=handlers,
        )
    # around the whole app, as asgi.py's docstring shows: all of Starlette's handling inside
    app = Starlette(routes=[Route("/health", health), route], exception_handlers=handlers)
    return asgi.IdempotencyMiddleware(app, store)


def starlette_app() -> Any:
    return _starlette("route")


def asgi_app() -> Any:
    return _starlette("middleware")


def asgi_around_app() -> Any:
    return _starlette("around")


# ---- Flask: the plain WSGI middleware around app.wsgi_app; the extension in an app factory --


def _flask_errorhandlers(app: Flask) -> None:
    @app.errorhandler(CardDeclined)
    def declined(exc: CardDeclined) -> Any:
        return _declined(exc), 402, _DECLINED_HEADERS

    @app.errorhandler(ConnectionError)
    def unavailable(exc: ConnectionError) -> Any:
        return {"error": str(exc)}, 503


def wsgi_app() -> Flask:
    """Flask's own errorhandlers inside ``app.wsgi_app``, the WSGI middleware around it."""
    url, prefix = _settings()
    app = Flask(__name__)
    counter = redis.Redis.from_url(url)
    _flask_errorhandlers(app)

    @app.get("/health")
    def health() -> str:
        return "ok"

    @app.post("/charges")
    def charge() -> Any:
        key = flask_request.headers.get("Idempotency-Key")
        return _charge(int(counter.incr(f"{prefix}:runs:{key}")), flask_request.args["card"])

    store = RedisStore(redis.Redis.from_url(url), _policy(prefix))
    app.wsgi_app = wsgi.IdempotencyMiddleware(app.wsgi_app, store)  # type: ignore[method-assign]
    return app


idem = Idemkey()  # the extension as its docs show it: made once, init_app in the factory
bp = Blueprint("charges", __name__)


@bp.post("/charges")
@idem.idempotent
def blueprint_charge() -> Any:
    url, prefix = _settings()
    key = flask_request.headers.get("Idempotency-Key")
    counter = redis.Redis.from_url(url)
    try:
        return _charge(int(counter.incr(f"{prefix}:runs:{key}")), flask_request.args["card"])
    finally:
        counter.close()


@bp.errorhandler(CardDeclined)
def blueprint_declined(exc: CardDeclined) -> Any:
    return _declined(exc), 402, _DECLINED_HEADERS


@bp.errorhandler(ConnectionError)
def blueprint_unavailable(exc: ConnectionError) -> Any:
    return {"error": str(exc)}, 503


def flask_factory_app() -> Flask:
    """The extension configured from ``app.config`` in an app factory, a blueprint's
    errorhandlers rendering the failures."""
    url, prefix = _settings()
    app = Flask(__name__)
    app.config.update(IDEMKEY_REDIS_URL=url, IDEMKEY_PREFIX=prefix, IDEMKEY_WAIT=5)
    idem.init_app(app)
    app.register_blueprint(bp)
    app.add_url_rule("/health", "health", lambda: "ok")
    return app


# ---- Django: the middleware, a decorated view, a middleware's process_exception ------------

urlpatterns: list[Any] = []  # ROOT_URLCONF is this module: filled by _django()


class RenderFailures:
    """Django's idiom for answering an exception: a middleware's ``process_exception``."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        return self.get_response(request)

    def process_exception(self, request: Any, exc: Exception) -> Any:
        from django.http import JsonResponse

        if isinstance(exc, CardDeclined):
            return JsonResponse(_declined(exc), status=402, headers=_DECLINED_HEADERS)
        if isinstance(exc, ConnectionError):
            return JsonResponse({"error": str(exc)}, status=503)
        return None


def _django(*, guard_all: bool) -> None:
    """Configure this process's Django: decorated views (the default ``GUARD``), or every view
    (``GUARD="all"``) with the failures' middleware listed before idemkey's."""
    from django.conf import settings
    from django.http import HttpRequest, HttpResponse, JsonResponse
    from django.urls import path

    from idemkey.adapters.django import idempotent

    url, prefix = _settings()
    middleware = ["idemkey.adapters.django.IdempotencyMiddleware"]
    render = f"{__name__}.RenderFailures"
    settings.configure(
        SECRET_KEY="idemkey-tests", DEBUG=False, ALLOWED_HOSTS=["*"], ROOT_URLCONF=__name__,
        MIDDLEWARE=[render, *middleware] if guard_all else [*middleware, render],
        IDEMKEY={
            "REDIS_URL": url, "PREFIX": prefix, "WAIT": 5, "SCOPE": lambda request: "t",
            "GUARD": "all" if guard_all else "decorated",
        },
    )  # fmt: skip

    def charge(request: HttpRequest) -> HttpResponse:
        key = request.headers.get("Idempotency-Key")
        counter = redis.Redis.from_url(url)
        try:
            runs = int(counter.incr(f"{prefix}:runs:{key}"))
        finally:
            counter.close()
        return JsonResponse(_charge(runs, request.GET["card"]))

    def health(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    urlpatterns[:] = [
        path("health", health),
        path("charges", charge if guard_all else idempotent(charge)),
    ]


def django_wsgi_app() -> Any:
    from django.core.wsgi import get_wsgi_application

    _django(guard_all=False)
    return get_wsgi_application()


def django_asgi_app() -> Any:
    from django.core.asgi import get_asgi_application

    _django(guard_all=True)
    return get_asgi_application()
