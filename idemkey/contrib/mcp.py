"""Idempotent tool calls for MCP servers on the official ``mcp`` SDK's ``FastMCP``
(``pip install 'idemkey-redis[mcp]'``; mcp 1.x).

::

    from mcp.server.fastmcp import FastMCP
    from idemkey.contrib.mcp import IdempotentTools

    server = FastMCP("tickets")
    tools = IdempotentTools(store)  # an AsyncRedisStore

    @tools.tool(server)
    async def create_ticket(title: str) -> dict:
        ...

The tool gets a required ``idempotency_key`` argument (``argument=``; the agent picks one per
operation) or reads ``_meta.idempotencyKey`` of the ``tools/call`` request (``meta_field=``).
The key is scoped by the caller's principal: the client id of the access token the SDK's
auth middleware verified (streamable HTTP with ``auth=``/``token_verifier=``), else what
``principal(ctx)`` returns, else ``"anonymous"`` (stdio, or HTTP without auth: one scope for
every caller, so a key is shared by everyone who can reach the server). The fingerprint is
the tool's name and its arguments without the key. The first call runs the tool and stores
its ``CallToolResult``; a retry with the same key and arguments gets that result back, with
``_meta["io.idemkey/replay"] = {"replayed": True}`` (``False`` on the first call) and a
last text block saying it is a replay.

A reused key with other arguments raises :class:`KeyReusedToolError`; a duplicate while the
first call runs waits up to ``policy.wait`` seconds for its result, then raises
:class:`InFlightToolError` (retry with the same key). The SDK sends both as a tool error
(``isError``) whose text begins with ``idempotency_key_reused:`` or ``idempotency_key_in_flight:``.
A tool that raises releases the key: a retry runs it again. A call the host cancels
(``notifications/cancelled``) runs to its end and its result is stored: a retry replays it.
A synchronous tool runs in a worker thread, so the store's heartbeat renews its claim.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

try:
    from mcp.server.auth.middleware.auth_context import get_access_token
    from mcp.server.fastmcp import Context, FastMCP
    from mcp.server.fastmcp.utilities.context_injection import find_context_parameter
    from mcp.server.fastmcp.utilities.func_metadata import func_metadata
    from mcp.types import CallToolResult, TextContent, ToolAnnotations
except ImportError as exc:  # pragma: no cover - exercised with mcp hidden
    raise ImportError(
        "idemkey.contrib.mcp needs the mcp SDK: pip install 'idemkey-redis[mcp]'"
    ) from exc

from ..errors import InvalidKeyError, KeyReuseError, RequestInFlightError, StoreError
from ..guard import aguard
from ..policy import Policy
from ..store import AsyncRedisStore
from ._mcp_errors import (
    IdempotencyToolError,
    InFlightToolError,
    InvalidKeyToolError,
    KeyReusedToolError,
    StoreUnavailableToolError,
)

__all__ = [
    "REPLAY_META",
    "IdempotencyToolError",
    "IdempotentTools",
    "InFlightToolError",
    "InvalidKeyToolError",
    "KeyReusedToolError",
    "StoreUnavailableToolError",
    "principal_of",
]

#: The ``_meta`` field of a replayed result.
REPLAY_META = "io.idemkey/replay"
#: The text block appended to a replayed result's content, where the agent reads it.
REPLAY_TEXT = (
    "[idemkey] Replay: the stored result of the first call with this idempotency key; "
    "the tool did not run again."
)
ANONYMOUS = "anonymous"
#: Agents retry after context resets and restarts: keep results for 3 days by default.
AGENT_TTL = 3 * 86_400.0


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


def _retention(seconds: float) -> str:
    if seconds >= 86_400 and seconds % 86_400 == 0:
        days = int(seconds // 86_400)
        return f"{days} day" + ("s" if days != 1 else "")
    if seconds >= 3_600 and seconds % 3_600 == 0:
        hours = int(seconds // 3_600)
        return f"{hours} hour" + ("s" if hours != 1 else "")
    return f"{seconds:g} seconds"


class IdempotentTools:
    """Registers FastMCP tools that run once per idempotency key (see :mod:`idemkey.contrib.mcp`).

    ``policy`` defaults to the store's with ``ttl`` and ``wait`` replaced: results are replayed
    for ``ttl`` seconds (3 days by default) and a duplicate waits up to ``wait`` seconds (5) for
    the first call's result. A ``policy`` given is used as it is. ``argument`` names the tool
    argument that carries the key (None: none); ``meta_field`` the ``_meta`` field read when
    the argument is absent (None: none). ``principal(ctx)`` scopes keys when the SDK has no
    authenticated client id (stdio, HTTP without auth).
    """

    def __init__(
        self,
        store: AsyncRedisStore,
        *,
        policy: Policy | None = None,
        ttl: float = AGENT_TTL,
        wait: float = 5.0,
        argument: str | None = "idempotency_key",
        meta_field: str | None = "idempotencyKey",
        principal: Callable[[Context[Any, Any, Any]], str | None] | None = None,
    ) -> None:
        if argument is None and meta_field is None:
            raise ValueError("IdempotentTools needs an argument or a meta_field for the key")
        self.store = store
        self.policy = policy if policy is not None else store.policy.replace(ttl=ttl, wait=wait)
        self.argument = argument
        self.meta_field = meta_field
        self.principal = principal

    def description(self, text: str) -> str:
        """``text`` with the sentence that tells the agent how the tool is idempotent."""
        where = (
            f"the `{self.argument}` argument"
            if self.argument is not None
            else f"`_meta.{self.meta_field}`"
        )
        note = (
            f"Idempotent: pass a new unique key in {where} for each operation and the same "
            f"key when retrying it; a retry within {_retention(self.policy.ttl)} returns the "
            "first result (marked as a replay) without running the tool again. A key reused "
            "with other arguments is refused."
        )
        return f"{text.strip()}\n\n{note}" if text.strip() else note

    def scope(self, ctx: Context[Any, Any, Any]) -> str:
        """The principal a key belongs to."""
        found = principal_of(ctx)
        if found is None and self.principal is not None:
            found = self.principal(ctx)
        return found or ANONYMOUS

    def tool(
        self,
        server: FastMCP[Any],
        name: str | None = None,
        *,
        title: str | None = None,
        description: str | None = None,
        annotations: ToolAnnotations | None = None,
        structured_output: bool | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: register ``fn`` on ``server`` as an idempotent tool."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            wrapper = self.wrap(fn, name=name, structured_output=structured_output)
            marked = (annotations or ToolAnnotations()).model_copy(update={"idempotentHint": True})
            server.add_tool(
                wrapper,
                name=name or fn.__name__,
                title=title,
                description=self.description(description or fn.__doc__ or ""),
                annotations=marked,
                structured_output=structured_output,
            )
            return fn

        return register

    def wrap(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        structured_output: bool | None = None,
    ) -> Callable[..., Awaitable[CallToolResult]]:
        """``fn`` as a coroutine function FastMCP registers: its signature plus the key
        argument and a Context, returning a ``CallToolResult``."""
        tool_name = name or fn.__name__
        signature = inspect.signature(fn, eval_str=True)
        params = list(signature.parameters.values())
        ctx_name = find_context_parameter(fn)  # as FastMCP finds it (Context[...] too)
        metadata = func_metadata(
            fn, skip_names=[ctx_name] if ctx_name else [], structured_output=structured_output
        )
        passes_key = self.argument is not None and self.argument in signature.parameters
        extra: list[inspect.Parameter] = []
        if self.argument is not None and not passes_key:
            extra.append(
                inspect.Parameter(self.argument, inspect.Parameter.KEYWORD_ONLY, annotation=str)
            )
        own_ctx = ctx_name is None
        wrapper_ctx = ctx_name or "idemkey_ctx"
        if own_ctx:
            extra.append(
                inspect.Parameter(
                    wrapper_ctx, inspect.Parameter.KEYWORD_ONLY, annotation=Context, default=None
                )
            )
        # keyword-only parameters after the function's own (keep defaults last among them)
        positional = [p for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        keyword = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
        new_params = (
            [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in positional] + keyword + extra
        )
        new_params.sort(key=lambda p: p.default is not inspect.Parameter.empty)
        is_async = inspect.iscoroutinefunction(fn)

        @functools.wraps(fn)
        async def wrapper(**kwargs: Any) -> CallToolResult:
            ctx: Context[Any, Any, Any] = kwargs[wrapper_ctx]
            key = self._key(kwargs, ctx)
            arguments = {k: v for k, v in kwargs.items() if k != wrapper_ctx}
            if self.argument is not None and not passes_key:
                arguments.pop(self.argument, None)
            call_kwargs = {k: v for k, v in kwargs.items() if not (own_ctx and k == wrapper_ctx)}
            if self.argument is not None and not passes_key:
                call_kwargs.pop(self.argument, None)
            fingerprint = {
                "tool": tool_name,
                "arguments": {k: _plain(v) for k, v in arguments.items() if k != self.argument},
            }
            if is_async:
                body: Callable[[], Awaitable[Any]] = functools.partial(fn, **call_kwargs)
            else:
                # A worker thread: the event loop stays free, so the store's heartbeat renews
                # the lease while a long synchronous tool runs.
                body = functools.partial(asyncio.to_thread, fn, **call_kwargs)
            once = self._once(key, fingerprint, self.scope(ctx), body, metadata.convert_result)
            # The call runs in a task of its own, which a cancel from the host (a
            # notifications/cancelled, a closed stdio) does not reach: the tool runs to its end
            # and its result is stored, so the host's retry waits for it or replays it.
            return await _outlive_cancel(asyncio.ensure_future(once))

        annotations_ = {p.name: p.annotation for p in new_params}
        annotations_["return"] = signature.return_annotation
        wrapper.__annotations__ = annotations_
        wrapper.__signature__ = signature.replace(parameters=new_params)  # type: ignore[attr-defined]
        return wrapper

    async def _once(
        self,
        key: str,
        fingerprint: object,
        principal: str,
        body: Callable[[], Awaitable[Any]],
        convert: Callable[[Any], Any],
    ) -> CallToolResult:
        """Claim the key, run the tool (or replay it) and store its result."""
        try:
            async with aguard(
                self.store, key, payload=fingerprint, scope=f"mcp:{principal}", policy=self.policy
            ) as call:
                if call.replayed:
                    return _replay(call.result)
                result = _as_result(convert(await body()))
                call.save(result.model_dump(mode="json", by_alias=True, exclude_none=True))
                return _mark(result, replayed=False)
        except KeyReuseError as exc:
            raise KeyReusedToolError(
                "this idempotency key was already used with different arguments; "
                "use a new idempotency key for a different operation"
            ) from exc
        except RequestInFlightError as exc:
            raise InFlightToolError(
                "a call with this idempotency key is still running; retry with the same "
                f"idempotency key in {exc.retry_after:g} s",
                exc.retry_after,
            ) from exc
        except InvalidKeyError as exc:
            raise InvalidKeyToolError(exc.reason) from exc
        except StoreError as exc:
            raise StoreUnavailableToolError(
                "the idempotency store is unavailable; nothing ran, retry with the same "
                "idempotency key"
            ) from exc

    def _key(self, kwargs: dict[str, Any], ctx: Context[Any, Any, Any]) -> str:
        if self.argument is not None:
            value = kwargs.get(self.argument)
            if isinstance(value, str) and value:
                return value
        if self.meta_field is not None:
            meta = None
            try:
                meta = ctx.request_context.meta
            except ValueError:
                meta = None
            value = (meta.model_extra or {}).get(self.meta_field) if meta is not None else None
            if isinstance(value, str) and value:
                return value
        where = self.argument or f"_meta.{self.meta_field}"
        raise InvalidKeyToolError(f"this tool needs an idempotency key in {where}")


def _plain(value: Any) -> Any:
    """Arguments as JSON-like data for the fingerprint (pydantic models dumped)."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return value


def _as_result(converted: Any) -> CallToolResult:
    """What FastMCP's ``convert_result`` returns, as the ``CallToolResult`` the SDK sends."""
    if isinstance(converted, CallToolResult):
        return converted
    if isinstance(converted, tuple):
        content, structured = converted
        return CallToolResult(content=list(content), structuredContent=structured)
    return CallToolResult(content=list(converted))


def _mark(result: CallToolResult, *, replayed: bool) -> CallToolResult:
    meta = dict(result.meta or {})
    meta[REPLAY_META] = {"replayed": replayed}
    return result.model_copy(update={"meta": meta})


def _replay(stored: Any) -> CallToolResult:
    result = _mark(CallToolResult.model_validate(stored), replayed=True)
    content = [*result.content, TextContent(type="text", text=REPLAY_TEXT)]
    return result.model_copy(update={"content": content})


#: Calls whose host stopped waiting, held until they finish (the loop keeps weak references).
_outliving: set[asyncio.Future[CallToolResult]] = set()


async def _outlive_cancel(call: asyncio.Future[CallToolResult]) -> CallToolResult:
    """Await ``call``; a cancel of the awaiting task leaves it running to its end."""
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        if not call.done():
            _outliving.add(call)
            call.add_done_callback(_outlived)
        raise


def _outlived(call: asyncio.Future[CallToolResult]) -> None:
    _outliving.discard(call)
    if not call.cancelled():
        call.exception()  # retrieved: its host is gone, the record says how it ended
