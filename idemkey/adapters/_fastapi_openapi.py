"""What a guarded FastAPI operation adds to its OpenAPI document.

The ``Idempotency-Key`` header parameter, the problem answers idemkey may give (with their
``retention`` and ``retry`` members), and the ``Idempotent-Replayed`` header (and, when the
policy sends it, the retention header) on the success response. Kept apart from ``fastapi.py`` (the
guard dependency and the route class that runs guarded routes through the ASGI middleware);
nothing here imports FastAPI.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Final

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
    for status, description in sorted(problems.items()):
        answer = responses.setdefault(str(status), {})
        answer.setdefault("description", description)
        content = answer.setdefault("content", {})
        if policy.render_problem is None:
            content["application/problem+json"] = {"schema": copy.deepcopy(_PROBLEM_SCHEMA)}
        else:  # your renderer's shape: idemkey cannot know its schema
            content.setdefault(media_type, {"schema": {}})
    return merged
