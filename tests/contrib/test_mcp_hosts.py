"""Who calls, and a host that goes away: idemkey.contrib.mcp over real streamable HTTP (a
uvicorn process serving tests/contrib/_mcp_server.py) with the SDK's own client, against a
real redis-server (docs/mcp.md, "Whose key" and "A cancelled call").
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("mcp")
import httpx
import redis
from mcp import ClientSession, McpError
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from tests._servers import AppServer
from tests.contrib.test_mcp import environment, gate, replayed, runs, serve_http

pytestmark = pytest.mark.redis
Serve = Callable[..., str]
Session = Callable[..., AbstractAsyncContextManager[ClientSession]]


@pytest.fixture
def serve(redis_url: str, prefix: str, tmp_path: Path) -> Iterator[Serve]:
    """``serve(app, wait)``: the URL of ``_mcp_server``'s ``app`` on a uvicorn process."""
    started: list[tuple[AppServer, Path]] = []

    def start(app: str = "app", wait: float = 0) -> str:
        path = tmp_path / f"{app}.log"
        server = serve_http(environment(redis_url, prefix, wait), path, app)
        started.append((server, path))
        return f"http://127.0.0.1:{server.port}/mcp"

    try:
        yield start
    finally:
        for server, path in started:
            server.close()
            print(path.read_text(errors="replace")[-20000:])  # shown when failing


@asynccontextmanager
async def session(url: str, token: str, **headers: str) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}", **headers}
    async with (
        httpx.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(url, http_client=http) as (read, write, _),
        ClientSession(read, write) as client,
    ):
        await client.initialize()
        yield client


async def until(predicate: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def by(result: CallToolResult) -> object:
    assert not result.isError, result
    assert result.structuredContent is not None
    return result.structuredContent["by"]


async def test_two_users_of_one_client_id_never_share_a_result(
    serve: Serve, redis_url: str, prefix: str
) -> None:
    """One OAuth client (an agent app) used by many users: the token's subject scopes the key
    too, so the same key (or the same derived call) of another user runs for that user. Before,
    the scope was the client id alone: bob got alice's stored result and his call never ran."""
    url = serve()
    args = {"amount": 100, "idempotency_key": "k-users"}
    async with session(url, "app:alice") as alice, session(url, "app:bob") as bob:
        for_alice = await alice.call_tool("charge", args)
        for_bob = await bob.call_tool("charge", args)
        alice_again = await alice.call_tool("charge", args)
    assert not replayed(for_bob)
    assert by(for_bob) != by(for_alice)
    assert "app" not in (by(for_alice), by(for_bob))  # not the client id alone
    assert replayed(alice_again)
    assert alice_again.structuredContent == for_alice.structuredContent
    assert runs(redis_url, prefix) == 2


async def test_principal_narrows_the_scope_of_an_authenticated_client(
    serve: Serve, redis_url: str, prefix: str
) -> None:
    """``principal(ctx)`` (here the X-Tenant header) narrows the token's scope. Before, it was
    consulted only without a token: two tenants of one client shared a result."""
    url = serve()
    args = {"amount": 100, "idempotency_key": "k-tenants"}
    async with (
        session(url, "alice", **{"X-Tenant": "t-1"}) as first,
        session(url, "alice", **{"X-Tenant": "t-2"}) as second,
        session(url, "alice") as plain,
    ):
        one = await first.call_tool("charge", args)
        two = await second.call_tool("charge", args)
        one_again = await first.call_tool("charge", args)
        untenanted = await plain.call_tool("charge", args)
    assert not replayed(two)
    assert len({by(one), by(two), by(untenanted)}) == 3
    assert by(untenanted) == "alice"  # a token with no subject, no principal: its client id
    assert replayed(one_again)
    assert runs(redis_url, prefix) == 3


def reported(redis_url: str, prefix: str) -> str | None:
    value = redis.Redis.from_url(redis_url, decode_responses=True).get(f"{prefix}:reported")
    return None if value is None else str(value)


def log_says(log: Path, text: str) -> Callable[[], bool]:
    return lambda: text in log.read_text(errors="replace")


async def test_a_host_that_closed_its_session_mid_tool_gets_a_replay(
    serve: Serve, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """The host times out and closes its session (DELETE) while the tool runs; the tool then
    logs and reports progress to a session that is gone. Those sends are dropped: the tool
    ends, its result is stored, and the retry replays it. Before, the send raised
    ClosedResourceError out of the tool, the key was released and the retry charged again."""
    url = serve(wait=10)
    args = {"amount": 100, "idempotency_key": "k-gone"}
    reached: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reached.append(progress)

    gate(redis_url, prefix, closed=True)  # the tool charges, then waits
    async with session(url, "alice") as host:
        first = asyncio.ensure_future(
            host.call_tool(
                "charge_and_report",
                args,
                read_timeout_seconds=timedelta(seconds=0.5),
                progress_callback=on_progress,
            )
        )
        await until(lambda: runs(redis_url, prefix) == 1, "the charge")
        with pytest.raises(McpError, match="Timed out"):
            await first
    # The session is closed now (the client's DELETE returned): open the gate.
    gate(redis_url, prefix, closed=False)
    await until(lambda: reported(redis_url, prefix) is not None, "the tool's sends")
    sends = reported(redis_url, prefix)
    async with session(url, "alice") as host:
        again = await host.call_tool("charge_and_report", args)
    assert sends == "sent"
    assert not again.isError, again
    assert replayed(again)
    assert again.structuredContent == {"charge_id": "ch_1", "amount": 100}
    assert runs(redis_url, prefix) == 1
    assert reached == []  # nothing reached the host that left


async def test_a_stateless_request_dropped_mid_tool_gets_a_replay(
    serve: Serve, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """``stateless_http=True``: the host's HTTP request drops while the tool runs (its read
    timed out); the transport of that request is terminated, and the tool's later sends go
    nowhere. They are dropped: the retry replays. Before, the tool raised and charged twice."""
    url = serve("stateless_app", wait=10)
    args = {"amount": 100, "idempotency_key": "k-dropped"}
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "charge_and_report", "arguments": args, "_meta": {"progressToken": 1}},
    }
    headers = {
        "Authorization": "Bearer alice",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-06-18",
    }
    log = tmp_path / "stateless_app.log"
    gate(redis_url, prefix, closed=True)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=0.5)) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post(url, json=call, headers=headers)
    await until(lambda: runs(redis_url, prefix) == 1, "the charge")
    # The server's transport for that request is gone (it logs its end): open the gate.
    await until(log_says(log, "Terminating session"), "the request's transport to end")
    gate(redis_url, prefix, closed=False)
    await until(lambda: reported(redis_url, prefix) is not None, "the tool's sends")
    sends = reported(redis_url, prefix)
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.post(url, json={**call, "id": 2}, headers=headers)
    assert answer.status_code == 200, answer.text
    messages = [json.loads(line[5:]) for line in answer.text.splitlines() if line[:5] == "data:"]
    (result,) = [m["result"] for m in messages if m.get("id") == 2]
    assert sends == "sent"
    assert not result.get("isError"), result
    assert result["_meta"]["io.idemkey/replay"] == {"replayed": True}
    assert result["structuredContent"] == {"charge_id": "ch_1", "amount": 100}
    assert runs(redis_url, prefix) == 1
