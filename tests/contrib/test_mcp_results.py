"""What idemkey.contrib.mcp fingerprints and keeps, across processes and releases: arguments
holding sets fingerprint the same under every hash seed, and a result that cannot be kept
still reaches the caller whose call ran it. The SDK's ClientSession in memory, a real
redis-server.
"""

from __future__ import annotations

import datetime
import decimal
import enum
import hashlib
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("mcp")
import redis.asyncio
from mcp.server.fastmcp import FastMCP
from mcp.shared.memory import create_connected_server_and_client_session
from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel, ConfigDict, field_serializer

from idemkey import AsyncRedisStore, Policy
from idemkey._codec import encode_payload
from idemkey.contrib._mcp_keys import derived_key
from idemkey.contrib._mcp_results import plain
from idemkey.contrib.mcp import IdempotentTools

ROOT = Path(__file__).resolve().parents[2]


def text(result: CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, TextContent))


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_url)
    yield client
    await client.aclose()


# What one worker fingerprints: printed by a process of its own, under the hash seed given.
SETS = textwrap.dedent(
    """
    import hashlib
    from pydantic import BaseModel
    from idemkey._codec import encode_payload
    from idemkey.contrib._mcp_keys import derived_key
    from idemkey.contrib._mcp_results import plain

    class Pack(BaseModel):
        labels: set[str]
        codes: frozenset[bytes]
        pairs: set[tuple[str, frozenset[str]]]

    class Shipment(BaseModel):
        order_id: str
        labels: set[str]
        packs: list[Pack]
        by_bin: dict[int, frozenset[str]]

    labels = {"fragile", "express", "gift", "insured", "priority", "heavy", "cold"}
    pack = Pack(labels=labels, codes=frozenset({b"a1", b"b2", b"c3", b"d4"}),
                pairs={("x", frozenset({"p", "q", "r"})), ("y", frozenset({"s", "t", "u"}))})
    shipment = Shipment(order_id="o-9", labels=labels, packs=[pack], by_bin={7: labels})
    args = plain({"shipment": shipment, "tags": [{"s": labels}]})
    print(hashlib.sha256(encode_payload({"tool": "ship", "arguments": args})).hexdigest())
    print(derived_key("anonymous", "ship", args, None, None))
    """
)


def fingerprinted(seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", SETS], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_sets_in_a_model_fingerprint_the_same_under_every_hash_seed() -> None:
    """A retry after a restart, or on another worker, runs under another hash seed. Before, a
    set inside a pydantic model was listed in its iteration order (that of strings changes
    with the seed): the retry's fingerprint differed, so a retry with the same key was refused
    as idempotency_key_reused (the agent then picks a new key: a second run), and a derived
    key differed (a second run at once)."""
    first = fingerprinted("1")
    assert [fingerprinted(seed) for seed in ("2", "3", "4")] == [first] * 3


class Colour(enum.Enum):
    RED = "red"


class Line(BaseModel):
    sku: str
    qty: int


class Everything(BaseModel):
    """A model without sets, of every kind JSON dumps its own way, the model's config and
    serializers included: its fingerprint is that of earlier releases."""

    model_config = ConfigDict(ser_json_timedelta="float", ser_json_bytes="base64")

    when: datetime.datetime
    day: datetime.date
    took: datetime.timedelta
    price: decimal.Decimal
    id: uuid.UUID
    blob: bytes
    colour: Colour
    lines: list[Line]
    by_bin: dict[int, Line]
    pair: tuple[int, str]
    hidden: str
    maybe: Line | None = None

    @field_serializer("hidden", when_used="json")
    def masked(self, value: str) -> str:
        return value.upper()


def test_a_model_without_sets_fingerprints_as_earlier_releases() -> None:
    """The fix for sets must not move any other fingerprint (a retry across the upgrade must
    still match its record): a model without sets is its JSON dump, as it always was."""
    model = Everything(
        when=datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
        day=datetime.date(2026, 1, 2),
        took=datetime.timedelta(seconds=90),
        price=decimal.Decimal("1.50"),
        id=uuid.UUID(int=7),
        blob=b"\x00\xff",
        colour=Colour.RED,
        lines=[Line(sku="A", qty=2)],
        by_bin={3: Line(sku="B", qty=1)},
        pair=(1, "x"),
        hidden="secret",
    )
    args = plain({"everything": model, "tags": [model], "n": 3})
    assert args == {
        "everything": model.model_dump(mode="json"),
        "tags": [model.model_dump(mode="json")],
        "n": 3,
    }
    fingerprint = encode_payload({"tool": "t", "arguments": args})
    # As 0.x computed it, before sets in models were ordered.
    digest = "2303533212369593e78a0ed4fa3557e66817c61a1eb20a3a6f6191fef86e76b8"
    assert hashlib.sha256(fingerprint).hexdigest() == digest
    derived = "derived-f2aae2e82c3cd2e43942a6b26755f9037ea32c85e6c4a0e426ade5fe5aa3454e"
    assert derived_key("anonymous", "t", args, None, None) == derived


class Counted(BaseModel):
    ids: set[int]


def test_a_set_of_integers_in_a_model_keeps_its_order() -> None:
    """The order of a set of integers never changed with the hash seed: kept as earlier
    releases fingerprinted it, so a retry across the upgrade still matches."""
    model = Counted(ids={10, 9, 300, 2})
    assert plain({"c": model}) == {"c": model.model_dump(mode="json")}


class Transfer(BaseModel):
    tx: str
    amount_wei: int


async def test_a_result_beyond_64_bits_reaches_its_caller_and_is_not_kept(
    client: redis.asyncio.Redis, prefix: str
) -> None:
    """The tool ran and its result fits its output schema, but a record holds integers of 64
    bits: the caller whose call ran it gets the result (told it is not kept), and every
    retry is told it ran and is not kept, without running it. Before, the first caller got
    idempotency_result_not_kept too: the only copy of the result was lost."""
    store = AsyncRedisStore(client, Policy(prefix=prefix))
    server, sent = FastMCP("wallet"), []

    @IdempotentTools(store).tool(server)
    async def transfer(to: str) -> Transfer:
        """Send funds."""
        sent.append(to)
        return Transfer(tx="0xabc", amount_wei=10**20)

    args = {"to": "bob", "idempotency_key": "t-1"}
    try:
        async with create_connected_server_and_client_session(server) as session:
            first = await session.call_tool("transfer", args)
            retries = [await session.call_tool("transfer", args) for _ in range(2)]
            other = await session.call_tool("transfer", {**args, "to": "eve"})
    finally:
        await store.aclose()
    assert sent == ["bob"]
    assert not first.isError, text(first)
    assert first.structuredContent == {"tx": "0xabc", "amount_wei": 10**20}
    assert (first.meta or {})["io.idemkey/replay"] == {"replayed": False}
    assert "not kept" in text(first)
    for retry in retries:
        assert retry.isError
        assert text(retry).startswith(
            "Error executing tool transfer: idempotency_result_not_kept: "
        ), text(retry)
        assert "never with a new key" in text(retry)
    assert "idempotency_key_reused" in text(other)  # the key is used, not released


class Ticket(BaseModel):
    ticket: str
    priority: int


@pytest.mark.parametrize("structured", [True, False], ids=["a str result", "unstructured"])
async def test_a_result_of_an_earlier_output_schema_is_told_as_such_and_never_runs(
    client: redis.asyncio.Redis, prefix: str, structured: bool
) -> None:
    """v1 of a tool returned a str, v2 returns a model: a retry of a v1 call reaching v2 gets
    idempotency_result_outdated, with the text v1 sent, and the tool does not run. Before, it
    was idempotency_record_unreadable ("written by a newer release ... retry later, never
    with a new key") for the whole TTL: a retry that could never succeed."""
    store = AsyncRedisStore(client, Policy(prefix=prefix))
    v1, v2, opened = FastMCP("desk"), FastMCP("desk"), []

    if structured:

        @IdempotentTools(store).tool(v1, name="open_ticket")
        async def open_v1(title: str) -> str:
            opened.append(("v1", title))
            return "opened T-1"

    else:

        @IdempotentTools(store).tool(v1, name="open_ticket")
        async def open_v1(title: str):  # type: ignore[no-untyped-def]
            opened.append(("v1", title))
            return "opened T-1"

    @IdempotentTools(store).tool(v2, name="open_ticket")
    async def open_v2(title: str) -> Ticket:
        opened.append(("v2", title))
        return Ticket(ticket="T-2", priority=1)

    args = {"title": "printer on fire", "idempotency_key": "tk-1"}
    try:
        async with create_connected_server_and_client_session(v1) as session:
            first = await session.call_tool("open_ticket", args)
        async with create_connected_server_and_client_session(v2) as session:
            retries = [await session.call_tool("open_ticket", args) for _ in range(2)]
    finally:
        await store.aclose()
    assert not first.isError, text(first)
    assert opened == [("v1", "printer on fire")]
    for retry in retries:
        assert retry.isError
        said = text(retry)
        assert said.startswith("Error executing tool open_ticket: idempotency_result_outdated: ")
        assert "earlier version of this tool" in said
        assert "opened T-1" in said  # what the call that ran sent
        assert "later" not in said
        assert "never with a new key" in said
