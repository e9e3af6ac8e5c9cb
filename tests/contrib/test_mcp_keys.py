"""Where an MCP tool call's key comes from, and the one grammar it follows (docs/mcp.md, "The
key"): the SDK's own ClientSession (in memory) against a FastMCP server and a real redis-server.

A malformed key is refused with ``idempotency_key_invalid`` and the tool does not run; the
host's key in ``_meta`` or in ``params.idempotencyKey`` (SEP-3182) dedupes with no model
cooperation; a derived key makes the same call one operation whatever key the model invents.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("mcp")
import redis
import redis.asyncio
from mcp import ClientSession
from mcp.server.fastmcp import Context, FastMCP
from mcp.shared.memory import create_connected_server_and_client_session
from mcp.types import (
    CallToolRequest,
    CallToolRequestParams,
    CallToolResult,
    ClientRequest,
    TextContent,
)

from idemkey import AsyncRedisStore, ConfigurationError, Policy, RedisStore
from idemkey.contrib.mcp import IdempotentTools

pytestmark = pytest.mark.redis


def text(result: CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, TextContent))


def replayed(result: CallToolResult) -> bool:
    return bool((result.meta or {})["io.idemkey/replay"]["replayed"])


@pytest.fixture
async def store(redis_url: str, prefix: str) -> AsyncIterator[AsyncRedisStore]:
    client = redis.asyncio.Redis.from_url(redis_url)
    store = AsyncRedisStore(client, Policy(prefix=prefix))
    yield store
    await store.aclose()
    await client.aclose()


def payments(tools: IdempotentTools, paid: list[str]) -> FastMCP:
    server = FastMCP("payments")

    @tools.tool(server)
    async def pay(order_id: str, amount: int) -> str:
        """Pay an order."""
        paid.append(order_id)
        return f"paid {order_id}: {amount} (payment {len(paid)})"

    return server


MALFORMED = {
    "missing": None,
    "empty": "",
    "too long": "k" * 256,
    "NUL": "a\x00b",
    "newline": "a\nb",
    "ESC": "\x1b[31mred",
    "spaces inside": "refund order 1001",
    "spaces only": "   ",
    "not ASCII": "clé-1",
    "a number": 1001,
}


@pytest.mark.parametrize("key", MALFORMED.values(), ids=MALFORMED.keys())
async def test_a_malformed_key_is_refused_and_the_tool_does_not_run(
    store: AsyncRedisStore, key: object
) -> None:
    paid: list[str] = []
    args: dict[str, Any] = {"order_id": "1001", "amount": 5}
    if key is not None:
        args["idempotency_key"] = key
    async with create_connected_server_and_client_session(
        payments(IdempotentTools(store), paid)
    ) as session:
        refused = await session.call_tool("pay", args)
    assert refused.isError
    assert text(refused).startswith("Error executing tool pay: idempotency_key_invalid: ")
    assert "idempotency_key" in text(refused)
    assert paid == []


async def test_a_key_of_255_visible_characters_is_a_key(store: AsyncRedisStore) -> None:
    paid: list[str] = []
    key = "".join(chr(0x21 + i % 94) for i in range(255)).replace(",", ".")
    args = {"order_id": "1001", "amount": 5, "idempotency_key": key}
    async with create_connected_server_and_client_session(
        payments(IdempotentTools(store), paid)
    ) as session:
        (tool,) = (await session.list_tools()).tools
        first = await session.call_tool("pay", args)
        again = await session.call_tool("pay", args)
    assert not first.isError, text(first)
    assert replayed(again)
    assert paid == ["1001"]
    assert "idempotency_key" in tool.inputSchema["required"]  # still asked of the model
    assert "visible ASCII" in (tool.description or "")


async def call_with_params(session: ClientSession, key: str) -> CallToolResult:
    """A tools/call whose params carry ``idempotencyKey`` (the shape SEP-3182 proposed)."""
    params = CallToolRequestParams(
        name="pay", arguments={"order_id": "1001", "amount": 5}, idempotencyKey=key
    )
    request = ClientRequest(CallToolRequest(params=params))
    return await session.send_request(request, CallToolResult)


@pytest.mark.parametrize("where", ["_meta", "params"])
async def test_the_hosts_key_dedupes(store: AsyncRedisStore, where: str) -> None:
    paid: list[str] = []
    tools = IdempotentTools(store, argument=None)
    async with create_connected_server_and_client_session(payments(tools, paid)) as session:
        (tool,) = (await session.list_tools()).tools
        results = []
        for _ in range(2):
            if where == "_meta":
                args = {"order_id": "1001", "amount": 5}
                meta = {"idempotencyKey": "host-call-1"}
                results.append(await session.call_tool("pay", args, meta=meta))
            else:
                results.append(await call_with_params(session, "host-call-1"))
        bad = await call_with_params(session, "host call 2")
    first, again = results
    assert not first.isError, text(first)
    assert not replayed(first)
    assert replayed(again)
    assert paid == ["1001"]
    assert bad.isError
    assert "idempotency_key_invalid" in text(bad)
    assert set(tool.inputSchema["properties"]) == {"order_id", "amount"}
    assert tool.annotations is not None
    assert tool.annotations.idempotentHint is False  # the same arguments under a new key run


async def test_a_derived_key_ignores_the_keys_the_model_makes_up(store: AsyncRedisStore) -> None:
    paid: list[str] = []
    tools = IdempotentTools(store, derive=True)
    async with create_connected_server_and_client_session(payments(tools, paid)) as session:
        (tool,) = (await session.list_tools()).tools
        first = await session.call_tool(
            "pay", {"order_id": "1001", "amount": 5, "idempotency_key": "model-made-1"}
        )
        again = await session.call_tool(
            "pay", {"order_id": "1001", "amount": 5, "idempotency_key": "model-made-2"}
        )
        other = await session.call_tool("pay", {"order_id": "1001", "amount": 6})
    assert not first.isError, text(first)
    assert replayed(again)
    assert not other.isError  # other arguments: another operation
    assert paid == ["1001", "1001"]
    assert set(tool.inputSchema["properties"]) == {"order_id", "amount"}
    assert "returns the first result" in (tool.description or "")
    assert tool.annotations is not None
    assert tool.annotations.idempotentHint is True


async def test_a_key_derived_from_the_operation_argument(store: AsyncRedisStore) -> None:
    paid: list[str] = []
    tools = IdempotentTools(store, derive=True, operation="order_id")
    async with create_connected_server_and_client_session(payments(tools, paid)) as session:
        first = await session.call_tool(
            "pay", {"order_id": "1001", "amount": 5, "idempotency_key": "model-made-1"}
        )
        again = await session.call_tool(
            "pay", {"order_id": "1001", "amount": 5, "idempotency_key": "model-made-2"}
        )
        changed = await session.call_tool("pay", {"order_id": "1001", "amount": 6})
        second_order = await session.call_tool("pay", {"order_id": "1002", "amount": 5})
    assert not first.isError, text(first)
    assert replayed(again)
    assert changed.isError  # the same order with another amount: refused, not paid twice
    assert "idempotency_key_reused" in text(changed)
    assert not second_order.isError
    assert paid == ["1001", "1002"]


def test_conflicting_options_are_refused_by_name(store: AsyncRedisStore) -> None:
    with pytest.raises(ConfigurationError, match=r"ttl= or policy="):
        IdempotentTools(store, policy=store.policy, ttl=60)
    with pytest.raises(ConfigurationError, match=r"ttl= and wait= or policy="):
        IdempotentTools(store, policy=store.policy, ttl=60, wait=1)
    with pytest.raises(ConfigurationError, match=r"operation= and bucket= need derive=True"):
        IdempotentTools(store, operation="order_id")
    with pytest.raises(ConfigurationError, match="needs an argument"):
        IdempotentTools(store, argument=None, meta_field=None, params_field=None)


DEAD = "redis://127.0.0.1:1/0"
BAD_TOOLS = {
    # On main: a sync store accepted (every call then failed), a client an AttributeError,
    # bucket="60" a TypeError, True and inf accepted, ttl=10 an error naming Policy's lease.
    "sync store": (
        lambda store: IdempotentTools(RedisStore(redis.Redis.from_url(DEAD))),
        "IdempotentTools(store=...): expected an idemkey.AsyncRedisStore, got a RedisStore",
    ),
    "client": (
        lambda store: IdempotentTools(redis.asyncio.Redis.from_url(DEAD)),
        "IdempotentTools(store=...): expected an idemkey.AsyncRedisStore, got a Redis client",
    ),
    "policy=dict": (
        lambda store: IdempotentTools(store, policy={"ttl": 5}),
        "IdempotentTools(policy=...): expected an idemkey.Policy or None, got dict",
    ),
    "policy=http-only": (
        lambda store: IdempotentTools(store, policy=Policy(require_key=False)),
        "IdempotentTools(policy=...): Policy.require_key applies to HTTP requests only",
    ),
    "bucket=str": (
        lambda store: IdempotentTools(store, derive=True, bucket="60"),
        "IdempotentTools(bucket=...): expected a number of seconds > 0, got the string '60'",
    ),
    "bucket=True": (
        lambda store: IdempotentTools(store, derive=True, bucket=True),
        "IdempotentTools(bucket=...): expected a number of seconds > 0, got True (bool)",
    ),
    "bucket=inf": (
        lambda store: IdempotentTools(store, derive=True, bucket=float("inf")),
        "IdempotentTools(bucket=...): expected a finite number of seconds > 0, got inf",
    ),
    "bucket=0": (
        lambda store: IdempotentTools(store, derive=True, bucket=0),
        "IdempotentTools(bucket=...): expected a finite number of seconds > 0, got 0",
    ),
    "ttl=10": (
        lambda store: IdempotentTools(store, ttl=10),
        "IdempotentTools(ttl=...): Policy: need lease < ttl, got lease=30 ttl=10",
    ),
    "ttl=str": (
        lambda store: IdempotentTools(store, ttl="3600"),
        "IdempotentTools(ttl=...): expected a number of seconds > 0, got the string '3600'",
    ),
    "wait=-1": (
        lambda store: IdempotentTools(store, wait=-1),
        "IdempotentTools(wait=...): expected a finite number of seconds >= 0, got -1",
    ),
}


@pytest.mark.parametrize("name", BAD_TOOLS)
def test_a_bad_argument_is_refused_naming_the_parameter(store: AsyncRedisStore, name: str) -> None:
    build, says = BAD_TOOLS[name]
    with pytest.raises(ConfigurationError) as raised:
        build(store)
    assert str(raised.value).startswith(says), str(raised.value)


def test_good_arguments_are_taken(store: AsyncRedisStore) -> None:
    assert IdempotentTools(store, derive=True, bucket=60).bucket == 60
    assert IdempotentTools(store, ttl=3600, wait=0).policy.ttl == 3600
    assert IdempotentTools(store, policy=store.policy.replace(ttl=60)).policy.ttl == 60


async def test_a_tool_that_declares_the_key_and_a_context_gets_both(
    store: AsyncRedisStore,
) -> None:
    """A tool may take the key argument and a Context itself: it gets them, and neither is part
    of the fingerprint (the same key and arguments replay; other arguments are refused)."""
    seen: list[tuple[str, str, bool]] = []
    server = FastMCP("payments")

    @IdempotentTools(store).tool(server)
    async def pay(order_id: str, idempotency_key: str, ctx: Context[Any, Any, Any]) -> str:
        """Pay an order."""
        seen.append((order_id, idempotency_key, isinstance(ctx, Context)))
        return f"paid {order_id}"

    args = {"order_id": "1001", "idempotency_key": "pay-1001"}
    async with create_connected_server_and_client_session(server) as session:
        first = await session.call_tool("pay", args)
        again = await session.call_tool("pay", args)
        other = await session.call_tool("pay", {**args, "order_id": "1002"})
    assert not first.isError, text(first)
    assert replayed(again)
    assert text(again).startswith("paid 1001")
    assert text(other).startswith("Error executing tool pay: idempotency_key_reused: ")
    assert seen == [("1001", "pay-1001", True)]


DECLARED_REFUSED = {"missing": None, "a number": 5, "null": "null"}


@pytest.mark.parametrize("key", DECLARED_REFUSED.values(), ids=DECLARED_REFUSED.keys())
async def test_a_tool_that_declares_the_key_as_a_str_still_refuses_with_the_code(
    store: AsyncRedisStore, key: object
) -> None:
    """The function's own ``idempotency_key: str`` is not what the SDK checks: every refusal,
    a missing key included, is idempotency_key_invalid. Before, pydantic answered first
    ("Field required", "Input should be a valid string")."""
    paid: list[str] = []
    server = FastMCP("payments")

    @IdempotentTools(store).tool(server)
    async def pay(order_id: str, idempotency_key: str) -> str:
        """Pay an order."""
        paid.append(idempotency_key)
        return f"paid {order_id}"

    args: dict[str, Any] = {"order_id": "1001"}
    if key is not None:
        args["idempotency_key"] = None if key == "null" else key
    async with create_connected_server_and_client_session(server) as session:
        (tool,) = (await session.list_tools()).tools
        refused = await session.call_tool("pay", args)
    assert "idempotency_key" in tool.inputSchema["required"]
    assert tool.inputSchema["properties"]["idempotency_key"]["type"] == "string"
    assert refused.isError
    assert text(refused).startswith("Error executing tool pay: idempotency_key_invalid: ")
    assert paid == []


async def test_a_tool_that_declares_the_key_gets_the_key_in_use(store: AsyncRedisStore) -> None:
    """Whichever way the key came (the argument, or the host's ``_meta`` when the argument is
    absent), the function that declares it gets that key, checked."""
    seen: list[str] = []
    server = FastMCP("payments")

    @IdempotentTools(store).tool(server)
    async def pay(order_id: str, idempotency_key: str) -> str:
        """Pay an order."""
        seen.append(idempotency_key)
        return f"paid {order_id}"

    async with create_connected_server_and_client_session(server) as session:
        by_argument = await session.call_tool("pay", {"order_id": "1", "idempotency_key": "k-1"})
        by_meta = await session.call_tool("pay", {"order_id": "2"}, meta={"idempotencyKey": "k-2"})
    assert not by_argument.isError, text(by_argument)
    assert not by_meta.isError, text(by_meta)
    assert seen == ["k-1", "k-2"]


#: Keys of the grammar that JSON would read as something else.
JSON_LOOKING = ["null", "[1]", "[]", "{}", '["a"]', "true", "123", '{"a":1}']


@pytest.mark.parametrize("key", JSON_LOOKING)
async def test_a_key_that_looks_like_json_is_that_key(store: AsyncRedisStore, key: str) -> None:
    """The key argument reaches the tool as the string sent: FastMCP parses a string argument
    as JSON unless its annotation is ``str``. Before, "null" read as no key (with a host key in
    ``_meta``, the host's was used instead) and "[1]", "[]", "{}" were refused as no string."""
    seen: list[str] = []
    server = FastMCP("payments")

    @IdempotentTools(store).tool(server)
    async def pay(order_id: str, idempotency_key: str) -> str:
        """Pay an order."""
        seen.append(idempotency_key)
        return f"paid {order_id}"

    args = {"order_id": "1001", "idempotency_key": key}
    async with create_connected_server_and_client_session(server) as session:
        (tool,) = (await session.list_tools()).tools
        first = await session.call_tool("pay", args, meta={"idempotencyKey": "host-1"})
        again = await session.call_tool("pay", args)
    assert not first.isError, text(first)
    assert replayed(again)
    assert seen == [key]  # the model's key, not the host's
    assert tool.inputSchema["properties"]["idempotency_key"] == {
        "default": None,
        "maxLength": 255,
        "minLength": 1,
        "title": "Idempotency Key",
        "type": "string",
    }


NOT_STRINGS = {"a list": ["k-1"], "an object": {"k": 1}, "true": True, "a float": 1.5}


@pytest.mark.parametrize("key", NOT_STRINGS.values(), ids=NOT_STRINGS.keys())
async def test_a_key_that_is_no_string_is_still_refused(
    store: AsyncRedisStore, key: object
) -> None:
    paid: list[str] = []
    async with create_connected_server_and_client_session(
        payments(IdempotentTools(store), paid)
    ) as session:
        refused = await session.call_tool(
            "pay", {"order_id": "1001", "amount": 5, "idempotency_key": key}
        )
    assert text(refused).startswith("Error executing tool pay: idempotency_key_invalid: ")
    assert "must be a string" in text(refused)
    assert paid == []


def test_an_operation_that_is_no_argument_of_the_tool_is_refused_at_registration(
    store: AsyncRedisStore,
) -> None:
    """Before, the typo was taken, and every call told the agent its key was invalid."""
    tools = IdempotentTools(store, derive=True, operation="orderid")
    with pytest.raises(ConfigurationError, match=r"operation='orderid'.*order_id, amount"):
        payments(tools, [])
    server = FastMCP("payments")

    async def refund(order_id: str, ctx: Context[Any, Any, Any]) -> str:
        return "refunded"

    with pytest.raises(ConfigurationError, match="operation='ctx'"):
        IdempotentTools(store, derive=True, operation="ctx").tool(server)(refund)
