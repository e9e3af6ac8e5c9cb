"""What a guarded FastAPI operation adds to its OpenAPI document.

The ``Idempotency-Key`` header parameter, the problem answers idemkey may give, and the
``Idempotent-Replayed`` header on the success response. Kept apart from ``fastapi.py`` (the
guard dependency and the route class that runs guarded routes through the ASGI middleware);
nothing here imports FastAPI.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Final

from ..http import REPLAYED_HEADER

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
    },
    "required": ["type", "title", "status", "detail", "code"],
}


def document(
    extra: dict[str, Any] | None, media_type: str, policy: Policy, status_code: int | None
) -> dict[str, Any]:
    """``openapi_extra`` plus the header, the problem answers and the replay header.

    FastAPI deep-merges ``openapi_extra`` into the operation (lists are concatenated), so the
    operation keeps everything it documents itself.
    """
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
    parameters = merged.setdefault("parameters", [])
    parameters[:] = [
        p for p in parameters if (p.get("name"), p.get("in")) != (policy.header, "header")
    ]
    parameters.append(header)
    responses = merged.setdefault("responses", {})
    success = responses.setdefault(str(status_code or 200), {})
    success.setdefault("headers", {})[REPLAYED_HEADER] = {
        "description": "'true' when this is the stored answer to an earlier request with this key",
        "schema": {"type": "string", "enum": ["true"]},
    }
    problems = {
        400: f"The {policy.header} header is missing or invalid",
        409: f"A request with this {policy.header} is still running (see Retry-After)",
        413: "The request body is over the size idemkey stores",
        policy.mismatch_status: f"The {policy.header} was used with a different request",
        503: "The idempotency store is unavailable (see Retry-After)",
    }
    for status, description in sorted(problems.items()):
        answer = responses.setdefault(str(status), {})
        answer.setdefault("description", description)
        content = answer.setdefault("content", {})
        if policy.render_problem is None:
            content["application/problem+json"] = {"schema": copy.deepcopy(_PROBLEM_SCHEMA)}
        else:  # your renderer's shape: idemkey cannot know its schema
            content.setdefault(media_type, {"schema": {}})
    return merged
