"""Where an MCP tool call's idempotency key comes from, and the one grammar every key follows.

A key is 1 to 255 visible ASCII characters without a comma, as a bare ``Idempotency-Key``
field value over HTTP (:func:`idemkey._core.parse_key`): no spaces, no control characters,
nothing outside ASCII. It comes from the tool's key argument, the ``tools/call`` request's
``_meta`` field, or its ``params`` field (the shape SEP-3182 proposed), checked in that
order; or it is derived from the call itself (:func:`derived_key`).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

import msgspec
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.fastmcp import Context, FastMCP
from mcp.types import CallToolRequest

from .._core import MAX_KEY_LENGTH
from ..policy import Policy
from ..records import GUARD_METHOD, record_for
from ..store import AsyncRedisStore
from ._mcp_errors import InvalidKeyToolError, KeyReusedToolError, arguments_unsupported

__all__ = [
    "KEY_GRAMMAR",
    "KeySources",
    "as_sent",
    "call_key",
    "check_key",
    "describe",
    "derived_key",
    "first_form",
    "forms",
    "keep_request_params",
    "principal_of",
    "request_params",
    "require_argument",
    "retention",
    "scoped",
]

#: The grammar, as the agent is told it.
KEY_GRAMMAR = f"1 to {MAX_KEY_LENGTH} visible ASCII characters, without spaces or commas"
_VISIBLE = frozenset(chr(c) for c in range(0x21, 0x7F)) - {","}

# The extra params of the tools/call request being handled (params.idempotencyKey).
_params: ContextVar[Mapping[str, Any] | None] = ContextVar("idemkey_mcp_params", default=None)
# The names of the arguments it sent (None: not known, outside a tools/call request).
_sent: ContextVar[frozenset[str] | None] = ContextVar("idemkey_mcp_sent", default=None)
T = TypeVar("T")


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


class KeySources(Protocol):
    """Where a tool's key may come from (:class:`~idemkey.contrib.mcp.IdempotentTools`)."""

    argument: str | None
    meta_field: str | None
    params_field: str | None
    derive: bool
    operation: str | None
    bucket: float | None


def call_key(
    sources: KeySources,
    kwargs: Mapping[str, Any],
    ctx: Context[Any, Any, Any],
    principal: str,
    tool: str,
    arguments: Mapping[str, Any],
    every: Mapping[str, Any] | None = None,
) -> str:
    """The call's key: the argument's, else the host's (``_meta``, then ``params``), else
    derived from the call (``arguments``: those sent; an ``operation`` argument's default
    counts, from ``every``, as it always did); checked against the one grammar."""
    argument, meta_field, params_field = sources.argument, sources.meta_field, sources.params_field
    if argument is not None and kwargs.get(argument) is not None:
        return check_key(kwargs[argument], f"the `{argument}` argument")
    if meta_field is not None:
        meta = None
        try:
            meta = ctx.request_context.meta
        except ValueError:
            meta = None
        extra = (meta.model_extra or {}) if meta is not None else {}
        if extra.get(meta_field) is not None:
            return check_key(extra[meta_field], f"_meta.{meta_field}")
    if params_field is not None:
        params = request_params()
        if params.get(params_field) is not None:
            return check_key(params[params_field], f"params.{params_field}")
    if sources.derive:
        what = arguments if sources.operation is None or every is None else every
        return derived_key(principal, tool, what, sources.operation, sources.bucket)
    where = (
        f"the `{argument}` argument"
        if argument is not None
        else f"_meta.{meta_field}"
        if meta_field
        else f"params.{params_field}"
    )
    return check_key(None, where)


def describe(sources: KeySources, within: str, text: str) -> str:
    """``text`` with the sentences that tell the agent how the tool is idempotent (results are
    replayed ``within`` that long)."""
    if sources.derive:
        same = (
            "the same arguments" if sources.operation is None else f"the same `{sources.operation}`"
        )
        note = (
            f"Idempotent: a repeat of this call with {same} within {within} returns the "
            "first result (marked as a replay) without running the tool again; no key "
            "is needed."
        )
        if sources.operation is not None:
            note += f" Other arguments with a `{sources.operation}` already used are refused."
    elif sources.argument is not None:
        note = (
            f"Idempotent: pass a new unique key in the `{sources.argument}` argument for "
            f"each operation ({KEY_GRAMMAR}) and the same key when retrying it, never a "
            f"new one; a retry within {within} returns the first result (marked as a "
            "replay) without running the tool again. A key reused with other arguments "
            "is refused."
        )
    else:
        fields = [f"`_meta.{sources.meta_field}`"] if sources.meta_field else []
        fields += [f"`params.{sources.params_field}`"] if sources.params_field else []
        note = (
            f"Idempotent: the host's idempotency key ({' or '.join(fields)}) decides; a "
            f"retry with it within {within} returns the first result (marked as a replay) "
            "without running the tool again."
        )
    return f"{text.strip()}\n\n{note}" if text.strip() else note


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
    try:
        canonical = msgspec.json.encode(parts, order="sorted")
    except (TypeError, OverflowError, msgspec.EncodeError) as exc:
        raise arguments_unsupported(exc) from exc
    return "derived-" + hashlib.sha256(canonical).hexdigest()


def as_sent(every: Mapping[str, Any]) -> dict[str, Any]:
    """The validated arguments the caller sent, without the defaults of those it left out: a
    tool that gains an optional argument still fingerprints its earlier calls the same. All
    of them outside a ``tools/call`` request (``FastMCP.call_tool``)."""
    sent = _sent.get()
    return dict(every) if sent is None else {k: v for k, v in every.items() if k in sent}


async def forms(
    sources: KeySources,
    store: AsyncRedisStore,
    policy: Policy,
    principal: str,
    tool: str,
    key: str,
    sent: dict[str, Any],
    every: dict[str, Any],
) -> list[tuple[str, dict[str, Any]]]:
    """The (key, arguments) the call's record may be under, in the order tried.

    0.3 and earlier fingerprinted (and derived a key from) ``every`` validated argument,
    defaults included: their records still match for one release. A key of the caller's is
    tried with ``sent``, then with ``every`` (a first refusal claims nothing); a derived key
    of ``every`` is used when a record has it (one read, only when a default was left out),
    else the key of ``sent``. Remove in 0.5."""
    if sent == every:
        return [(key, sent)]
    bucket = sources.bucket
    if not sources.derive or sources.operation is not None:
        return [(key, sent), (key, every)]
    if key != derived_key(principal, tool, sent, None, bucket):
        return [(key, sent), (key, every)]  # the host's key, with derive=True
    earlier = derived_key(principal, tool, every, None, bucket)
    record = record_for(policy.prefix, f"mcp:{principal}", GUARD_METHOD, "", earlier)
    return [(earlier, every)] if await store.record(record) is not None else [(key, sent)]


async def first_form(
    tried: Sequence[tuple[str, dict[str, Any]]],
    attempt: Callable[[str, dict[str, Any]], Awaitable[T]],
) -> T:
    """``attempt`` each of ``tried`` (:func:`forms`) in turn while the key is refused as reused
    with other arguments (nothing claimed, nothing ran); the last one's refusal is the call's."""
    for key, arguments in tried[:-1]:
        try:
            return await attempt(key, arguments)
        except KeyReusedToolError:
            continue
    return await attempt(*tried[-1])


def request_params() -> Mapping[str, Any]:
    """The extra ``params`` of the ``tools/call`` request being handled (empty: none)."""
    return _params.get() or {}


def keep_request_params(server: FastMCP[Any]) -> None:
    """Wrap ``server``'s ``tools/call`` handler so the tool can read the request's extra
    params and the names of the arguments it sent (FastMCP passes the tool only its
    arguments, validated, with the defaults of those left out). Once per server."""
    handlers = server._mcp_server.request_handlers
    original = handlers.get(CallToolRequest)
    if original is None or getattr(original, "idemkey_params", False):
        return

    async def keeping(request: Any) -> Any:
        token = _params.set(dict(request.params.model_extra or {}))
        sent = _sent.set(frozenset(request.params.arguments or {}))
        try:
            return await original(request)
        finally:
            _sent.reset(sent)
            _params.reset(token)

    keeping.idemkey_params = True  # type: ignore[attr-defined]
    handlers[CallToolRequest] = keeping


def principal_of(ctx: Context[Any, Any, Any] | None) -> str | None:
    """Who this call's verified access token names, or None without auth.

    The token's ``client_id`` when it names no user; with a ``subject`` (the user, as the
    SDK's ``AccessToken`` carries it), the client, the user and the issuer (its ``iss``
    claim, or null: a subject is unique per issuer only) as one JSON array, so that the users
    of one client (an agent app) never share a scope. The request's ``user`` (set by the SDK's
    ``AuthenticationMiddleware`` on streamable HTTP) first, then the SDK's auth context
    variable.
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
    if not isinstance(client_id, str) or not client_id:
        return None
    subject = getattr(token, "subject", None)
    if not isinstance(subject, str) or not subject:
        # 0.x scoped by the client id alone: kept so, its records are still found.
        return _joined(client_id) if client_id.startswith("[") else client_id
    claims = getattr(token, "claims", None)
    issuer = claims.get("iss") if isinstance(claims, dict) else None
    return _joined(client_id, subject, issuer if isinstance(issuer, str) else None)


def scoped(token: str | None, narrowed: str | None) -> str | None:
    """The principal of a call: ``token``'s (:func:`principal_of`), narrowed by what the
    server's ``principal(ctx)`` returned; without a token, that alone (None: neither)."""
    if token is None or not narrowed:
        return token or narrowed or None
    return _joined(token, narrowed)


def _joined(*parts: str | None) -> str:
    # One JSON array of 1, 2 or 3 parts: a bare client id never starts with "[" (one that
    # does is joined alone), and arrays of other lengths never meet, so no two principals
    # share a text.
    return json.dumps(parts, ensure_ascii=False, separators=(",", ":"))


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
