"""The Flask extension beyond the shared suite: configuration, the app factory pattern, several
apps in one process, per-view overrides, the route template, abort(), g, after_request hooks."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from flask import Flask, Response, abort, g, request

from idemkey import ConfigurationError, Policy, RedisStore
from idemkey._core import record_for
from idemkey.adapters.flask import Idemkey
from idemkey.policy import credential_scope
from tests._servers import free_port
from tests.adapters.harness import store_on

if TYPE_CHECKING:
    from collections.abc import Iterator

    from flask.testing import FlaskClient


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis), "fakeredis"])
def backend(request: pytest.FixtureRequest) -> str:
    """Tests taking ``store`` run on the real Redis, then on fakeredis[lua]."""
    name: str = request.param
    return name


@pytest.fixture
def store(backend: str, request: pytest.FixtureRequest, prefix: str) -> Iterator[RedisStore]:
    url = request.getfixturevalue("redis_url") if backend == "redis" else None
    with store_on(url, Policy(prefix=prefix)) as store:
        yield store


def build(idem: Idemkey, name: str = "app", **config: Any) -> Flask:
    """An app factory: one module-level Idemkey, a fresh app each call."""
    app = Flask(name)
    app.config.update(config)
    runs: dict[str, int] = {}
    app.config["RUNS"] = runs

    @app.post("/items/<int:item_id>")
    @idem.idempotent
    def create_item(item_id: int) -> Any:
        runs["items"] = runs.get("items", 0) + 1
        return {
            "item": item_id,
            "run": runs["items"],
            "fence": g.idemkey.claim.fence if g.get("idemkey") else None,
        }, 201

    @app.post("/optional")
    @idem.idempotent(required=False)
    def optional() -> Any:
        runs["optional"] = runs.get("optional", 0) + 1
        return {"run": runs["optional"]}, 201

    @app.post("/abort/<int:code>")
    @idem.idempotent
    def aborting(code: int) -> Any:
        runs["abort"] = runs.get("abort", 0) + 1
        abort(code)

    @app.after_request
    def stamp(response: Any) -> Any:
        response.headers["X-After"] = "yes"
        return response

    idem.init_app(app)
    return app


def post(client: FlaskClient, path: str, key: str | None = "k", **headers: str) -> Any:
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.post(path, headers=headers, json={"n": 1})


def test_app_factory_and_two_apps_in_one_process(store: RedisStore) -> None:
    idem = Idemkey(store=store)
    one = build(idem, "one")
    two = build(idem, "two", IDEMKEY_PREFIX=store.policy.prefix + "two")
    assert one.extensions["idemkey"].policy.prefix == store.policy.prefix
    assert two.extensions["idemkey"].policy.prefix == store.policy.prefix + "two"
    c1, c2 = one.test_client(), two.test_client()
    assert post(c1, "/items/1").status_code == 201
    # Same key, same route, the other app's prefix: an independent record.
    assert post(c2, "/items/1").status_code == 201
    assert post(c1, "/items/1").headers["Idempotent-Replayed"] == "true"
    assert one.config["RUNS"] == {"items": 1}
    assert two.config["RUNS"] == {"items": 1}
    assert not hasattr(idem, "app")  # no stored app


def test_an_app_factory_receives_its_store_through_init_app() -> None:
    """`create_app(store=...)` as a test passes one: init_app(app, store=) wins over the
    constructor's store and IDEMKEY_REDIS_URL (a URL nothing listens on: never dialled)."""
    from idemkey.testing import fake_store

    idem = Idemkey()
    one, two = fake_store(), fake_store()
    apps = []
    for store in (one, two):
        app = Flask("factory")
        app.config["IDEMKEY_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"
        app.post("/charges")(idem.idempotent(lambda: ({"id": "ch_1"}, 201)))
        idem.init_app(app, store=store)
        apps.append(app)
    assert [app.extensions["idemkey"].store for app in apps] == [one, two]
    client = apps[0].test_client()
    assert post(client, "/charges").status_code == 201
    assert post(client, "/charges").headers["Idempotent-Replayed"] == "true"


def test_configured_from_idemkey_config_keys(redis_url: str, prefix: str) -> None:
    config = {
        "IDEMKEY_REDIS_URL": redis_url,
        "IDEMKEY_TTL": 120,
        "IDEMKEY_LEASE": 5,
        "IDEMKEY_WAIT": 1.5,
        "IDEMKEY_PREFIX": prefix,
        "IDEMKEY_REQUIRE_KEY": False,
        "IDEMKEY_MAX_REQUEST_BYTES": 10,
        "IDEMKEY_METHODS": ["post"],
    }
    app = build(Idemkey(), **config)
    state = app.extensions["idemkey"]
    policy = state.policy
    assert (policy.ttl, policy.lease, policy.wait, policy.prefix) == (120, 5, 1.5, prefix)
    assert policy.require_key is False
    assert policy.max_request_bytes == 10
    assert policy.methods == frozenset({"POST"})
    assert state.store.policy is policy
    client = app.test_client()
    try:
        assert post(client, "/items/1", key=None).status_code == 201  # key not required
        too_big = client.post("/items/1", headers={"Idempotency-Key": "k"}, data=b"x" * 11)
        assert too_big.status_code == 413
        assert too_big.json["code"] == "request_too_large"  # type: ignore[index]
    finally:
        state.store.close()
        state.store.client.close()
        from tests.conftest import _purge_prefix

        _purge_prefix(redis_url, prefix)


def test_without_store_or_redis_url_init_app_fails() -> None:
    with pytest.raises(ConfigurationError, match="IDEMKEY_REDIS_URL"):
        Idemkey(Flask("x"))


def test_view_of_an_app_without_init_app_fails_clearly(store: RedisStore) -> None:
    idem = Idemkey(store=store)
    app = Flask("bare")
    app.config["PROPAGATE_EXCEPTIONS"] = True

    @app.post("/x")
    @idem.idempotent
    def view() -> str:
        return "x"

    with pytest.raises(ConfigurationError, match="init_app"):
        app.test_client().post("/x", headers={"Idempotency-Key": "k"})


def test_unknown_override_fails_at_decoration(store: RedisStore) -> None:
    with pytest.raises(ConfigurationError, match="nonsense"):
        Idemkey(store=store).idempotent(nonsense=1)


def test_per_view_override(store: RedisStore) -> None:
    app = build(Idemkey(store=store))
    client = app.test_client()
    assert post(client, "/optional", key=None).status_code == 201
    assert post(client, "/optional", key=None).status_code == 201
    assert app.config["RUNS"]["optional"] == 2
    assert post(client, "/items/1", key=None).status_code == 400  # other views still require it


def test_an_async_view_runs_once_and_is_replayed(store: RedisStore) -> None:
    """Flask runs an async view (flask[async]) through app.ensure_sync, which sees idemkey's
    sync wrapper: the view's coroutine was returned unawaited, a 500, the body never run."""
    idem = Idemkey(store=store)
    app = Flask("async_views")
    runs: list[str] = []

    @app.post("/charges")
    @idem.idempotent
    async def charge() -> Any:
        runs.append("guarded")
        return {"charge": len(runs)}, 201

    @app.post("/optional")
    @idem.idempotent(required=False)
    async def optional() -> Any:
        runs.append("unkeyed")
        return {"ok": True}, 201

    idem.init_app(app)
    client = app.test_client()
    first, again = post(client, "/charges"), post(client, "/charges")
    assert (first.status_code, again.status_code) == (201, 201), first.get_data()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json == first.json == {"charge": 1}
    assert post(client, "/optional", key=None).status_code == 201
    assert runs == ["guarded", "unkeyed"]


@pytest.mark.parametrize("name", ["Content-Length", "content-length"])
def test_a_body_past_its_content_length_is_never_replayed(store: RedisStore, name: str) -> None:
    """A view whose body runs past the Content-Length it declares: no server sends those
    bytes, so the replay does not either (Flask's was replayed whole, 11 bytes for a declared
    5, where the WSGI, ASGI and Django adapters cut it)."""
    idem = Idemkey(store=store)
    app = Flask("overlong")
    runs: list[str] = []

    def answer(length: str) -> Response:
        response = Response(b"hello world", 201)
        response.headers[name] = length  # after the body: set_data would correct it
        return response

    @app.post("/overlong")
    @idem.idempotent
    def overlong() -> Any:
        runs.append("overlong")
        return answer("5")

    @app.post("/exact")
    @idem.idempotent
    def exact() -> Any:
        runs.append("exact")
        return answer("11")

    idem.init_app(app)
    client = app.test_client()
    post(client, "/overlong")
    again = post(client, "/overlong")
    assert again.headers["Idempotent-Replayed"] == "true"
    assert (again.get_data(), again.headers["Content-Length"]) == (b"hello", "5")
    post(client, "/exact", key="e")
    again = post(client, "/exact", key="e")
    assert (again.get_data(), again.headers["Content-Length"]) == (b"hello world", "11")
    assert runs == ["overlong", "exact"]


def test_the_route_template_names_the_record(store: RedisStore) -> None:
    app = build(Idemkey(store=store))
    client = app.test_client()
    first = post(client, "/items/1", Authorization="Bearer t")
    assert first.status_code == 201
    assert first.json["fence"] > 0  # type: ignore[index]
    # One record per route template, so another item with the same key is the same record
    # with another request: 422, never a second run.
    assert post(client, "/items/2", Authorization="Bearer t").status_code == 422
    with app.test_request_context("/items/1", headers={"Authorization": "Bearer t"}):
        from idemkey.http import Headers, Request

        scope = credential_scope(Request("POST", "/items/1", "", Headers(request.headers.items())))
    record = record_for(store.policy.prefix, scope, "POST", "/items/<int:item_id>", "k")
    assert store.client.exists(record.key) == 1


def test_abort_with_an_outcome_410_is_stored_and_never_began_is_released(store: RedisStore) -> None:
    app = build(Idemkey(store=store))
    client = app.test_client()
    first = post(client, "/abort/410")
    assert first.status_code == 410
    again = post(client, "/abort/410")
    assert again.status_code == 410
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.data == first.data
    assert post(client, "/abort/404", key="n").status_code == 404
    assert post(client, "/abort/404", key="n").status_code == 404
    assert app.config["RUNS"]["abort"] == 3


def test_after_request_hooks_run_on_replays_too(store: RedisStore) -> None:
    app = build(Idemkey(store=store))
    client = app.test_client()
    first = post(client, "/items/1")
    again = post(client, "/items/1")
    assert first.headers["X-After"] == again.headers["X-After"] == "yes"
    assert json.loads(again.data) == json.loads(first.data)


def test_view_exception_releases_the_key(store: RedisStore) -> None:
    idem = Idemkey(store=store)
    app = Flask("boom")
    runs = []

    @app.post("/boom")
    @idem.idempotent
    def boom() -> str:
        runs.append(1)
        raise RuntimeError("boom")

    idem.init_app(app)
    app.config["PROPAGATE_EXCEPTIONS"] = True
    client = app.test_client()
    for _ in range(2):
        with pytest.raises(RuntimeError):
            client.post("/boom", headers={"Idempotency-Key": "k"})
    assert len(runs) == 2


def test_a_down_redis_does_not_stop_init_app() -> None:
    # redis-py connects lazily: the app starts, and its keyed requests get 503 until Redis is up.
    app = Flask("lazy")
    app.config["IDEMKEY_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"
    idem = Idemkey(app)

    @app.post("/x")
    @idem.idempotent
    def view() -> str:
        return "ran"

    store = app.extensions["idemkey"].store
    try:
        reply = app.test_client().post("/x", headers={"Idempotency-Key": "k"})
        assert reply.status_code == 503
        assert reply.json["code"] == "store_unavailable"  # type: ignore[index]
        assert reply.headers["Retry-After"].isdigit()
    finally:
        store.close()
        store.client.close()
