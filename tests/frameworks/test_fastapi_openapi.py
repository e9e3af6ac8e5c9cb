"""FastAPI OpenAPI: what idemkey adds to an operation keeps what FastAPI documents itself.

A guarded route's 422 is FastAPI's validation error and idemkey's key reuse: both described,
each with its schema. A handler that reads the ``Idempotency-Key`` header itself has it
documented once.
"""

from __future__ import annotations

from typing import Annotated, Any

import fastapi
import pytest
from fastapi import APIRouter, Depends, FastAPI, Header
from pydantic import BaseModel, Field

from idemkey.adapters.fastapi import Idempotency, IdempotentRoute
from idemkey.testing import fake_async_store

VALIDATION = {"$ref": "#/components/schemas/HTTPValidationError"}
_FASTAPI = tuple(int(part) for part in fastapi.__version__.split(".")[:2])
HEADER_MODELS = (
    pytest.mark.skipif(_FASTAPI < (0, 115), reason="Header() models: FastAPI 0.115"),
    # FastAPI 0.115's copy of a model field's FieldInfo, under a recent Pydantic.
    pytest.mark.filterwarnings("ignore:The 'alias' attribute with value"),
)


class Charge(BaseModel):
    amount: int


def _app() -> tuple[FastAPI, Idempotency]:
    app = FastAPI()
    app.router.route_class = IdempotentRoute
    return app, Idempotency(fake_async_store())


def _key_headers(operation: dict[str, Any]) -> list[str]:
    return [
        p["name"]
        for p in operation.get("parameters", [])
        if p["in"] == "header" and p["name"].lower() == "idempotency-key"
    ]


def test_a_guarded_422_describes_fastapis_validation_error_and_the_key_reuse() -> None:
    app, idem = _app()

    @app.post("/charges", status_code=201, dependencies=[idem.guard()])
    async def create_charge(charge: Charge) -> dict[str, int]:
        return {"amount": charge.amount}

    @app.post("/ping", dependencies=[idem.guard()])  # nothing FastAPI validates
    async def ping() -> dict[str, str]:
        return {}

    router = APIRouter(route_class=IdempotentRoute)

    @router.post("/payouts")
    async def payout(charge: Charge) -> dict[str, int]:
        return {"amount": charge.amount}

    app.include_router(router, prefix="/v2", dependencies=[idem.guard()])
    document = app.openapi()
    for path in ("/charges", "/v2/payouts"):
        answer = document["paths"][path]["post"]["responses"]["422"]
        assert answer["description"] == (
            "Validation Error; or the Idempotency-Key was used with a different request"
        ), path
        content = answer["content"]
        assert content["application/json"]["schema"] == VALIDATION, path
        problem = content["application/problem+json"]["schema"]
        assert problem["properties"]["code"] == {"type": "string"}, path
    assert "HTTPValidationError" in document["components"]["schemas"]

    alone = document["paths"]["/ping"]["post"]["responses"]["422"]
    assert alone["description"] == "The Idempotency-Key was used with a different request"
    assert set(alone["content"]) == {"application/problem+json"}


def test_a_status_the_route_describes_itself_keeps_its_description() -> None:
    app, idem = _app()

    @app.post(
        "/holds",
        dependencies=[idem.guard()],
        responses={409: {"description": "The account is frozen"}, 503: {"model": Charge}},
    )
    async def hold() -> dict[str, str]:
        return {}

    responses = app.openapi()["paths"]["/holds"]["post"]["responses"]
    assert responses["409"]["description"] == (
        "The account is frozen; or a request with this Idempotency-Key is still running "
        "(see Retry-After)"
    )
    # FastAPI's stand-in ("Service Unavailable") is not a description the route gave.
    assert responses["503"]["description"] == (
        "The idempotency store is unavailable (see Retry-After)"
    )


def _logged(idempotency_key: Annotated[str, Header()]) -> str:
    return idempotency_key


class KeyHeaders(BaseModel):
    key: str = Field(alias="Idempotency-Key")


@pytest.mark.parametrize(
    "declare",
    [
        "snake_case",
        "alias",
        "lower-case alias",
        "in a dependency",
        pytest.param("in a header model", marks=HEADER_MODELS),
        "convert_underscores=False",
    ],
)
def test_a_key_header_the_handler_declares_is_documented_once(declare: str) -> None:
    app, idem = _app()
    guard = [idem.guard()]
    if declare == "snake_case":

        @app.post("/charges", dependencies=guard)
        async def snake(idempotency_key: Annotated[str, Header()]) -> dict[str, str]:
            return {"key": idempotency_key}

    elif declare == "alias":

        @app.post("/charges", dependencies=guard)
        async def aliased(key: Annotated[str, Header(alias="Idempotency-Key")]) -> dict[str, str]:
            return {"key": key}

    elif declare == "lower-case alias":

        @app.post("/charges", dependencies=guard)
        async def lower(key: Annotated[str, Header(alias="idempotency-key")]) -> dict[str, str]:
            return {"key": key}

    elif declare == "in a dependency":

        @app.post("/charges", dependencies=guard)
        async def nested(key: Annotated[str, Depends(_logged)]) -> dict[str, str]:
            return {"key": key}

    elif declare == "in a header model":

        @app.post("/charges", dependencies=guard)
        async def modelled(headers: Annotated[KeyHeaders, Header()]) -> dict[str, str]:
            return {"key": headers.key}

    else:  # reads the header `idempotency_key`, another header: idemkey's is still documented

        @app.post("/charges", dependencies=guard)
        async def underscored(
            idempotency_key: Annotated[str | None, Header(convert_underscores=False)] = None,
        ) -> dict[str, str | None]:
            return {"key": idempotency_key}

    operation = app.openapi()["paths"]["/charges"]["post"]
    if declare == "convert_underscores=False":
        assert _key_headers(operation) == ["Idempotency-Key"]
        names = [p["name"] for p in operation["parameters"]]
        assert sorted(names) == ["Idempotency-Key", "idempotency_key"]
    else:
        assert len(_key_headers(operation)) == 1, operation["parameters"]
    # Still a guarded operation: the problems and the replay header are documented.
    assert "application/problem+json" in operation["responses"]["409"]["content"]
    assert "Idempotent-Replayed" in operation["responses"]["200"]["headers"]


def test_a_key_parameter_in_openapi_extra_is_replaced_whatever_its_case() -> None:
    app, idem = _app()
    extra = {"parameters": [{"name": "idempotency-key", "in": "header", "required": False}]}

    @app.post("/charges", dependencies=[idem.guard()], openapi_extra=extra)
    async def create() -> dict[str, str]:
        return {}

    operation = app.openapi()["paths"]["/charges"]["post"]
    assert [(p["name"], p["required"]) for p in operation["parameters"]] == [
        ("Idempotency-Key", True)
    ]
