"""The results of :mod:`idemkey.contrib.mcp`: the arguments as fingerprinted, a tool's value as
the ``CallToolResult`` stored, a replay marked as one, and a call that outlives its host (its
cancel, its session)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import anyio
import msgspec
from mcp.server.fastmcp import Context
from mcp.types import CallToolResult, TextContent
from pydantic import ValidationError
from pydantic_core import to_jsonable_python

from ..errors import RecordFormatError, ResultNotStorableError
from ..guard import Call
from ._mcp_errors import ResultNotKeptToolError, arguments_unsupported, result_outdated

__all__ = [
    "REPLAY_META",
    "REPLAY_TEXT",
    "as_result",
    "kept",
    "mark",
    "outlive_cancel",
    "plain",
    "replay",
    "saved",
    "tool_context",
]

#: The ``_meta`` field of a replayed result.
REPLAY_META = "io.idemkey/replay"
#: The text block appended to a replayed result's content, where the agent reads it.
REPLAY_TEXT = (
    "[idemkey] Replay: the stored result of the first call with this idempotency key; "
    "the tool did not run again."
)
#: The text block appended to a result the record cannot hold, for the caller whose call ran.
NOT_KEPT_TEXT = (
    "[idemkey] This result is not kept: an integer in it is beyond 64 bits, which the "
    "idempotency record cannot hold. A retry with this idempotency key will not get it, and the "
    "tool will not run again for it."
)


#: What the fingerprint takes as it is (idemkey._codec.encode_payload's encoder).
_AS_IS: Final = msgspec.msgpack.Encoder(order="deterministic")
_UNENCODABLE: Final = (TypeError, OverflowError, ValueError, msgspec.EncodeError)


def plain(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The tool's validated arguments as the fingerprint and a derived key take them.

    Each argument the fingerprint takes as it is stays so (its fingerprint, and any derived
    key, are those of earlier releases: a retry across an upgrade still matches); any other is
    made JSON data, as JSON sends it: pydantic models dumped, wherever they sit, dict keys as
    strings, sets in one order. An argument that has no such form (or an integer beyond 64
    bits) raises :class:`ArgumentsUnsupportedToolError`: nothing ran."""
    converted = {}
    for name, value in arguments.items():
        try:
            _AS_IS.encode(value)
        except _UNENCODABLE:
            try:
                value = _jsonable(value)
            except _UNENCODABLE as exc:  # PydanticSerializationError is a ValueError
                raise arguments_unsupported(exc) from exc
        converted[name] = value
    return converted


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {_json_key(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        # In no iteration order: that of strings changes with each process's hash seed, and
        # a retry that reaches another worker must fingerprint the same.
        return sorted((_jsonable(v) for v in value), key=_canonical)
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # a pydantic model: as a top-level one always was, its sets ordered
        sent = dump(mode="json")
        try:
            shape = dump(mode="python")
        except _UNENCODABLE:  # a set of frozen models: dicts, which no Python set holds
            return sent
        return _ordered(shape, sent)
    return to_jsonable_python(value)


def _ordered(shape: Any, sent: Any) -> Any:
    """``sent``, a model's JSON dump, with each list that is a set in ``shape`` (its Python
    dump) in one order. The JSON dump is kept otherwise: the model's own JSON serializers
    and config are its fingerprint, that of earlier releases."""
    if isinstance(shape, (set, frozenset)) and isinstance(sent, list) and len(shape) == len(sent):
        if all(type(v) is int for v in shape):
            # Their order never changed with the hash seed: kept, as earlier releases had it.
            return sent
        if any(isinstance(v, (tuple, frozenset)) for v in shape):
            # A set of the Python dump is a new one, whose order need not be that of the JSON
            # list: its members, which may hold sets of their own, made JSON anew.
            sent = [_jsonable(v) for v in shape]
        return sorted(sent, key=_canonical)
    if isinstance(shape, dict) and isinstance(sent, dict) and len(shape) == len(sent):
        return {k: _ordered(s, v) for s, (k, v) in zip(shape.values(), sent.items(), strict=True)}
    if isinstance(shape, (list, tuple)) and isinstance(sent, list) and len(shape) == len(sent):
        return [_ordered(s, v) for s, v in zip(shape, sent, strict=True)]
    return sent


def _json_key(key: Any) -> str:
    """A dict key as JSON sends it (an int 17 as "17"), as pydantic writes it."""
    return key if isinstance(key, str) else str(next(iter(to_jsonable_python({key: None}))))


def _canonical(value: Any) -> bytes:
    return msgspec.json.encode(value, order="sorted")


def as_result(converted: Any) -> CallToolResult:
    """What FastMCP's ``convert_result`` returns, as the ``CallToolResult`` the SDK sends."""
    if isinstance(converted, CallToolResult):
        return converted
    if isinstance(converted, tuple):
        content, structured = converted
        return CallToolResult(content=list(content), structuredContent=structured)
    return CallToolResult(content=list(converted))


def _invalid(exc: ValidationError) -> str:
    """What pydantic refused, and where, without the value (pydantic's text quotes it: stored
    bytes may be anything, and the message reaches logs and the model)."""
    first = exc.errors(include_url=False, include_context=False, include_input=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "the top"
    more = exc.error_count() - 1
    return f"{first['msg']} at {where}" + (f" (and {more} more errors)" if more else "")


def kept(call: Call[Any], value: Any, convert: Callable[[Any], Any]) -> CallToolResult:
    """The tool's return ``value`` as the ``CallToolResult`` to store (``convert``: FastMCP's
    ``convert_result``, which checks it against the tool's output schema).

    The tool has run: a value that cannot be converted completes the record as "result not
    kept" (the work must not run again; every retry is told so) and raises
    :class:`ResultNotKeptToolError`, never the error of a tool that raised, which would
    release the key for a second run."""
    try:
        return as_result(convert(value))
    except Exception as exc:
        call.save_not_kept()
        if isinstance(exc, ValidationError):
            why = f"does not fit the tool's output schema ({_invalid(exc)})"
        else:
            why = f"cannot be sent as a tool result ({type(exc).__name__})"
        raise ResultNotKeptToolError(
            f"the tool ran, but its result {why}, so it is not kept; do not retry it, and "
            "never with a new key (that would run it again)"
        ) from exc


def saved(call: Call[Any], result: CallToolResult) -> CallToolResult:
    """Store ``result`` and return it marked as the first call's.

    A result the record cannot hold (an integer beyond 64 bits, which JSON and the output
    schema allow) completes the record as "result not kept" (``save()`` did so): the tool
    ran, so the caller whose call ran it still gets it, told that retries will not."""
    try:
        call.save(result.model_dump(mode="json", by_alias=True, exclude_none=True))
    except ResultNotStorableError:
        content = [*result.content, TextContent(type="text", text=NOT_KEPT_TEXT)]
        result = result.model_copy(update={"content": content})
    return mark(result, replayed=False)


def mark(result: CallToolResult, *, replayed: bool) -> CallToolResult:
    meta = dict(result.meta or {})
    meta[REPLAY_META] = {"replayed": replayed}
    return result.model_copy(update={"meta": meta})


def replay(stored: Any, convert: Callable[[Any], Any]) -> CallToolResult:
    """The stored result, marked as a replay. Stored bytes are input: a value that is not a
    ``CallToolResult``, or not one the tool returns (``convert``, FastMCP's ``convert_result``,
    checks its ``structuredContent`` against the output schema, as FastMCP does after the tool
    returns), raises :class:`~idemkey.errors.RecordFormatError`, never pydantic's error.

    A ``CallToolResult`` the output schema refuses was stored by an earlier version of the
    tool (its output schema changed since): :class:`ResultOutdatedToolError`, with the text
    it sent, for no retry would ever replay it."""
    try:
        result = CallToolResult.model_validate(stored)
    except ValidationError as exc:
        raise RecordFormatError(
            f"stored tool result is not one this tool returns: {_invalid(exc)}"
        ) from exc
    try:
        convert(result)
    except ValidationError as exc:
        sent = " ".join(c.text for c in result.content if isinstance(c, TextContent))
        raise result_outdated(_invalid(exc), sent) from exc
    result = mark(result, replayed=True)
    content = [*result.content, TextContent(type="text", text=REPLAY_TEXT)]
    return result.model_copy(update={"content": content})


#: The session's one-way sends, which a host that has gone cannot miss (those that expect an
#: answer, sampling and elicitation, still fail: nothing can stand in for the answer).
_NOTIFICATIONS: Final = frozenset(
    {
        "send_elicit_complete",
        "send_log_message",
        "send_notification",
        "send_progress_notification",
        "send_prompt_list_changed",
        "send_resource_list_changed",
        "send_resource_updated",
        "send_tool_list_changed",
    }
)
#: What a send raises once its session's streams are closed: the host has gone for good.
_GONE: Final = (anyio.ClosedResourceError, anyio.BrokenResourceError)


def tool_context(ctx: Context[Any, Any, Any]) -> Context[Any, Any, Any]:
    """``ctx`` for the tool: its logs and progress to a host that has gone are dropped.

    The call outlives its host (:func:`outlive_cancel`), but the SDK's Context is bound to
    the host's session: once that closed (the host timed out and closed its session, a
    stateless request dropped), ``ctx.info`` or ``ctx.report_progress`` would raise out of
    the tool after its work, release the key, and the retry would run the tool again."""
    try:
        request_context = ctx.request_context
    except ValueError:  # outside a request (FastMCP.call_tool): no session to send to
        return ctx
    session: Any = _Outliving(request_context.session)
    return type(ctx)(
        request_context=dataclasses.replace(request_context, session=session),
        fastmcp=ctx._fastmcp,
    )


class _Outliving:
    """The tool's session: the host's, whose notifications are dropped once it has gone."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._session, name)
        return functools.partial(_dropped, found) if name in _NOTIFICATIONS else found


async def _dropped(send: Callable[..., Awaitable[None]], *args: Any, **kwargs: Any) -> None:
    with contextlib.suppress(*_GONE):
        await send(*args, **kwargs)


#: Calls whose host stopped waiting, held until they finish (the loop keeps weak references).
_outliving: set[asyncio.Future[CallToolResult]] = set()


async def outlive_cancel(call: asyncio.Future[CallToolResult]) -> CallToolResult:
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
