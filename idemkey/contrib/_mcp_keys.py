"""Where an MCP tool call's idempotency key comes from, and the one grammar every key follows.

A key is 1 to 255 visible ASCII characters without a comma, as a bare ``Idempotency-Key``
field value over HTTP (:func:`idemkey._core.parse_key`): no spaces, no control characters,
nothing outside ASCII. It comes from the tool's key argument, the ``tools/call`` request's
``_meta`` field, or its ``params`` field (the shape SEP-3182 proposed), checked in that
order; or it is derived from the call itself (:func:`derived_key`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

import msgspec
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.fastmcp import Context, FastMCP
from mcp.types import CallToolRequest

from .._core import MAX_KEY_LENGTH
from ._mcp_errors import InvalidKeyToolError

__all__ = [
    "KEY_GRAMMAR",
    "check_key",
    "derived_key",
    "keep_request_params",
    "principal_of",
    "request_params",
    "require_argument",
    "retention",
]

#: The grammar, as the agent is told it.
KEY_GRAMMAR = f"1 to {MAX_KEY_LENGTH} visible ASCII characters, without spaces or commas"
_VISIBLE = frozenset(chr(c) for c in range(0x21, 0x7F)) - {","}

# The extra params of the tools/call request being handled (params.idempotencyKey).
_params: ContextVar[Mapping[str, Any] | None] = ContextVar("idemkey_mcp_params", default=None)


def check_key(value: object, where: str) -> str:
    """``value`` if it is a key (:data:`KEY_GRAMMAR`), else :class:`InvalidKeyToolError`."""
    if value is None:
        raise InvalidKeyToolError(f"this tool needs an idempotency key in {where}")
    if not isinstance(value, str):
        rule = f"must be a string of {KEY_GRAMMAR}"
        raise InvalidKeyToolError(f"the idempotency key in {where} {rule}")
    if not value:
        why = "is empty"
    elif len(value) > MAX_KEY_LENGTH:
        why = f"is longer than {MAX_KEY_LENGTH} characters"
    elif not _VISIBLE.issuperset(value):
        why = "has a character that is not visible ASCII (a space, a control character, a comma)"
    else:
        return value
    raise InvalidKeyToolError(f"the idempotency key in {where} {why}: use {KEY_GRAMMAR}")


def derived_key(
    principal: str,
    tool: str,
    arguments: Mapping[str, Any],
    operation: str | None,
    bucket: float | None,
) -> str:
    """The key of a call that brings none: a digest of who calls which tool with what.

    ``operation`` names the argument that identifies the business operation (an order id):
    the key is then that argument's value alone, so the same order with other details is
    refused as a reused key rather than run as a new operation. ``bucket`` (seconds) adds the
    time window the call falls in, so the same call in a later window is a new operation.
    """
    if operation is not None:
        if operation not in arguments:
            raise InvalidKeyToolError(
                f"this tool derives its idempotency key from its `{operation}` argument, "
                "which is missing"
            )
        what: Any = {operation: arguments[operation]}
    else:
        what = dict(arguments)
    parts: list[Any] = [principal, tool, what]
    if bucket is not None:
        parts.append(int(time.time() // bucket))
    canonical = msgspec.json.encode(parts, order="sorted")
    return "derived-" + hashlib.sha256(canonical).hexdigest()


def request_params() -> Mapping[str, Any]:
    """The extra ``params`` of the ``tools/call`` request being handled (empty: none)."""
    return _params.get() or {}


def keep_request_params(server: FastMCP[Any]) -> None:
    """Wrap ``server``'s ``tools/call`` handler so the tool can read the request's extra
    params (FastMCP passes the tool only its arguments). Once per server."""
    handlers = server._mcp_server.request_handlers
    original = handlers.get(CallToolRequest)
    if original is None or getattr(original, "idemkey_params", False):
        return

    async def keeping(request: Any) -> Any:
        token = _params.set(dict(request.params.model_extra or {}))
        try:
            return await original(request)
        finally:
            _params.reset(token)

    keeping.idemkey_params = True  # type: ignore[attr-defined]
    handlers[CallToolRequest] = keeping


def principal_of(ctx: Context[Any, Any, Any] | None) -> str | None:
    """The authenticated client id of this call, or None without auth.

    The request's ``user`` (set by the SDK's ``AuthenticationMiddleware`` on streamable HTTP)
    first, then the SDK's auth context variable.
    """
    request = None
    if ctx is not None:
        try:
            request = ctx.request_context.request
        except ValueError:  # outside a request
            request = None
    scope = getattr(request, "scope", None)
    user = scope.get("user") if isinstance(scope, dict) else None
    token = getattr(user, "access_token", None)
    if token is None:
        token = get_access_token()
    client_id = getattr(token, "client_id", None)
    return client_id if isinstance(client_id, str) and client_id else None


def retention(seconds: float) -> str:
    if seconds >= 86_400 and seconds % 86_400 == 0:
        days = int(seconds // 86_400)
        return f"{days} day" + ("s" if days != 1 else "")
    if seconds >= 3_600 and seconds % 3_600 == 0:
        hours = int(seconds // 3_600)
        return f"{hours} hour" + ("s" if hours != 1 else "")
    return f"{seconds:g} seconds"


def require_argument(server: FastMCP[Any], name: str, argument: str) -> None:
    """List the key argument as required in the tool's input schema, which the agent reads.
    The SDK does not check it (FastMCP validates with the argument model, where the key is
    optional so that a missing one gets idempotency_key_invalid)."""
    tool = server._tool_manager.get_tool(name)
    if tool is not None:
        required = tool.parameters.setdefault("required", [])
        if argument not in required:
            required.append(argument)
