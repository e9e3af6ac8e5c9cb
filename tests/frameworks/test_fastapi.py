"""FastAPI: per-route and per-router opt-in, OpenAPI on guarded operations only; real Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import redis.asyncio
from fastapi import APIRouter, FastAPI, Request
from pydantic import BaseModel

from idemkey import AsyncRedisStore, ConfigurationError, Event, Policy
from idemkey.adapters.fastapi import Idempotency, IdempotentRoute


class Counting(redis.asyncio.Redis):
    """A client that counts the commands it sends (to show a route never touches Redis)."""

    commands = 0

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        type(self).commands += 1
        return await super().execute_command(*args, **options)


class Charge(BaseModel):
    amount: int


def build(store: AsyncRedisStore) -> tuple[FastAPI, dict[str, int]]:
    runs = {"charges": 0, "login": 0, "refunds": 0}
    idem = Idempotency(store)
    app = FastAPI()
    app.router.route_class = IdempotentRoute

    @app.post("/charges", status_code=201, dependencies=[idem.guard()])
    async def create_charge(charge: Charge) -> dict[str, Any]:
        runs["charges"] += 1
        return {"id": f"ch_{runs['charges']}", "amount": charge.amount}

    @app.post("/login")
    async def login(request: Request) -> dict[str, Any]:
        runs["login"] += 1
        return {"ok": True, "body": (await request.body()).decode()}

    router = idem.router(prefix="/refunds")

    @router.post("/{charge_id}", dependencies=[idem.guard(required=False)])
    async def refund(charge_id: str) -> dict[str, Any]:
        runs["refunds"] += 1
        return {"refund": charge_id, "run": runs["refunds"]}

    app.include_router(router, prefix="/v1")
    return app, runs


@pytest.fixture
async def setup(redis_url: str, prefix: str) -> Any:
    client = Counting.from_url(redis_url)
    events: list[Event] = []
    store = AsyncRedisStore(client, Policy(prefix=prefix, on_event=events.append))
    app, runs = build(store)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        yield http, runs, events
    await store.aclose()
    await client.aclose()


async def test_guarded_route_replays_and_unguarded_route_touches_no_redis(setup: Any) -> None:
    http, runs, events = setup
    Counting.commands = 0
    login = await http.post("/login", content=b"user=ann")
    assert login.status_code == 200
    assert login.json() == {"ok": True, "body": "user=ann"}  # the body reached the endpoint
    assert Counting.commands == 0  # no key needed, no Redis call
    assert events == []

    key = {"Idempotency-Key": "k1"}
    first = await http.post("/charges", json={"amount": 5}, headers=key)
    again = await http.post("/charges", json={"amount": 5}, headers=key)
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json() == first.json() == {"id": "ch_1", "amount": 5}
    assert again.headers["Idempotent-Replayed"] == "true"
    assert runs["charges"] == 1
    other = await http.post("/charges", json={"amount": 6}, headers=key)
    assert other.status_code == 422
    assert other.headers["content-type"] == "application/problem+json"
    missing = await http.post("/charges", json={"amount": 5})
    assert missing.status_code == 400
    assert missing.json()["code"] == "missing_key"
    assert runs["charges"] == 1
    assert {e.route for e in events} == {"/charges"}  # the template labels every event


async def test_a_router_included_with_a_prefix_stays_guarded_with_its_options(setup: Any) -> None:
    http, runs, events = setup
    key = {"Idempotency-Key": "r1"}
    first = await http.post("/v1/refunds/ch_1", headers=key)
    again = await http.post("/v1/refunds/ch_1", headers=key)
    assert first.status_code == again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert runs["refunds"] == 1
    keyless = await http.post("/v1/refunds/ch_1")  # required=False on this route
    assert keyless.status_code == 200
    assert runs["refunds"] == 2
    assert {e.route for e in events} == {"/v1/refunds/{charge_id}"}  # never /v1/refunds/ch_1


async def test_a_duplicate_while_the_first_runs_is_409(redis_url: str, prefix: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    store = AsyncRedisStore(client, Policy(prefix=prefix))
    idem = Idempotency(store)
    started, release = asyncio.Event(), asyncio.Event()
    app = FastAPI()
    app.router.route_class = IdempotentRoute

    @app.post("/slow", dependencies=[idem.guard()])
    async def slow() -> dict[str, str]:
        started.set()
        await asyncio.wait_for(release.wait(), 10)
        return {"ok": "yes"}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        key = {"Idempotency-Key": "s"}
        first = asyncio.create_task(http.post("/slow", headers=key))
        await asyncio.wait_for(started.wait(), 10)
        duplicate = await http.post("/slow", headers=key)
        release.set()
        assert (await first).status_code == 200
    assert duplicate.status_code == 409
    assert duplicate.headers["Retry-After"] == "1"
    await store.aclose()
    await client.aclose()


async def test_openapi_documents_the_header_and_problems_on_guarded_operations_only(
    setup: Any,
) -> None:
    http, _, _ = setup
    schema = (await http.get("/openapi.json")).json()
    charges = schema["paths"]["/charges"]["post"]
    header = [p for p in charges["parameters"] if p["name"] == "Idempotency-Key"]
    assert header == [
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": True,
            "description": header[0]["description"],
            "schema": {"type": "string", "minLength": 1, "maxLength": 255},
        }
    ]
    for status in ("400", "409", "413", "422", "503"):
        assert "application/problem+json" in charges["responses"][status]["content"], status
    assert "Idempotent-Replayed" in charges["responses"]["201"]["headers"]
    assert "application/json" in charges["responses"]["422"]["content"]  # FastAPI's own kept

    refunds = schema["paths"]["/v1/refunds/{charge_id}"]["post"]
    optional = [p for p in refunds["parameters"] if p["name"] == "Idempotency-Key"]
    assert [p["required"] for p in optional] == [False]
    assert "Idempotent-Replayed" in refunds["responses"]["200"]["headers"]

    login = schema["paths"]["/login"]["post"]
    assert "Idempotency-Key" not in str(login)
    assert set(login["responses"]) == {"200"}


def test_a_guard_on_a_plain_route_fails_loudly() -> None:
    from idemkey.testing import fake_async_store

    idem = Idempotency(fake_async_store())
    router = APIRouter()  # forgot route_class=IdempotentRoute

    @router.post("/charges", dependencies=[idem.guard()])
    async def create() -> dict[str, str]:
        return {}

    app = FastAPI()
    app.include_router(router)

    async def call() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            await http.post("/charges", headers={"Idempotency-Key": "k"})

    with pytest.raises(ConfigurationError, match="IdempotentRoute"):
        asyncio.run(call())


async def test_a_guard_added_by_include_router_guards_and_is_documented(
    redis_url: str, prefix: str
) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    store = AsyncRedisStore(client, Policy(prefix=prefix))
    idem = Idempotency(store)
    runs = []
    router = APIRouter(route_class=IdempotentRoute)

    @router.post("/payouts", status_code=202)
    async def payout() -> dict[str, int]:
        runs.append(1)
        return {"run": len(runs)}

    app = FastAPI()
    app.include_router(router, prefix="/v2", dependencies=[idem.guard(wait=1.0)])
    app.include_router(router, prefix="/open")  # the same router, unguarded here
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        key = {"Idempotency-Key": "p"}
        first = await http.post("/v2/payouts", headers=key)
        again = await http.post("/v2/payouts", headers=key)
        assert (first.status_code, again.status_code) == (202, 202)
        assert again.headers["Idempotent-Replayed"] == "true"
        assert (await http.post("/v2/payouts")).status_code == 400
        assert (await http.post("/open/payouts")).status_code == 202  # no key needed there
        schema = (await http.get("/openapi.json")).json()
    guarded = schema["paths"]["/v2/payouts"]["post"]
    assert [p["name"] for p in guarded["parameters"]] == ["Idempotency-Key"]
    assert "Idempotent-Replayed" in guarded["responses"]["202"]["headers"]
    assert "Idempotency-Key" not in str(schema["paths"]["/open/payouts"])
    assert runs == [1, 1]
    await store.aclose()
    await client.aclose()


def test_openapi_follows_a_custom_problem_renderer() -> None:
    from idemkey.http import Problem
    from idemkey.testing import fake_async_store

    def api_errors(problem: Problem) -> tuple[str, bytes]:
        return "application/vnd.api+json", b"{}"

    idem = Idempotency(
        fake_async_store(render_problem=api_errors), problem_media_type="application/vnd.api+json"
    )
    app = FastAPI()
    app.router.route_class = IdempotentRoute

    @app.post("/charges", dependencies=[idem.guard()])
    async def create() -> dict[str, str]:
        return {}

    responses = app.openapi()["paths"]["/charges"]["post"]["responses"]
    for status in ("400", "409", "413", "503"):
        assert set(responses[status]["content"]) == {"application/vnd.api+json"}, status


def test_openapi_documents_retention_retry_and_the_opt_in_headers() -> None:
    from idemkey.testing import fake_async_store

    def app_with(**policy: Any) -> dict[str, Any]:
        idem = Idempotency(fake_async_store(**policy))
        app = FastAPI()
        app.router.route_class = IdempotentRoute

        @app.post("/charges", status_code=201, dependencies=[idem.guard()])
        async def create() -> dict[str, str]:
            return {}

        operation: dict[str, Any] = app.openapi()["paths"]["/charges"]["post"]
        return operation

    default = app_with()
    for status in ("400", "409", "413", "422", "503"):
        schema = default["responses"][status]["content"]["application/problem+json"]["schema"]
        assert {"retention", "retry"} <= set(schema["required"]), status
        assert schema["properties"]["retention"]["type"] == "integer"
        assert schema["properties"]["retry"]["enum"] == ["never", "new_key", "same_key"]
    headers = default["responses"]["201"]["headers"]
    assert set(headers) == {"Idempotent-Replayed"}
    assert headers["Idempotent-Replayed"]["schema"]["enum"] == ["true"]
    assert "410" not in default["responses"]

    opted = app_with(
        retention_header="Idempotency-Retention", mark_first_responses=True, expired_grace=60.0
    )
    headers = opted["responses"]["201"]["headers"]
    assert headers["Idempotent-Replayed"]["schema"]["enum"] == ["true", "false"]
    assert headers["Idempotency-Retention"]["schema"] == {"type": "integer", "minimum": 0}
    assert "application/problem+json" in opted["responses"]["410"]["content"]


@pytest.fixture
async def recorded(redis_url: str, prefix: str) -> Any:
    """A store on the real Redis and the events it reports; closed after the test."""
    client = redis.asyncio.Redis.from_url(redis_url)
    events: list[Event] = []
    store = AsyncRedisStore(client, Policy(prefix=prefix, on_event=events.append))
    yield store, events
    await store.aclose()
    await client.aclose()


def _key_parameters(operation: dict[str, Any]) -> list[bool]:
    """The ``required`` of each Idempotency-Key header parameter the operation documents."""
    return [
        p["required"]
        for p in operation.get("parameters", [])
        if (p["name"], p["in"]) == ("Idempotency-Key", "header")
    ]


def _documents_the_guard(operation: dict[str, Any]) -> bool:
    documented = bool(_key_parameters(operation))
    problems = {"400", "409", "413", "503"} & set(operation["responses"])
    headers = operation["responses"].get("200", {}).get("headers", {})
    # All of it or none of it: the header, the problems and the replay header go together.
    assert documented is bool(problems) is ("Idempotent-Replayed" in headers), operation
    return documented


# One route with two methods has one operation id: FastAPI warns, as it would without idemkey.
@pytest.mark.filterwarnings("ignore:Duplicate Operation ID:UserWarning")
async def test_openapi_documents_the_guard_only_on_the_methods_it_guards(recorded: Any) -> None:
    # The default policy guards POST and PATCH: a PUT or GET route that declares the guard,
    # or sits on a guarded router, runs unguarded, and its operation says nothing of a key.
    store, _ = recorded
    idem = Idempotency(store)
    app = FastAPI()
    app.router.route_class = IdempotentRoute

    @app.put("/accounts/{account_id}/deposit", dependencies=[idem.guard()])
    async def deposit(account_id: str) -> dict[str, str]:
        return {"deposit": account_id}

    @app.put("/accounts/{account_id}/close", dependencies=[idem.guard(methods=["PUT"])])
    async def close(account_id: str) -> dict[str, str]:
        return {"closed": account_id}

    @app.api_route("/both", methods=["POST", "PATCH"], dependencies=[idem.guard()])
    async def both() -> dict[str, str]:
        return {"ok": "yes"}

    orders = idem.router(prefix="/orders")

    @orders.get("")
    async def list_orders() -> list[str]:
        return []

    @orders.post("")
    async def create_order() -> dict[str, str]:
        return {"id": "o_1"}

    plain = APIRouter(route_class=IdempotentRoute)

    @plain.get("/payouts")
    async def list_payouts() -> list[str]:
        return []

    app.include_router(orders)
    app.include_router(plain, prefix="/v2", dependencies=[idem.guard()])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        paths = (await http.get("/openapi.json")).json()["paths"]
        # What runs matches: a keyless PUT, GET or guarded POST as each operation says.
        assert (await http.put("/accounts/a1/deposit")).status_code == 200
        assert (await http.put("/accounts/a1/close")).status_code == 400
        assert (await http.get("/orders")).status_code == 200
        assert (await http.post("/orders")).status_code == 400
        assert (await http.get("/v2/payouts")).status_code == 200
    documented = {
        (method, path): _documents_the_guard(operation)
        for path, operations in paths.items()
        for method, operation in operations.items()
    }
    assert documented == {
        ("put", "/accounts/{account_id}/deposit"): False,
        ("put", "/accounts/{account_id}/close"): True,
        ("post", "/both"): True,
        ("patch", "/both"): True,
        ("get", "/orders"): False,
        ("post", "/orders"): True,
        ("get", "/v2/payouts"): False,
    }
    assert _key_parameters(paths["/orders"]["post"]) == [True]


def test_a_route_with_guarded_and_unguarded_methods_is_refused_when_declared() -> None:
    # FastAPI documents every method of one route alike (one openapi_extra): a route whose
    # policy guards some of its methods only could not be documented as it runs.
    from idemkey.testing import fake_async_store

    idem = Idempotency(fake_async_store())
    app = FastAPI()
    app.router.route_class = IdempotentRoute
    with pytest.raises(ConfigurationError, match=r"GET, POST, PUT.*guards POST"):

        @app.api_route("/multi", methods=["POST", "PUT", "GET"], dependencies=[idem.guard()])
        async def multi() -> dict[str, str]:
            return {}

    mixed = APIRouter(route_class=IdempotentRoute)

    @mixed.api_route("/forms", methods=["GET", "POST"])
    async def form() -> dict[str, str]:
        return {}

    def include() -> None:
        app.include_router(mixed, prefix="/v3", dependencies=[idem.guard()])
        app.openapi()  # recent FastAPI builds an inclusion's routes when first used

    with pytest.raises(ConfigurationError, match=r"/v3/forms"):
        include()


def _mounted_app(idem: Idempotency, runs: list[str]) -> FastAPI:
    """One FastAPI sub-app, whose guarded route the test mounts at several paths."""
    sub = FastAPI()
    sub.router.route_class = IdempotentRoute

    @sub.post("/things", dependencies=[idem.guard()])
    async def thing(request: Request) -> dict[str, Any]:
        runs.append(request.url.path)
        return {"path": request.url.path, "run": len(runs)}

    return sub


async def test_one_key_on_two_mounts_of_one_app_is_refused_never_replayed(recorded: Any) -> None:
    """Inside a Mount the route is relative to it (as in the Starlette adapter): one key sent
    to /a and then /b names one record, and the second request is another request (its path
    is in the fingerprint): 422, never the first mount's answer (docs/fastapi.md)."""
    store, events = recorded
    idem = Idempotency(store)
    runs: list[str] = []
    sub = _mounted_app(idem, runs)
    app = FastAPI()
    app.mount("/a", sub)
    app.mount("/b", sub)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        key = {"Idempotency-Key": "same"}
        first = await http.post("/a/things", headers=key)
        other = await http.post("/b/things", headers=key)
        again = await http.post("/a/things", headers=key)
    assert first.status_code == 200, first.text
    assert other.status_code == 422, other.text
    assert other.json()["code"] == "key_reused"
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.json() == first.json()
    assert runs == ["/a/things"]
    assert {e.route for e in events} == {"/things"}
