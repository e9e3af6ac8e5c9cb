"""A guarded Django view that raised: released, whatever ``STORE_SERVER_ERRORS`` says.

Django turns an exception into its 500 inside each layer (``convert_exception_to_response``),
so the view's exception, or a lower middleware's after the view (a unit of work that could
not commit), reaches idemkey's middleware as a response. Under ``STORE_SERVER_ERRORS`` that
500 was stored and replayed, though the handler raised; behind every other adapter a handler
that raises is released (docs/behaviour.md) and only a 5xx the handler answered is stored.
Django's ``got_request_exception`` tells the two apart.

This module is the tests' URLconf (``ROOT_URLCONF``); the views count their runs per key in
Redis (``{prefix}:runs:{key}``). Through Django's test ``Client`` (WSGI) and ``AsyncClient``
(ASGI), on the session's real Redis.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync, sync_to_async
from django.http import HttpRequest, HttpResponse
from django.urls import path

from idemkey._core import record_for
from idemkey.adapters.django import idempotent
from idemkey.http._scope import NO_CREDENTIALS
from tests.frameworks.djangoproject import views as project_views
from tests.frameworks.test_django import project, runs

__all__ = ["project"]  # the fixture, from test_django

pytestmark = pytest.mark.redis


def _counted(request: HttpRequest) -> None:
    project_views._run(request.headers["Idempotency-Key"])


@idempotent
def raises(request: HttpRequest) -> HttpResponse:
    _counted(request)
    raise RuntimeError("the card network is down")


@idempotent
async def async_raises(request: HttpRequest) -> HttpResponse:
    """Under ASGI Django makes its 500 for it in another thread (``sync_to_async``)."""
    await sync_to_async(_counted)(request)
    raise RuntimeError("the card network is down")


@idempotent
def answers_500(request: HttpRequest) -> HttpResponse:
    _counted(request)
    return HttpResponse(b"declined upstream", status=500)


@idempotent
def commits(request: HttpRequest) -> HttpResponse:
    _counted(request)
    return HttpResponse(b"charged", status=201)


@idempotent
def rendered(request: HttpRequest) -> HttpResponse:
    _counted(request)
    raise LookupError("no such card")


class CommitFails:
    """Listed below idemkey's: the unit of work fails to commit after ``/commits`` answered,
    and Django answers 500 in its place."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if request.path == "/commits":
            raise RuntimeError("the unit of work could not commit")
        return response

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        """An application's renderer: its answer to a LookupError is the view's outcome."""
        if isinstance(exc, LookupError):
            return HttpResponse(b"rendered", status=500)
        return None


urlpatterns = [
    path("raises", raises),
    path("async-raises", async_raises),
    path("answers-500", answers_500),
    path("commits", commits),
    path("rendered", rendered),
]


@pytest.fixture
def raised(project: dict[str, Any]) -> Iterator[dict[str, Any]]:
    from django.conf import settings
    from django.test.utils import override_settings

    middleware = [*settings.MIDDLEWARE, f"{__name__}.CommitFails"]
    with override_settings(ROOT_URLCONF=__name__, MIDDLEWARE=middleware):
        yield project


def state(client: redis.Redis, prefix: str, target: str, key: str) -> bytes | None:
    record = record_for(prefix, NO_CREDENTIALS, "POST", target, key)
    found: bytes | None = client.hget(record.key, "state")
    return found


def send(under: str, target: str, key: str, **options: Any) -> Any:
    """POST ``target`` with ``key`` through a new test client, WSGI's or ASGI's."""
    from django.test import AsyncClient, Client

    headers = {"Idempotency-Key": key}
    if under == "wsgi":
        return Client(**options).post(target, headers=headers)
    return async_to_sync(AsyncClient(**options).post)(target, headers=headers)


HANDLERS = ["wsgi", "asgi"]
RAISING = ["/raises", "/async-raises", "/commits"]


@pytest.mark.parametrize("under", HANDLERS)
@pytest.mark.parametrize("target", RAISING)
@pytest.mark.parametrize("store_server_errors", [True, False])
def test_a_view_or_a_lower_middleware_that_raised_releases_the_key(
    raised: dict[str, Any],
    real_client: redis.Redis,
    prefix: str,
    under: str,
    target: str,
    store_server_errors: bool,
) -> None:
    raised["STORE_SERVER_ERRORS"] = store_server_errors
    for run in (1, 2):
        response = send(under, target, "r1", raise_request_exception=False)
        assert response.status_code == 500
        assert "Idempotent-Replayed" not in response.headers
        assert runs(real_client, prefix, "r1") == run  # released: the retry ran
    assert state(real_client, prefix, target, "r1") is None


@pytest.mark.parametrize("under", HANDLERS)
@pytest.mark.parametrize("target", ["/answers-500", "/rendered"])
def test_a_500_answered_is_stored_under_store_server_errors(
    raised: dict[str, Any], real_client: redis.Redis, prefix: str, under: str, target: str
) -> None:
    """The view's own 500, or a ``process_exception`` renderer's answer (no exception left
    for Django to turn into its 500): an outcome, replayed."""
    raised["STORE_SERVER_ERRORS"] = True
    first = send(under, target, "a1")
    again = send(under, target, "a1")
    assert (first.status_code, again.status_code) == (500, 500)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert runs(real_client, prefix, "a1") == 1


@pytest.mark.parametrize("under", HANDLERS)
@pytest.mark.parametrize("target", ["/answers-500", "/rendered"])
def test_a_500_answered_is_released_by_default(
    raised: dict[str, Any], real_client: redis.Redis, prefix: str, under: str, target: str
) -> None:
    for run in (1, 2):
        assert send(under, target, "d1").status_code == 500
        assert runs(real_client, prefix, "d1") == run
    assert state(real_client, prefix, target, "d1") is None


@pytest.mark.parametrize("under", HANDLERS)
@pytest.mark.parametrize("target", RAISING)
def test_the_exception_the_test_client_raises_released_the_key(
    raised: dict[str, Any], real_client: redis.Redis, prefix: str, under: str, target: str
) -> None:
    """``raise_request_exception=True`` (the default): Django answered its 500, which the
    client turns back into the exception."""
    raised["STORE_SERVER_ERRORS"] = True
    for run in (1, 2):
        with pytest.raises(RuntimeError):
            send(under, target, "t1")
        assert runs(real_client, prefix, "t1") == run
    assert state(real_client, prefix, target, "t1") is None


@pytest.mark.parametrize("under", HANDLERS)
@pytest.mark.parametrize("target", RAISING)
def test_an_exception_django_propagates_releases_the_key(
    raised: dict[str, Any], real_client: redis.Redis, prefix: str, under: str, target: str
) -> None:
    """``DEBUG_PROPAGATE_EXCEPTIONS``: the exception comes out through idemkey's middleware."""
    from django.test.utils import override_settings

    raised["STORE_SERVER_ERRORS"] = True
    with override_settings(DEBUG_PROPAGATE_EXCEPTIONS=True):
        for run in (1, 2):
            with pytest.raises(RuntimeError):
                send(under, target, "p1", raise_request_exception=False)
            assert runs(real_client, prefix, "p1") == run
    assert state(real_client, prefix, target, "p1") is None
