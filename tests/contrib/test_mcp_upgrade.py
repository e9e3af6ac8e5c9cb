"""A retry across a deploy: the fingerprint (and a derived key) are those of the arguments the
caller sent, so a tool that gains an optional argument still matches its earlier calls; and a
record written by the release before, whose fingerprint held every default, still matches.
The SDK's ClientSession in memory, a real redis-server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("mcp")
import redis.asyncio
from mcp.server.fastmcp import FastMCP
from mcp.shared.memory import create_connected_server_and_client_session
from mcp.types import CallToolResult, TextContent

from idemkey import AsyncRedisStore, Policy, aguard
from idemkey.contrib._mcp_keys import derived_key
from idemkey.contrib.mcp import IdempotentTools

pytestmark = pytest.mark.redis


def text(result: CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, TextContent))


def replayed(result: CallToolResult) -> bool:
    return bool((result.meta or {}).get("io.idemkey/replay", {}).get("replayed"))


@pytest.fixture
async def store(redis_url: str, prefix: str) -> AsyncIterator[AsyncRedisStore]:
    client = redis.asyncio.Redis.from_url(redis_url)
    store = AsyncRedisStore(client, Policy(prefix=prefix))
    yield store
    await store.aclose()
    await client.aclose()


def payments(store: AsyncRedisStore, version: int, paid: list[Any], **options: Any) -> FastMCP:
    server = FastMCP("payments")
    tools = IdempotentTools(store, **options)
    if version == 1:

        @tools.tool(server)
        async def pay(order_id: str, amount_cents: int) -> str:
            """Pay an order."""
            paid.append(("v1", order_id))
            return f"paid {amount_cents} for {order_id}"

    else:

        @tools.tool(server)
        async def pay(order_id: str, amount_cents: int, memo: str = "") -> str:
            """Pay an order."""
            paid.append(("v2", order_id, memo))
            return f"paid {amount_cents} for {order_id}"

    return server


async def call(server: FastMCP, arguments: dict[str, Any]) -> CallToolResult:
    async with create_connected_server_and_client_session(server) as session:
        return await session.call_tool("pay", arguments)


@pytest.mark.parametrize("derive", [False, True], ids=["the model's key", "a derived key"])
async def test_a_tool_that_gains_an_optional_argument_still_replays_its_earlier_calls(
    store: AsyncRedisStore, derive: bool
) -> None:
    """v2 of the tool has a new argument with a default; the agent retries its v1 call as it
    sent it. Before, the fingerprint held the validated arguments, the new default included:
    the retry was idempotency_key_reused (whose advice, a new key, ran the payment again), and
    a derived key was a new key (the payment ran again at once)."""
    paid: list[Any] = []
    args: dict[str, Any] = {"order_id": "o-1", "amount_cents": 500}
    if not derive:
        args["idempotency_key"] = "pay-o-1"
    first = await call(payments(store, 1, paid, derive=derive), args)
    retry = await call(payments(store, 2, paid, derive=derive), args)
    assert not first.isError, text(first)
    assert not retry.isError, text(retry)
    assert replayed(retry)
    assert paid == [("v1", "o-1")]
    # What the caller sends decides: the new argument sent is another call.
    other = await call(payments(store, 2, paid, derive=derive), {**args, "memo": "rent"})
    if derive:
        assert not other.isError, text(other)
        assert not replayed(other)
    else:
        assert "idempotency_key_reused" in text(other)


@pytest.mark.parametrize("derive", [False, True], ids=["the model's key", "a derived key"])
async def test_a_record_of_the_release_before_with_every_default_still_matches(
    store: AsyncRedisStore, derive: bool
) -> None:
    """The release before fingerprinted every validated argument, the defaults the caller
    left out included, and derived its key from them: such a record is still found (for one
    release), and replayed rather than refused or run again."""
    paid: list[Any] = []
    server = payments(store, 2, paid, derive=derive)
    every = {"order_id": "o-2", "amount_cents": 700, "memo": ""}
    key = derived_key("anonymous", "pay", every, None, None) if derive else "pay-o-2"
    async with aguard(
        store,
        key,
        payload={"tool": "pay", "arguments": every},
        scope="mcp:anonymous",
        policy=IdempotentTools(store).policy,
    ) as earlier:
        sent = "paid 700 for o-2"
        earlier.save(
            {"content": [{"type": "text", "text": sent}], "structuredContent": {"result": sent}}
        )
    args: dict[str, Any] = {"order_id": "o-2", "amount_cents": 700}
    if not derive:
        args["idempotency_key"] = key
    retry = await call(server, args)
    assert not retry.isError, text(retry)
    assert replayed(retry)
    assert text(retry).startswith("paid 700 for o-2")
    assert paid == []
