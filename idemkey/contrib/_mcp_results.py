"""The results of :mod:`idemkey.contrib.mcp`: a tool's value as the ``CallToolResult`` stored,
a replay marked as one, and a call that outlives its host's cancel."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from mcp.types import CallToolResult, TextContent
from pydantic import ValidationError

from ..errors import RecordFormatError

__all__ = ["REPLAY_META", "REPLAY_TEXT", "as_result", "mark", "outlive_cancel", "plain", "replay"]

#: The ``_meta`` field of a replayed result.
REPLAY_META = "io.idemkey/replay"
#: The text block appended to a replayed result's content, where the agent reads it.
REPLAY_TEXT = (
    "[idemkey] Replay: the stored result of the first call with this idempotency key; "
    "the tool did not run again."
)


def plain(value: Any) -> Any:
    """Arguments as JSON-like data for the fingerprint (pydantic models dumped)."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return value


def as_result(converted: Any) -> CallToolResult:
    """What FastMCP's ``convert_result`` returns, as the ``CallToolResult`` the SDK sends."""
    if isinstance(converted, CallToolResult):
        return converted
    if isinstance(converted, tuple):
        content, structured = converted
        return CallToolResult(content=list(content), structuredContent=structured)
    return CallToolResult(content=list(converted))


def mark(result: CallToolResult, *, replayed: bool) -> CallToolResult:
    meta = dict(result.meta or {})
    meta[REPLAY_META] = {"replayed": replayed}
    return result.model_copy(update={"meta": meta})


def replay(stored: Any, convert: Callable[[Any], Any]) -> CallToolResult:
    """The stored result, marked as a replay. Stored bytes are input: a value that is not a
    ``CallToolResult``, or not one the tool returns (``convert``, FastMCP's ``convert_result``,
    checks its ``structuredContent`` against the output schema, as FastMCP does after the tool
    returns), raises :class:`~idemkey.errors.RecordFormatError`, never pydantic's error."""
    try:
        result = CallToolResult.model_validate(stored)
        convert(result)
    except ValidationError as exc:
        # Named without the stored value (pydantic's text quotes it): stored bytes may be
        # anything, and the message reaches logs.
        first = exc.errors(include_url=False, include_context=False, include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "the top"
        more = exc.error_count() - 1
        raise RecordFormatError(
            f"stored tool result is not one this tool returns: {first['msg']} at {where}"
            + (f" (and {more} more errors)" if more else "")
        ) from exc
    result = mark(result, replayed=True)
    content = [*result.content, TextContent(type="text", text=REPLAY_TEXT)]
    return result.model_copy(update={"content": content})


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
