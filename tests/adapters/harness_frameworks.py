"""Harnesses for the framework integrations (idemkey.adapters.starlette, .fastapi, .django).

* "starlette-routes": every Starlette route wrapped by ``Idempotency.guard``.
* "fastapi-routes": every route declared on ``Idempotency.router()`` (an ``APIRouter`` with the
  guard dependency and ``IdempotentRoute``), included into the app with ``include_router``.
* "django-middleware": Django with ``idemkey.adapters.django.IdempotencyMiddleware`` in
  ``MIDDLEWARE`` and the views decorated with ``@idempotent``; the store comes from
  ``IDEMKEY["STORE"]``, the handler is Django's own ``WSGIHandler``.

The apps answer from the shared :class:`~tests.adapters.harness.Backend`, as every harness does.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from fastapi import Request

from idemkey import AsyncRedisStore, RedisStore
from tests.adapters.harness import Backend, HarnessFactory, sync_redis
from tests.adapters.harness_asgi import AsgiHarness, _starlette_routes
from tests.adapters.harness_wsgi import BACKEND_KEY, WSGIHarness, _django, _django_view

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from idemkey import Policy
    from idemkey.adapters.asgi import ASGIApp

__all__ = ["HARNESSES"]


def build_starlette_routes(backend: Backend, store: AsyncRedisStore, policy: Policy) -> ASGIApp:
    from starlette.applications import Starlette

    from idemkey.adapters.starlette import Idempotency

    idem = Idempotency(store, policy)
    return Starlette(routes=[idem.guard(route) for route in _starlette_routes(backend)])


def build_fastapi_routes(backend: Backend, store: AsyncRedisStore, policy: Policy) -> ASGIApp:
    from fastapi import FastAPI

    from idemkey.adapters.fastapi import Idempotency

    idem = Idempotency(store, policy)
    router = idem.router()
    for route in _starlette_routes(backend):  # the same endpoints, as FastAPI routes
        endpoint = _fastapi_endpoint(route.endpoint)
        router.add_api_route(route.path, endpoint, methods=list(route.methods or ()))
    app = FastAPI()
    app.include_router(router)
    return app


def _fastapi_endpoint(endpoint: Any) -> Any:
    async def fastapi_endpoint(request: Request) -> Any:  # FastAPI injects the Request
        return await endpoint(request)

    return fastapi_endpoint


def starlette_routes(redis_url: str | None, policy: Policy) -> AsgiHarness:
    return AsgiHarness("starlette-routes", build_starlette_routes, redis_url, policy)


def fastapi_routes(redis_url: str | None, policy: Policy) -> AsgiHarness:
    return AsgiHarness("fastapi-routes", build_fastapi_routes, redis_url, policy)


# ---- Django ---------------------------------------------------------------------------------

_django_lock = threading.Lock()
URLCONF = __name__  # request.urlconf of the harness requests: the urlpatterns below


class HarnessUrlconf:
    """Routes the harness's requests to this module's urlpatterns (Django's per-request
    ``request.urlconf``), whatever ``ROOT_URLCONF`` says."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        request.urlconf = URLCONF
        return self.get_response(request)


def __getattr__(name: str) -> Any:
    if name == "urlpatterns":
        from django.urls import path, re_path

        from idemkey.adapters.django import idempotent

        view = idempotent(_django_view)
        return [
            path("charges", view),
            path("charges/1", view),
            path("status/<int:code>", view),
            re_path(r"^(refunds|explode|fail500|declined|slow|big|stream)$", view),
            re_path(r"^matrix/[a-z-]+$", view),
        ]
    raise AttributeError(name)


def django_middleware(redis_url: str | None, policy: Policy) -> WSGIHarness:
    from django.core.handlers.wsgi import WSGIHandler
    from django.test.utils import override_settings

    backend = Backend(policy.max_response_bytes)
    store = RedisStore(sync_redis(redis_url), policy)
    _django()
    middleware = [f"{__name__}.HarnessUrlconf", "idemkey.adapters.django.IdempotencyMiddleware"]
    with _django_lock, override_settings(MIDDLEWARE=middleware, IDEMKEY={"STORE": store}):
        handler = WSGIHandler()  # loads the middleware (and reads IDEMKEY) now

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Any:
        environ[BACKEND_KEY] = backend
        return handler(environ, start_response)

    return WSGIHarness("django-middleware", app, backend, store)


HARNESSES: dict[str, HarnessFactory] = {
    "starlette-routes": starlette_routes,
    "fastapi-routes": fastapi_routes,
    "django-middleware": django_middleware,
}
