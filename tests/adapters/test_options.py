"""Every way an option reaches a Policy types and checks it, and the error names the option as
that path spells it (issue 20 items 10 and 13a).

On main, ``IDEMKEY_METHODS = "POST"`` in Flask config and ``@idem.idempotent(methods="POST")``
became the methods ``{'P', 'O', 'S', 'T'}``: the view ran unguarded, silently. Each path below
is taken as a user writes it: Flask config and ``init_app``, the Flask view decorator, Django's
``IDEMKEY`` setting and its ``@idempotent``, ``route()``, FastAPI's and Starlette's
``idem.guard(...)``, and a guard's policy. The valid spellings (a list of lower-case methods)
still guard a POST, through the real frameworks on the session's Redis.

13a: with ``required=False`` and no key, ``g.idemkey`` raised AttributeError in the view (a 500).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import httpx
import pytest
import redis
import redis.asyncio
from flask import Flask, g

from idemkey import AsyncRedisStore, ConfigurationError, Policy, RedisStore, current_call, guard
from idemkey.routes import route

DEAD = "redis://127.0.0.1:1/0"  # a client is built, never used: every error comes first


class OptionPath(NamedTuple):
    """One way a user hands idemkey options, and how its errors name an option."""

    name: str
    apply: Callable[[dict[str, Any]], object]
    label: Callable[[str], str]


def _flask_config(options: dict[str, Any]) -> object:
    from idemkey.adapters.flask import Idemkey

    app = Flask("config")
    app.config["IDEMKEY_REDIS_URL"] = DEAD
    app.config.update({f"IDEMKEY_{name.upper()}": value for name, value in options.items()})
    return Idemkey(app)


def _flask_view(options: dict[str, Any]) -> object:
    from idemkey.adapters.flask import Idemkey

    idem = Idemkey(store=RedisStore(redis.Redis.from_url(DEAD)))
    return idem.idempotent(**options)(lambda: "ok")


def _django_settings(options: dict[str, Any]) -> object:
    from django.test.utils import override_settings

    from idemkey.adapters.django import IdempotencyMiddleware
    from tests.adapters.harness_wsgi import _django

    _django()
    settings = {"REDIS_URL": DEAD, **{name.upper(): value for name, value in options.items()}}
    with override_settings(IDEMKEY=settings):
        return IdempotencyMiddleware(lambda request: None)  # type: ignore[arg-type,return-value]


def _django_view(options: dict[str, Any]) -> object:
    from idemkey.adapters.django import idempotent

    return idempotent(**options)(lambda request: None)


def _fastapi_guard(options: dict[str, Any]) -> object:
    from idemkey.adapters.fastapi import Idempotency

    return Idempotency(AsyncRedisStore(redis.asyncio.Redis.from_url(DEAD))).guard(**options)


def _starlette_guard(options: dict[str, Any]) -> object:
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from idemkey.adapters.starlette import Idempotency

    idem = Idempotency(AsyncRedisStore(redis.asyncio.Redis.from_url(DEAD)))
    endpoint = Route("/charges", lambda request: PlainTextResponse("ok"), methods=["POST"])
    return idem.guard(endpoint, **options)


def _guard_policy(options: dict[str, Any]) -> object:
    store = RedisStore(redis.Redis.from_url(DEAD))
    return guard(store, "order-1", policy=store.policy.replace(**options))


PATHS = [
    OptionPath("flask_config", _flask_config, lambda n: f"IDEMKEY_{n.upper()} (Flask config)"),
    OptionPath("flask_view", _flask_view, lambda n: f"@idem.idempotent({n}=...)"),
    OptionPath(
        "django_settings", _django_settings, lambda n: f'IDEMKEY["{n.upper()}"] (Django settings)'
    ),
    OptionPath("django_view", _django_view, lambda n: f"@idempotent({n}=...)"),
    OptionPath(
        "route",
        lambda options: route("/charges", **options),
        lambda n: f"route('/charges', {n}=...)",
    ),
    OptionPath("fastapi_guard", _fastapi_guard, lambda n: f"idem.guard({n}=...)"),
    OptionPath(
        "starlette_guard", _starlette_guard, lambda n: f"idem.guard(<Route '/charges'>, {n}=...)"
    ),
    OptionPath("guard_policy", _guard_policy, lambda n: f"Policy({n}=...)"),
]

#: (option, value, what the error says after the option's label; None: an unknown option).
BAD: list[tuple[str, object, str | None]] = [
    ("methods", "POST", "expected a collection of method names, got the string 'POST'"),
    ("header_denylist", "set-cookie", "expected a collection of header names, got the string"),
    ("tll", 60, None),
    ("lease", -1, "expected a finite number of seconds > 0, got -1 (int)"),
    ("lease", "30", "expected a number of seconds > 0, got the string '30'"),
    ("wait", math.nan, "expected a finite number of seconds >= 0, got nan"),
    ("store_error_retry_after", -2.5, "expected a finite number of seconds >= 0, got -2.5"),
]


@pytest.mark.parametrize("path", PATHS, ids=[p.name for p in PATHS])
@pytest.mark.parametrize(("option", "value", "says"), BAD, ids=[f"{o}={v!r}" for o, v, _ in BAD])
def test_a_bad_option_is_a_configuration_error_naming_it_and_its_source(
    path: OptionPath, option: str, value: object, says: str | None
) -> None:
    if says is None:  # an unknown name: the error offers the nearest field, as spelled here
        says = f"not a Policy field; did you mean {path.label('ttl')}?"
    with pytest.raises(ConfigurationError) as raised:
        path.apply({option: value})
    assert str(raised.value).startswith(f"{path.label(option)}: {says}"), str(raised.value)


def test_an_idemkey_config_key_that_is_no_field_is_refused_and_so_is_an_unread_redis_key() -> None:
    # A typo was silently ignored on main; so was every IDEMKEY_REDIS_* key but the URL.
    with pytest.raises(ConfigurationError, match=re.escape("IDEMKEY_REQUIRED_KEY (Flask config)")):
        _flask_config({"required_key": False})
    with pytest.raises(
        ConfigurationError,
        match=re.escape("IDEMKEY_REDIS_OPTIONS (Flask config): not a key idemkey reads"),
    ):
        _flask_config({"redis_options": {"socket_timeout": 1}})


def test_a_lease_longer_than_the_ttl_names_the_source() -> None:
    with pytest.raises(
        ConfigurationError, match=re.escape("Flask config (IDEMKEY_*): Policy: need")
    ):
        _flask_config({"ttl": 10, "lease": 60})
    with pytest.raises(ConfigurationError, match=re.escape("settings.IDEMKEY: Policy: need")):
        _django_settings({"ttl": 10, "lease": 60})
    # A view's lease over the app's ttl: known at init_app, not in the view's first request.
    from idemkey.adapters.flask import Idemkey

    idem = Idemkey()
    idem.idempotent(lease=60)(lambda: "ok")
    app = Flask("lease")
    app.config.update(IDEMKEY_REDIS_URL=DEAD, IDEMKEY_TTL=10, IDEMKEY_LEASE=5)
    with pytest.raises(ConfigurationError, match=re.escape("@idem.idempotent(...) with the app")):
        idem.init_app(app)


def test_fastapi_router_refuses_a_policy_option_and_points_to_the_guard() -> None:
    from idemkey.adapters.fastapi import Idempotency

    idem = Idempotency(AsyncRedisStore(redis.asyncio.Redis.from_url(DEAD)))
    with pytest.raises(ConfigurationError, match=re.escape("idem.router(wait=...): not an APIR")):
        idem.router(prefix="/refunds", wait=2.0)
    assert idem.router(prefix="/refunds").prefix == "/refunds"


# ---- the valid spellings still guard a POST, through the real frameworks ---------------------


def _replays(first: Any, again: Any) -> None:
    assert first.status_code == again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers


@pytest.mark.redis
def test_flask_config_and_view_options_with_lower_case_method_lists_guard_a_post(
    redis_url: str, prefix: str
) -> None:
    from idemkey.adapters.flask import Idemkey

    idem = Idemkey()
    app = Flask("valid")
    app.config.update(IDEMKEY_REDIS_URL=redis_url, IDEMKEY_PREFIX=prefix, IDEMKEY_TTL=60)
    app.config["IDEMKEY_METHODS"] = ["post"]
    runs = {"config": 0, "view": 0}

    @app.post("/config")
    @idem.idempotent
    def by_config() -> Any:
        runs["config"] += 1
        return {"run": runs["config"]}, 201

    @app.route("/view", methods=["PUT", "POST"])
    @idem.idempotent(methods=("put",), lease=5)
    def by_view() -> Any:
        runs["view"] += 1
        return {"run": runs["view"]}, 201

    idem.init_app(app)
    client = app.test_client()
    try:
        key = {"Idempotency-Key": "k1"}
        _replays(
            client.post("/config", json={}, headers=key),
            client.post("/config", json={}, headers=key),
        )
        _replays(
            client.put("/view", json={}, headers=key), client.put("/view", json={}, headers=key)
        )
        assert client.post("/view", json={}).status_code == 201  # POST is not this view's method
        assert runs == {"config": 1, "view": 2}
    finally:
        app.extensions["idemkey"].store.client.close()


@pytest.fixture
def django_project(redis_url: str, prefix: str) -> Iterator[dict[str, Any]]:
    from django.test.utils import override_settings

    from tests.adapters.harness_wsgi import _django
    from tests.frameworks.djangoproject import settings as project_settings

    _django()
    idemkey: dict[str, Any] = {"REDIS_URL": redis_url, "PREFIX": prefix, "LEASE": 10}
    with override_settings(
        ROOT_URLCONF=project_settings.ROOT_URLCONF,
        MIDDLEWARE=project_settings.MIDDLEWARE,
        ALLOWED_HOSTS=["*"],
        REDIS_URL=redis_url,
        IDEMKEY=idemkey,
    ):
        yield idemkey


@pytest.mark.redis
def test_django_methods_setting_as_a_lower_case_list_guards_a_post(
    django_project: dict[str, Any],
) -> None:
    from django.test import Client

    django_project["METHODS"] = ["post"]
    client = Client()
    body = json.dumps({"amount": 5})
    first, again = (
        client.post(
            "/charges",
            data=body,
            content_type="application/json",
            headers={"Idempotency-Key": "k1"},
        )
        for _ in range(2)
    )
    _replays(first, again)
    assert again.content == first.content


@pytest.mark.redis
async def test_fastapi_and_starlette_guards_with_lower_case_method_lists_guard_a_post(
    redis_url: str, prefix: str
) -> None:
    from fastapi import FastAPI
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from idemkey.adapters import fastapi as fastapi_adapter
    from idemkey.adapters import starlette as starlette_adapter

    client = redis.asyncio.Redis.from_url(redis_url)
    store = AsyncRedisStore(client, Policy(prefix=prefix))
    runs = {"fastapi": 0, "starlette": 0}

    api = FastAPI()
    api.router.route_class = fastapi_adapter.IdempotentRoute
    guard_fastapi = fastapi_adapter.Idempotency(store).guard(methods=["post"], wait=0)

    @api.post("/charges", status_code=201, dependencies=[guard_fastapi])
    async def create_charge() -> dict[str, int]:
        runs["fastapi"] += 1
        return {"run": runs["fastapi"]}

    async def charge(request: Any) -> JSONResponse:
        runs["starlette"] += 1
        return JSONResponse({"run": runs["starlette"]}, status_code=201)

    guard_starlette = starlette_adapter.Idempotency(store).guard
    star = Starlette(
        routes=[guard_starlette(Route("/charges", charge, methods=["POST"]), methods={"post"})]
    )
    try:
        for name, app in (("fastapi", api), ("starlette", star)):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
                key = {"Idempotency-Key": f"k-{name}"}
                first = await http.post("/charges", json={}, headers=key)
                again = await http.post("/charges", json={}, headers=key)
            _replays(first, again)
        assert runs == {"fastapi": 1, "starlette": 1}
    finally:
        await store.aclose()
        await client.aclose()


# ---- 13a: g.idemkey on every guarded request ----------------------------------------------


@pytest.mark.redis
def test_flask_g_idemkey_is_none_when_the_view_runs_without_a_claim(
    redis_url: str, prefix: str
) -> None:
    from idemkey.adapters.flask import Idemkey

    idem = Idemkey()
    app = Flask("optional")
    app.config.update(IDEMKEY_REDIS_URL=redis_url, IDEMKEY_PREFIX=prefix)

    @app.route("/charges", methods=["GET", "POST"])
    @idem.idempotent(required=False)
    def create_charge() -> Any:
        exchange = g.idemkey  # the README's way to the fencing token
        try:
            current: int | None = current_call().fence
        except LookupError:
            current = None
        fence = exchange.claim.fence if exchange is not None else None
        return {"fence": fence, "current": current}, 201

    idem.init_app(app)
    client = app.test_client()
    try:
        no_key = client.post("/charges", json={})  # on main: AttributeError, a 500
        assert no_key.status_code == 201, no_key.get_data(as_text=True)
        assert no_key.json == {"fence": None, "current": None}
        assert client.get("/charges").json == {"fence": None, "current": None}  # not guarded
        keyed = client.post("/charges", json={}, headers={"Idempotency-Key": "k1"})
        assert keyed.json is not None
        assert keyed.json["fence"] == keyed.json["current"] > 0  # the claim's own
        # The claim does not outlive its request (same thread, next request without a key).
        assert client.post("/charges", json={}).json == {"fence": None, "current": None}
    finally:
        app.extensions["idemkey"].store.client.close()


def test_flask_g_idemkey_is_none_when_redis_is_down_and_the_policy_runs_open() -> None:
    from idemkey.adapters.flask import Idemkey

    app = Flask("open")
    app.config.update(IDEMKEY_REDIS_URL=DEAD, IDEMKEY_ON_STORE_ERROR="open")

    @app.post("/charges")
    @Idemkey(app).idempotent
    def create_charge() -> Any:
        return {"claimed": g.idemkey is not None}, 201

    reply = app.test_client().post("/charges", json={}, headers={"Idempotency-Key": "k1"})
    assert (reply.status_code, reply.json) == (201, {"claimed": False})


def _current_fence() -> int | None:
    try:
        return current_call().fence
    except LookupError:
        return None


def _fence_view(request: Any) -> Any:
    from django.http import JsonResponse

    return JsonResponse({"current": _current_fence()}, status=201)


def __getattr__(name: str) -> Any:
    if name == "urlpatterns":  # this module is ROOT_URLCONF below; built lazily (Django)
        from django.urls import path

        from idemkey.adapters.django import idempotent

        return [path("optional", idempotent(required=False)(_fence_view))]
    raise AttributeError(name)


@pytest.mark.redis
async def test_the_other_adapters_agree_current_call_is_the_claim_or_lookup_error(
    redis_url: str, prefix: str
) -> None:
    """What Flask's ``g.idemkey`` says, every adapter says through ``current_call()``: the
    claim while the handler runs under one, else LookupError (no key with required=False)."""
    from fastapi import FastAPI

    from idemkey.adapters import fastapi as fastapi_adapter

    client = redis.asyncio.Redis.from_url(redis_url)
    store = AsyncRedisStore(client, Policy(prefix=prefix))
    api = FastAPI()
    api.router.route_class = fastapi_adapter.IdempotentRoute
    guard_optional = fastapi_adapter.Idempotency(store).guard(required=False)

    @api.post("/optional", status_code=201, dependencies=[guard_optional])
    async def optional() -> dict[str, int | None]:
        return {"current": _current_fence()}

    try:
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            answers = [
                (await http.post("/optional", json={}, headers=headers)).json()
                for headers in ({}, {"Idempotency-Key": "k1"}, {})
            ]
        assert answers == [{"current": None}, {"current": answers[1]["current"]}, {"current": None}]
        assert answers[1]["current"] > 0
    finally:
        await store.aclose()
        await client.aclose()


@pytest.mark.redis
def test_django_agrees_current_call_is_the_claim_or_lookup_error(
    redis_url: str, prefix: str
) -> None:
    from django.test import Client
    from django.test.utils import override_settings

    from tests.adapters.harness_wsgi import _django

    _django()
    with override_settings(
        ROOT_URLCONF=__name__,
        MIDDLEWARE=["idemkey.adapters.django.IdempotencyMiddleware"],
        IDEMKEY={"REDIS_URL": redis_url, "PREFIX": prefix},
    ):
        client = Client()
        answers = [
            json.loads(
                client.post(
                    "/optional", data=b"{}", content_type="application/json", **headers
                ).content
            )
            for headers in ({}, {"HTTP_IDEMPOTENCY_KEY": "k1"}, {})
        ]
    assert answers == [{"current": None}, {"current": answers[1]["current"]}, {"current": None}]
    assert answers[1]["current"] > 0


@pytest.mark.redis
def test_a_claimed_handlers_step_says_http_calls_have_no_steps(redis_url: str, prefix: str) -> None:
    """current_call().step() in a claimed Flask view: a UsageError that says why (2ba1d64 said
    the call "was replayed", of a call that was running)."""
    from idemkey.adapters.flask import Idemkey
    from idemkey.errors import UsageError

    app = Flask("steps")
    app.config.update(IDEMKEY_REDIS_URL=redis_url, IDEMKEY_PREFIX=prefix)

    @app.post("/charges")
    @Idemkey(app).idempotent
    def create_charge() -> Any:
        try:
            current_call().step("charge", lambda: 1)
        except UsageError as exc:
            return {"error": str(exc)}, 201
        return {"error": None}, 201

    try:
        reply = app.test_client().post("/charges", json={}, headers={"Idempotency-Key": "k1"})
        assert reply.status_code == 201
        assert "has no steps" in reply.json["error"]
        assert "replayed" not in reply.json["error"]
    finally:
        app.extensions["idemkey"].store.client.close()
