"""Django: the middleware in settings.MIDDLEWARE, through Django's test Client (WSGI and ASGI)
and real servers (gunicorn for WSGI, uvicorn for ASGI Django), on the session's real Redis.

The project is tests/frameworks/djangoproject. Django's settings are global to the process
(and the adapter suite's Django harness configures them first), so in-process tests apply the
project's settings with ``override_settings``.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from idemkey import Event
from tests._servers import AppServer, wait_until

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "tests.frameworks.djangoproject"
JSON = "application/json"


def runs(client: redis.Redis, prefix: str, view: str) -> int:
    return int(client.get(f"{prefix}:runs:{view}") or 0)


@pytest.fixture
def project(redis_url: str, prefix: str, real_client: redis.Redis) -> Iterator[dict[str, Any]]:
    """The project's settings, applied for this test; yields the IDEMKEY dict to extend."""
    from django.test.utils import override_settings

    from tests.adapters.harness_wsgi import _django
    from tests.frameworks.djangoproject import settings as project_settings

    _django()  # configure Django once per process, the way the adapter suite does
    idemkey: dict[str, Any] = {"REDIS_URL": redis_url, "PREFIX": prefix, "LEASE": 10.0}
    with override_settings(
        ROOT_URLCONF=project_settings.ROOT_URLCONF,
        MIDDLEWARE=project_settings.MIDDLEWARE,
        ALLOWED_HOSTS=["*"],
        REDIS_URL=redis_url,
        IDEMKEY=idemkey,
    ):
        yield idemkey


def post(client: Any, path: str, key: str | None, body: object = None, **extra: str) -> Any:
    headers = {name.replace("_", "-"): value for name, value in extra.items()}
    if key is not None:
        headers["Idempotency-Key"] = key
    data = json.dumps(body if body is not None else {"amount": 5})
    return client.post(path, data=data, content_type=JSON, headers=headers)


def test_a_decorated_view_is_guarded_through_the_test_client(
    project: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    from django.test import Client

    client = Client()
    first = post(client, "/charges", "k1")
    again = post(client, "/charges", "k1")
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert runs(real_client, prefix, "charges") == 1
    reused = post(client, "/charges", "k1", {"amount": 6})
    assert reused.status_code == 422
    assert reused.headers["Content-Type"] == "application/problem+json"
    assert reused.json()["code"] == "key_reused"
    missing = post(client, "/charges", None)
    assert missing.status_code == 400
    assert missing.json()["code"] == "missing_key"
    assert runs(real_client, prefix, "charges") == 1


def test_a_custom_reason_phrase_is_replayed(project: dict[str, Any]) -> None:
    from django.test import Client

    client = Client()
    first = post(client, "/reasoned", "r1")
    again = post(client, "/reasoned", "r1")
    assert (first.status_code, first.reason_phrase) == (201, "Charged OK")
    assert again.headers["Idempotent-Replayed"] == "true"
    assert (again.status_code, again.reason_phrase) == (201, "Charged OK")


def test_undecorated_and_exempt_views_are_not_guarded(
    project: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    from django.test import Client

    client = Client()
    assert post(client, "/login", None).status_code == 200
    assert post(client, "/login", "same").status_code == 200
    assert post(client, "/login", "same").status_code == 200  # a key means nothing here
    assert post(client, "/webhook", "same").status_code == 200
    assert runs(real_client, prefix, "login") == 3  # each ran: nothing was replayed
    records = [k for k in real_client.scan_iter(match=f"{prefix}*") if b":runs:" not in k]
    assert records == []  # no record was ever written


def test_guard_all_guards_every_view_but_the_exempt_ones(
    project: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    from django.test import Client

    project["GUARD"] = "all"
    client = Client()
    assert post(client, "/login", None).status_code == 400
    assert post(client, "/login", "k").status_code == 200
    assert post(client, "/login", "k").headers["Idempotent-Replayed"] == "true"
    assert post(client, "/webhook", None).status_code == 200  # @idempotency_exempt
    assert runs(real_client, prefix, "login") == 1


def test_the_scope_is_the_user_and_the_route_is_the_resolver_pattern(
    project: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    from django.test import Client

    events: list[Event] = []
    project["ON_EVENT"] = events.append
    client = Client()
    alice = post(client, "/charges", "same", Authorization="Token alice")
    bob = post(client, "/charges", "same", Authorization="Token bob")
    assert alice.json()["user"] == "alice"
    assert bob.json()["user"] == "bob"  # another user: another record, another run
    again = post(client, "/charges", "same", Authorization="Token alice:another-session")
    assert again.json() == alice.json()  # the same user, whatever the credential
    assert again.headers["Idempotent-Replayed"] == "true"
    assert runs(real_client, prefix, "charges") == 2
    for charge_id in (1, 2, 3):
        assert post(client, f"/charges/{charge_id}/refund", f"r{charge_id}").status_code == 200
    assert post(client, "/charges/1/refund", None).status_code == 200  # required=False
    routes = {event.route for event in events}
    assert routes == {"/charges", "/charges/<int:charge_id>/refund"}


def test_a_scope_callable_from_settings(
    project: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    from django.test import Client

    project["SCOPE"] = lambda request: request.headers.get("X-Tenant", "none")
    client = Client()
    one = post(client, "/charges", "k", X_Tenant="t1", Authorization="Token a")
    same = post(client, "/charges", "k", X_Tenant="t1", Authorization="Token b")
    assert same.json() == one.json()  # one tenant, whoever the user
    assert same.headers["Idempotent-Replayed"] == "true"
    assert runs(real_client, prefix, "charges") == 1


def test_a_duplicate_while_the_first_runs_is_409(
    project: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    from django.test import Client

    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(post(Client(), "/slow", "s")))
    first.start()
    try:
        wait_until(lambda: real_client.exists(f"{prefix}:started"), 10, "the first request")
        duplicate = post(Client(), "/slow", "s")
    finally:
        real_client.set(f"{prefix}:gate", 1)
        first.join(15)
    assert duplicate.status_code == 409
    assert duplicate.headers["Retry-After"] == "1"
    assert [r.status_code for r in results] == [200]
    assert post(Client(), "/slow", "s").headers["Idempotent-Replayed"] == "true"


async def test_asgi_django_through_the_async_test_client(
    project: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    from django.test import AsyncClient

    client = AsyncClient()
    headers = {"Idempotency-Key": "a1"}
    data = json.dumps({"amount": 7})
    first = await client.post("/charges", data=data, content_type=JSON, headers=headers)
    again = await client.post("/charges", data=data, content_type=JSON, headers=headers)
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert runs(real_client, prefix, "charges") == 1
    one = await client.post("/async-charges", data=data, content_type=JSON, headers=headers)
    two = await client.post("/async-charges", data=data, content_type=JSON, headers=headers)
    assert (one.status_code, two.status_code) == (201, 201)
    assert two.headers["Idempotent-Replayed"] == "true"
    assert one.json() == {"async": True, "body": data}


# ---- real servers ---------------------------------------------------------------------------


@contextlib.contextmanager
def serving(command: list[str], redis_url: str, prefix: str, log: Path) -> Iterator[str]:
    def argv(port: int) -> list[str]:
        return [sys.executable, "-m", *[part.replace("PORT", str(port)) for part in command]]

    with AppServer(
        argv, log=log, cwd=ROOT, env={"DJANGO_SETTINGS_MODULE": f"{PROJECT}.settings"},
        redis_url=redis_url, prefix=prefix,
    ) as server:  # fmt: skip
        yield server.url


SERVERS = {
    "gunicorn-wsgi": [
        "gunicorn", "--worker-class", "gthread", "--threads", "4", "--bind", "127.0.0.1:PORT",
        "--log-level", "warning", f"{PROJECT}.wsgi:application",
    ],
    "uvicorn-asgi": [
        "uvicorn", "--port", "PORT", "--log-level", "warning", f"{PROJECT}.asgi:application",
    ],
}  # fmt: skip


@pytest.mark.parametrize("server", list(SERVERS))
def test_a_real_server_sees_replays_409_and_422(
    server: str, redis_url: str, prefix: str, real_client: redis.Redis, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"
    with (
        serving(SERVERS[server], redis_url, prefix, log) as base,
        httpx.Client(base_url=base, timeout=20) as http,
    ):
        if True:
            key = {"Idempotency-Key": "k1", "Content-Type": JSON}
            first = http.post("/charges", content=b'{"amount": 5}', headers=key)
            again = http.post("/charges", content=b'{"amount": 5}', headers=key)
            assert (first.status_code, again.status_code) == (201, 201)
            assert again.headers["Idempotent-Replayed"] == "true"
            assert again.content == first.content
            reused = http.post("/charges", content=b'{"amount": 6}', headers=key)
            assert reused.status_code == 422
            assert runs(real_client, prefix, "charges") == 1

            results: list[httpx.Response] = []
            slow = threading.Thread(
                target=lambda: results.append(http.post("/slow", headers={"Idempotency-Key": "s"}))
            )
            slow.start()
            try:
                wait_until(lambda: real_client.exists(f"{prefix}:started"), 10, "the first run")
                duplicate = http.post("/slow", headers={"Idempotency-Key": "s"})
            finally:
                real_client.set(f"{prefix}:gate", 1)
                slow.join(15)
            assert duplicate.status_code == 409
            assert duplicate.json()["code"] == "in_flight"
            assert [r.status_code for r in results] == [200]
            assert runs(real_client, prefix, "slow") == 1


def make_client() -> redis.Redis:
    """A client factory, named by its dotted path in IDEMKEY["CLIENT"] below."""
    from django.conf import settings

    return redis.Redis.from_url(settings.REDIS_URL)


@pytest.mark.parametrize(
    "client", [make_client, f"{__name__}.make_client"], ids=["callable", "dotted-path"]
)
def test_the_client_from_a_factory(project: dict[str, Any], client: Any) -> None:
    from django.test import Client

    del project["REDIS_URL"]
    project["CLIENT"] = client
    django = Client()
    assert post(django, "/charges", "f").status_code == 201
    assert post(django, "/charges", "f").headers["Idempotent-Replayed"] == "true"


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"PREFIX": "x"}, "REDIS_URL"),
        ({"REDIS_URL": "redis://127.0.0.1:1/0", "GUARD": "some"}, "GUARD"),
        (
            {"REDIS_URL": "redis://127.0.0.1:1/0", "TLL": 5},
            r'IDEMKEY\["TLL"\] \(Django settings\): not a Policy field; did you mean IDEMKEY\["TTL',
        ),
        ({"STORE": "not a store"}, "STORE"),
    ],
)
def test_bad_settings_are_configuration_errors(settings: dict[str, Any], error: str) -> None:
    from django.test.utils import override_settings

    from idemkey import ConfigurationError
    from idemkey.adapters.django import IdempotencyMiddleware
    from tests.adapters.harness_wsgi import _django

    _django()
    with override_settings(IDEMKEY=settings), pytest.raises(ConfigurationError, match=error):
        IdempotencyMiddleware(lambda request: None)
