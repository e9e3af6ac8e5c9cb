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
operation); the host's key is read from ``_meta.idempotencyKey`` (``meta_field=``) or
``params.idempotencyKey`` (``params_field=``); ``derive=True`` makes the key a digest of the
principal, the tool and its arguments (or its ``operation=`` argument). Every key is 1 to 255
visible ASCII characters without spaces or commas, else ``idempotency_key_invalid``.
The key is scoped by the caller's principal: who the access token the SDK's auth middleware
verified names (streamable HTTP with ``auth=``/``token_verifier=``): its client id, and its
user (``subject``) and issuer when it has a subject; narrowed by what ``principal(ctx)``
returns. Without a token, ``principal(ctx)``, else ``"anonymous"`` (stdio, or HTTP without
auth: one scope for every caller, so a key is shared by everyone who can reach the server).
The fingerprint is the tool's name and the arguments the caller sent (validated; without the
key, and without the defaults of those left out: a new optional argument changes no earlier
call's fingerprint, nor its derived key). The first call runs the tool and stores its
``CallToolResult``; a retry with the same key and arguments gets that result back, with
``_meta["io.idemkey/replay"] = {"replayed": True}`` (``False`` on the first call) and a last
text block saying it is a replay.

A reused key with other arguments raises :class:`KeyReusedToolError`; a duplicate while the
first call runs waits up to ``policy.wait`` seconds for its result, then raises
:class:`InFlightToolError` (retry with the same key). The SDK sends both as a tool error
(``isError``) whose text begins with ``idempotency_key_reused:`` or ``idempotency_key_in_flight:``
(every code, by phase: :mod:`idemkey.contrib._mcp_errors`, docs/mcp.md).
A tool that raises releases the key: a retry runs it again (what it raised, an idemkey error
of its own code included, reaches the agent as the tool's error). A result its output schema
refuses is not kept, and the tool never runs again for the key (``idempotency_result_not_kept``);
nor is one with an integer beyond 64 bits, which its first caller still gets.
A call the host cancels (``notifications/cancelled``) or leaves (its HTTP session closed) runs
to its end, its logs and progress to a gone host dropped, and its result is stored: a retry
replays it. A synchronous tool runs in a worker thread, so the store's heartbeat renews its
claim.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

try:
    from mcp.server.fastmcp import Context, FastMCP
    from mcp.server.fastmcp.utilities.context_injection import find_context_parameter
    from mcp.server.fastmcp.utilities.func_metadata import func_metadata
    from mcp.types import CallToolResult, ToolAnnotations
    from pydantic import PlainValidator, WithJsonSchema
except ImportError as exc:  # pragma: no cover - exercised with mcp hidden
    from importlib.metadata import PackageNotFoundError, version

    try:  # installed, but a version without these modules (2.x renamed FastMCP)
        _found = f"found mcp {version('mcp')} but needs mcp>=1.30,<2"
    except PackageNotFoundError:
        _found = "needs the mcp SDK"
    raise ImportError(f"idemkey.contrib.mcp {_found}: pip install 'idemkey-redis[mcp]'") from exc

from .._core import MAX_KEY_LENGTH
from .._options import derive as derived
from .._options import keyword, policy_options, seconds
from ..adapters._checks import checked_guard_policy, checked_store
from ..errors import ConfigurationError, IdemkeyError
from ..guard import aguard
from ..policy import Policy
from ..store import AsyncRedisStore
from ._mcp_errors import (
    ArgumentsUnsupportedToolError,
    IdempotencyToolError,
    InFlightToolError,
    InvalidKeyToolError,
    KeyReusedToolError,
    OutcomeUnknownToolError,
    RecordUnreadableToolError,
    ResultNotKeptToolError,
    ResultOutdatedToolError,
    StepsExhaustedToolError,
    StoreUnavailableToolError,
    tool_error,
)
from ._mcp_keys import (
    as_sent,
    call_key,
    describe,
    first_form,
    forms,
    keep_request_params,
    principal_of,
    require_argument,
    retention,
    scoped,
)
from ._mcp_results import (
    REPLAY_META,
    REPLAY_TEXT,
    kept,
    outlive_cancel,
    plain,
    replay,
    saved,
    tool_context,
)

__all__ = [
    "REPLAY_META",
    "REPLAY_TEXT",
    "ArgumentsUnsupportedToolError",
    "IdempotencyToolError",
    "IdempotentTools",
    "InFlightToolError",
    "InvalidKeyToolError",
    "KeyReusedToolError",
    "OutcomeUnknownToolError",
    "RecordUnreadableToolError",
    "ResultNotKeptToolError",
    "ResultOutdatedToolError",
    "StepsExhaustedToolError",
    "StoreUnavailableToolError",
    "principal_of",
]

ANONYMOUS = "anonymous"
#: The key argument's type: the SDK lets any value through (the tool refuses a bad one with
#: idempotency_key_invalid), and the schema the agent reads says a string. ``str`` to FastMCP,
#: which parses a string argument as JSON unless it is annotated ``str``: a key "null" or "[1]"
#: must reach the tool as sent.
KeyArgument = Annotated[
    str,
    PlainValidator(lambda value: value),
    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH}),
]
#: Agents retry after context resets and restarts: keep results for 3 days by default.
AGENT_TTL = 3 * 86_400.0


class IdempotentTools:
    """Registers FastMCP tools that run once per idempotency key (see :mod:`idemkey.contrib.mcp`).

    ``policy`` defaults to the store's with ``ttl`` and ``wait`` replaced: results are replayed
    for ``ttl`` seconds (3 days by default) and a duplicate waits up to ``wait`` seconds (5) for
    the first call's result. A ``policy`` given is used as it is (``ttl``/``wait`` with it:
    ConfigurationError). ``argument`` names the tool argument that carries the key (None:
    none); ``meta_field`` the ``_meta`` field and ``params_field`` the request's ``params``
    field read when the argument is absent (None: none). ``derive=True``: with no key sent,
    the key is derived from the call (:func:`~idemkey.contrib._mcp_keys.derived_key`;
    ``operation`` names the argument that identifies the operation, ``bucket`` a time window in
    seconds). ``principal(ctx)`` scopes keys when the SDK has no verified access token
    (stdio, HTTP without auth), and narrows the token's scope when it has one (:meth:`scope`).
    """

    def __init__(
        self,
        store: AsyncRedisStore,
        *,
        policy: Policy | None = None,
        ttl: float | None = None,
        wait: float | None = None,
        argument: str | None = "idempotency_key",
        meta_field: str | None = "idempotencyKey",
        params_field: str | None = "idempotencyKey",
        derive: bool = False,
        operation: str | None = None,
        bucket: float | None = None,
        principal: Callable[[Context[Any, Any, Any]], str | None] | None = None,
    ) -> None:
        if policy is not None and (ttl is not None or wait is not None):
            given = " and ".join(n for n, v in (("ttl=", ttl), ("wait=", wait)) if v is not None)
            raise ConfigurationError(
                f"IdempotentTools takes {given} or policy=, not both: set them in the Policy"
            )
        if (operation is not None or bucket is not None) and not derive:
            raise ConfigurationError("IdempotentTools: operation= and bucket= need derive=True")
        if bucket is not None:
            seconds(bucket, "IdempotentTools(bucket=...)")
        if derive:
            argument = None  # the key is the call's own: the model passes none
        elif argument is None and meta_field is None and params_field is None:
            raise ConfigurationError(
                "IdempotentTools needs an argument, a meta_field, a params_field or derive=True"
            )
        # Every call runs under aguard(): an AsyncRedisStore, and a policy a guard can honour.
        self.store = store = checked_store(store, AsyncRedisStore, "IdempotentTools(store=...)")
        policy = checked_guard_policy(policy, store.policy, "IdempotentTools(policy=...)")
        agent = {"ttl": AGENT_TTL if ttl is None else ttl, "wait": 5.0 if wait is None else wait}
        changes = policy_options(agent, keyword("IdempotentTools"))
        self.policy = policy or derived(store.policy, changes, "IdempotentTools(ttl=...)")
        self.argument = argument
        self.meta_field = meta_field
        self.params_field = params_field
        self.derive = derive
        self.operation = operation
        self.bucket = bucket
        self.principal = principal

    @property
    def hint(self) -> bool:
        """``idempotentHint``: whether the same arguments never have a second effect. Not so
        when the host's key decides (the same arguments under a new key run again) or a time
        bucket does (the same call in a later window runs again)."""
        return self.argument is not None or (self.derive and self.bucket is None)

    def description(self, text: str) -> str:
        """``text`` with the sentences that tell the agent how the tool is idempotent."""
        return describe(self, retention(self.policy.ttl), text)

    def scope(self, ctx: Context[Any, Any, Any]) -> str:
        """The principal a key belongs to: the verified token's (:func:`principal_of`),
        narrowed by ``principal(ctx)`` when given; without a token ``principal(ctx)``, else
        ``"anonymous"``."""
        narrowed = self.principal(ctx) if self.principal is not None else None
        return scoped(principal_of(ctx), narrowed) or ANONYMOUS

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
            update = {"idempotentHint": self.hint}
            marked = (annotations or ToolAnnotations()).model_copy(update=update)
            keep_request_params(server)  # the arguments sent, and params.idempotencyKey
            server.add_tool(
                wrapper,
                name=name or fn.__name__,
                title=title,
                description=self.description(description or fn.__doc__ or ""),
                annotations=marked,
                structured_output=structured_output,
            )
            if self.argument is not None:
                require_argument(server, name or fn.__name__, self.argument)
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
        named = [p for p in signature.parameters if p != ctx_name]
        if self.operation is not None and self.operation not in named:
            # Caught here, not at the first call: there it would be the agent's "invalid key".
            raise ConfigurationError(
                f"IdempotentTools(operation={self.operation!r}): tool {tool_name!r} has no such "
                f"argument (its arguments: {', '.join(named) or 'none'})"
            )
        passes_key = self.argument is not None and self.argument in signature.parameters
        # The key argument is optional to the SDK, so that a missing key reaches the tool's own
        # refusal (idempotency_key_invalid) rather than pydantic's "Field required"; the schema
        # still says a string. A function that declares it (``idempotency_key: str``) gets the
        # key in use, checked, whichever way it came: its own annotation is not the SDK's.
        only = inspect.Parameter.KEYWORD_ONLY
        key_param = inspect.Parameter(
            self.argument or "key", only, annotation=KeyArgument, default=None
        )
        params = [key_param if p.name == self.argument else p for p in params]
        extra = [key_param] if self.argument is not None and not passes_key else []
        own_ctx = ctx_name is None
        wrapper_ctx = ctx_name or "idemkey_ctx"
        if own_ctx:
            extra.append(inspect.Parameter(wrapper_ctx, only, annotation=Context, default=None))
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
            principal = self.scope(ctx)
            # The tool gets the key and a Context only when it declares them; no Context is hashed.
            call_kwargs = dict(kwargs)
            if own_ctx:
                del call_kwargs[wrapper_ctx]
            elif ctx is not None:
                call_kwargs[wrapper_ctx] = tool_context(ctx)  # its host may go while it runs
            if self.argument is not None and not passes_key:
                call_kwargs.pop(self.argument, None)
            arguments = {k: v for k, v in call_kwargs.items() if k != wrapper_ctx}
            every = plain({k: v for k, v in arguments.items() if k != self.argument})
            args = as_sent(every)  # what the caller sent is the call, not this version's defaults
            key = call_key(self, kwargs, ctx, principal, tool_name, args, every)
            if passes_key and self.argument is not None:
                call_kwargs[self.argument] = key  # checked, wherever it came from
            if is_async:
                body: Callable[[], Awaitable[Any]] = functools.partial(fn, **call_kwargs)
            else:
                # A worker thread: the event loop stays free, so the store's heartbeat renews
                # the lease while a long synchronous tool runs.
                body = functools.partial(asyncio.to_thread, fn, **call_kwargs)
            convert = metadata.convert_result
            once = self._forms(key, tool_name, args, every, principal, body, convert)
            # The call runs in a task of its own, which a cancel from the host (a
            # notifications/cancelled, a closed HTTP session) does not reach: the tool runs to
            # its end and its result is stored, so the host's retry waits for it or replays it.
            # A closed stdio session ends the server process, which cancels this task too: the
            # key is then kept until its lease lapses, and the retry takes the call over.
            return await outlive_cancel(asyncio.ensure_future(once))

        annotations_ = {p.name: p.annotation for p in new_params}
        annotations_["return"] = signature.return_annotation
        wrapper.__annotations__ = annotations_
        wrapper.__signature__ = signature.replace(parameters=new_params)  # type: ignore[attr-defined]
        return wrapper

    async def _forms(
        self,
        key: str,
        tool: str,
        sent: dict[str, Any],
        every: dict[str, Any],
        principal: str,
        body: Callable[[], Awaitable[Any]],
        convert: Callable[[Any], Any],
    ) -> CallToolResult:
        """:meth:`_once` under the fingerprint of the arguments sent, or of every argument for
        a record of 0.3 (:func:`~idemkey.contrib._mcp_keys.forms`)."""
        try:
            tried = await forms(self, self.store, self.policy, principal, tool, key, sent, every)
        except IdemkeyError as exc:  # a StoreError of the read: nothing ran
            error = tool_error(exc, False)
            if error is None:
                raise
            raise error from exc

        async def attempt(key: str, arguments: dict[str, Any]) -> CallToolResult:
            fingerprint = {"tool": tool, "arguments": arguments}
            return await self._once(key, fingerprint, principal, body, convert)

        return await first_form(tried, attempt)

    async def _once(
        self,
        key: str,
        fingerprint: object,
        principal: str,
        body: Callable[[], Awaitable[Any]],
        convert: Callable[[Any], Any],
    ) -> CallToolResult:
        """Claim the key, run the tool (or replay it) and store its result. What the guard
        raises is told to the agent by its code; what the tool raises is the tool's own."""
        ran = False  # whether the tool's body started: a store failure then is not "nothing ran"
        own: BaseException | None = None  # the tool's own exception (its own aguard's, say)
        try:
            async with aguard(
                self.store, key, payload=fingerprint, scope=f"mcp:{principal}", policy=self.policy
            ) as call:
                if call.replayed:
                    return replay(call.result, convert)
                ran = True
                try:
                    value = await body()
                except Exception as exc:
                    own = exc
                    raise
                return saved(call, kept(call, value, convert))
        except IdemkeyError as exc:
            if exc is own:
                raise
            error = tool_error(exc, ran)
            if error is None:
                raise
            raise error from exc
