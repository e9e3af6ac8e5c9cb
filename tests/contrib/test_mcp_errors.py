"""What the agent is told when idemkey cannot answer a tool call, by phase (docs/mcp.md,
"Errors"): before the tool ran, nothing ran; after it ran with its outcome not recorded, it
may have run (the same key later, never a new one). The SDK's ClientSession in memory, a real
redis-server; a store that fails where the test says.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("mcp")
import redis.asyncio
from mcp.server.fastmcp import FastMCP
from mcp.shared.memory import create_connected_server_and_client_session
from mcp.types import CallToolResult, TextContent

from idemkey import AsyncRedisStore, Policy
from idemkey.contrib._mcp_errors import tool_error
from idemkey.contrib.mcp import IdempotentTools
from idemkey.errors import JobDeadlineError, ResultNotStorableError, StoreError

pytestmark = pytest.mark.redis


def text(result: CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, TextContent))


class FailingComplete(AsyncRedisStore):
    async def complete(self, *args: Any, **kwargs: Any) -> bool:
        raise StoreError("Redis failed during complete: ConnectionError")


class FailingClaim(AsyncRedisStore):
    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreError("Redis failed during claim: ConnectionError")


class TakenOver(AsyncRedisStore):
    async def complete(self, *args: Any, **kwargs: Any) -> bool:
        return False  # the record is another owner's by now


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def charge_once(store: AsyncRedisStore) -> tuple[CallToolResult, list[str]]:
    server, charged = FastMCP("charges"), []

    @IdempotentTools(store).tool(server)
    async def charge(amount: int) -> str:
        """Charge the card."""
        charged.append("charged")
        return f"charged {amount}"

    async with create_connected_server_and_client_session(server) as session:
        result = await session.call_tool("charge", {"amount": 5, "idempotency_key": "e-1"})
    await store.aclose()
    return result, charged


async def test_a_store_failure_after_the_tool_ran_is_not_nothing_ran(
    client: redis.asyncio.Redis, prefix: str
) -> None:
    result, charged = await charge_once(FailingComplete(client, Policy(prefix=prefix)))
    assert charged == ["charged"]
    assert result.isError
    assert "idempotency_outcome_unknown: " in text(result)
    assert "may have run: retry with the same idempotency key later" in text(result)
    assert "never with a new key" in text(result)
    assert "nothing ran" not in text(result)


async def test_a_store_failure_before_the_tool_ran_says_nothing_ran(
    client: redis.asyncio.Redis, prefix: str
) -> None:
    result, charged = await charge_once(FailingClaim(client, Policy(prefix=prefix)))
    assert charged == []
    assert "idempotency_store_unavailable: " in text(result)
    assert "nothing ran: retry with the same idempotency key" in text(result)


async def test_a_lost_lease_says_the_call_may_have_run(
    client: redis.asyncio.Redis, prefix: str
) -> None:
    result, charged = await charge_once(TakenOver(client, Policy(prefix=prefix)))
    assert charged == ["charged"]
    assert "idempotency_outcome_unknown: another executor took this call over" in text(result)


def test_steps_and_results_not_kept_have_codes() -> None:
    deadline = tool_error(JobDeadlineError("k", 30), ran=True)
    assert deadline is not None
    assert str(deadline).startswith("idempotency_steps_exhausted: ")
    assert "retry with the same idempotency key to resume" in str(deadline)
    not_kept = tool_error(ResultNotStorableError("k", "it could not be encoded"), ran=False)
    assert not_kept is not None
    assert str(not_kept).startswith("idempotency_result_not_kept: ")


async def test_a_sync_tool_runs_in_a_worker_thread(
    client: redis.asyncio.Redis, prefix: str
) -> None:
    # The event loop stays free, so the store's heartbeat renews the claim of a long tool.
    server, threads = FastMCP("sync"), []

    @IdempotentTools(AsyncRedisStore(client, Policy(prefix=prefix))).tool(server)
    def export(name: str) -> str:
        """Export a report."""
        threads.append(threading.current_thread())
        return f"exported {name}"

    async with create_connected_server_and_client_session(server) as session:
        result = await session.call_tool("export", {"name": "q3", "idempotency_key": "s-1"})
    assert text(result) == "exported q3"
    assert threads
    assert threads[0] is not threading.main_thread()
