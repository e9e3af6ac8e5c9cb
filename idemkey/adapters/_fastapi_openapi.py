"""What a guarded FastAPI operation adds to its OpenAPI document.

The ``Idempotency-Key`` header parameter, the problem answers idemkey may give (with their
``retention`` and ``retry`` members), and the ``Idempotent-Replayed`` header (and, when the
policy sends it, the retention header) on the success response. Kept apart from ``fastapi.py`` (the
guard dependency and the route class that runs guarded routes through the ASGI middleware);
nothing here imports FastAPI: the route is read through the attributes FastAPI's own OpenAPI
generation reads (``dependant``, ``body_field``, ``responses``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from ..http import REPLAYED_HEADER, RETRY

if TYPE_CHECKING:
    from ..policy import Policy

__all__ = ["document"]

_PROBLEM_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "format": "uri-reference"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {"type": "string"},
        "retention": {
            "type": "integer",
            "minimum": 0,
            "description": "Seconds a key is honoured: its answer is replayed for this long",
        },
        "retry": {
            "type": "string",
            "enum": sorted(set(RETRY.values())),
            "description": (
                "same_key: send the request again with the same key; new_key: this key can "
                "never serve this request; never: resending cannot help"
            ),
        },
    },
    "required": ["type", "title", "status", "detail", "code", "retention", "retry"],
}
#: The description FastAPI gives the 422 it documents on an operation with parameters or a body.
_FASTAPI_VALIDATION_ERROR: Final = "Validation Error"


class Operation(Protocol):
    """What ``document`` reads of a route: an ``APIRoute``, or the context a recent FastAPI
    builds for each ``include_router`` inclusion of one."""

    @property
    def openapi_extra(self) -> dict[str, Any] | None: ...
    @property
    def status_code(self) -> int | None: ...
    @property
    def dependant(self) -> Any: ...
    @property
    def body_field(self) -> Any: ...
    @property
    def responses(self) -> Mapping[int | str, Mapping[str, Any]]: ...


def document(route: Operation, media_type: str, policy: Policy) -> dict[str, Any]:
    """The route's ``openapi_extra`` plus the header, the problem answers and the replay header.

    FastAPI deep-merges ``openapi_extra`` over the operation it builds (lists are concatenated,
    other values replaced), so what it documents itself must be accounted for here: a header
    parameter the route declares is not added again, and a status it describes (its 422
    validation error above all) keeps that description beside idemkey's.
    """
    extra, status_code = route.openapi_extra, route.status_code
    merged = copy.deepcopy(extra) if extra else {}
    header = {
        "name": policy.header,
        "in": "header",
        "required": policy.require_key,
        "description": (
            "A unique key per operation (at most 255 printable ASCII characters). A retry with "
            "the same key and the same request gets the first answer again; with another "
            f"request, {policy.mismatch_status}."
        ),
        "schema": {"type": "string", "minLength": 1, "maxLength": 255},
    }
    # Older FastAPI copies a route into each include_router(), passing the openapi_extra this
    # function already filled: the copy documents the header once, with its own policy.
    # Header names are case-insensitive, so is the comparison.
    name = policy.header.lower()
    parameters = merged.setdefault("parameters", [])
    parameters[:] = [
        p for p in parameters if (str(p.get("name", "")).lower(), p.get("in")) != (name, "header")
    ]
    if name not in _declared_headers(route.dependant):
        parameters.append(header)
    if not parameters:
        del merged["parameters"]
    responses = merged.setdefault("responses", {})
    success = responses.setdefault(str(status_code or 200), {})
    headers = success.setdefault("headers", {})
    if policy.mark_first_responses:
        headers[REPLAYED_HEADER] = {
            "description": "'true' when this is the stored answer to an earlier request with "
            "this key, 'false' on the first answer",
            "schema": {"type": "string", "enum": ["true", "false"]},
        }
    else:
        headers[REPLAYED_HEADER] = {
            "description": "'true' when this is the stored answer to an earlier request with "
            "this key",
            "schema": {"type": "string", "enum": ["true"]},
        }
    if policy.retention_header is not None:
        headers[policy.retention_header] = {
            "description": "Seconds the key is honoured: its answer is replayed for this long",
            "schema": {"type": "integer", "minimum": 0},
        }
    problems = {
        400: f"The {policy.header} header is missing or invalid",
        409: f"A request with this {policy.header} is still running (see Retry-After)",
        413: "The request body is over the size idemkey stores",
        **(
            {410: f"The {policy.header} expired after its request completed: not run again"}
            if policy.expired_grace > 0
            else {}
        ),
        policy.mismatch_status: f"The {policy.header} was used with a different request",
        503: "The idempotency store is unavailable (see Retry-After)",
    }
    described = _described(route)
    for status, description in sorted(problems.items()):
        answer = responses.setdefault(str(status), {})
        answer.setdefault("description", _joined(described.get(str(status)), description))
        content = answer.setdefault("content", {})
        if policy.render_problem is None:
            content["application/problem+json"] = {"schema": copy.deepcopy(_PROBLEM_SCHEMA)}
        else:  # your renderer's shape: idemkey cannot know its schema
            content.setdefault(media_type, {"schema": {}})
    return merged


def _joined(theirs: str | None, ours: str) -> str:
    """One description for an answer both the route and idemkey may give."""
    if not theirs or theirs == ours:
        return ours
    return f"{theirs}; or {ours[:1].lower()}{ours[1:]}"


def _described(route: Operation) -> dict[str, str]:
    """The descriptions the operation gives itself, by status: the route's ``responses`` that
    name one, and FastAPI's validation error, which it documents as 422 on an operation with
    parameters or a body unless ``responses`` already names 422, 4XX or default."""
    described = {
        str(status): answer["description"]
        for status, answer in route.responses.items()
        if answer.get("description")
    }
    covered = {str(status).upper() for status in route.responses} & {"422", "4XX", "DEFAULT"}
    validated = route.body_field is not None or any(
        d.path_params or d.query_params or d.header_params or d.cookie_params
        for d in _dependants(route.dependant)
    )
    if validated and not covered:
        described["422"] = _FASTAPI_VALIDATION_ERROR
    return described


def _declared_headers(dependant: Any) -> set[str]:
    """The headers, lower-cased, that the route's handler or its dependencies read: FastAPI
    documents each, so a second ``Idempotency-Key`` parameter would list the header twice.

    A header parameter's alias is the header's name (``idempotency_key`` already converted to
    ``idempotency-key``). A Pydantic model read with ``Header()`` documents one header per
    field: by its alias, or, for a field without one, by its name as is (FastAPI before
    0.115.12) or with underscores converted (since): only aliases count, so such a field may
    leave the header listed twice, never missing.
    """
    names: set[str] = set()
    for each in _dependants(dependant):
        for field in each.header_params:
            model_fields = getattr(field.field_info.annotation, "model_fields", None)
            if isinstance(model_fields, dict):
                names.update(info.alias.lower() for info in model_fields.values() if info.alias)
            else:
                names.add(str(field.alias).lower())
    return names


def _dependants(dependant: Any) -> Iterator[Any]:
    """The route's dependant and every sub-dependency's, depth first."""
    if dependant is None:
        return
    pending = [dependant]
    while pending:
        current = pending.pop()
        yield current
        pending.extend(current.dependencies)
