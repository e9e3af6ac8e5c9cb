"""idemkey.contrib.mcp through the SDK's own client: streamable HTTP served by a real uvicorn
process, and stdio with the server as a subprocess (tests/contrib/_mcp_server.py)."""

from __future__ import annotations

import asyncio
import importlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")
import httpx
import redis
import redis.asyncio
from mcp import ClientSession, McpError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.fastmcp import Context, FastMCP
from mcp.shared.memory import create_connected_server_and_client_session
from mcp.types import CallToolResult, TextContent

from idemkey import AsyncRedisStore, Policy
from idemkey.contrib.mcp import IdempotentTools
from tests._pages import write_page
from tests._servers import AppServer, RedisServer

pytestmark = pytest.mark.redis
ROOT = Path(__file__).resolve().parents[2]
Connect = Callable[..., AbstractAsyncContextManager[ClientSession]]


def environment(redis_url: str, prefix: str, wait: float) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "REDIS_URL": redis_url,
        "PREFIX": prefix,
        "MCP_WAIT": str(wait),
    }


def serve_http(env: dict[str, str], log: Path, app: str = "app") -> AppServer:
    """tests/contrib/_mcp_server.py's ``app`` on a real uvicorn process, on a free port; ready
    once it answers anything (the app has no health route)."""

    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "uvicorn", f"tests.contrib._mcp_server:{app}",
                "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip

    return AppServer(command, log=log, cwd=ROOT, env=env, name="uvicorn", health=None, timeout=20)


@pytest.fixture(params=["http", "stdio"])
def connect(
    request: pytest.FixtureRequest, redis_url: str, prefix: str, tmp_path: Path
) -> Iterator[Callable[[float], Connect]]:
    """``connect(wait)(principal)``: a ClientSession to the server, as ``principal``."""
    servers: list[AppServer] = []
    refused: list[str] = []

    async def note_refusal(response: httpx.Response) -> None:
        # The SDK raises HTTPStatusError without the server's reason; keep it, and what was sent
        if response.status_code >= 400:
            await response.aread()
            sent = response.request
            refused.append(
                f"{sent.method} {sent.url} {dict(sent.headers)} {sent.content[:2000]!r}"
                f" -> {response.status_code} {response.text[:2000]}"
            )

    def start(wait: float) -> Connect:
        env = environment(redis_url, prefix, wait)
        if request.param == "stdio":

            @asynccontextmanager
            async def over_stdio(principal: str = "alice") -> AsyncIterator[ClientSession]:
                params = StdioServerParameters(
                    command=sys.executable,
                    args=["-m", "tests.contrib._mcp_server"],
                    env={**env, "MCP_PRINCIPAL": principal},
                    cwd=ROOT,
                )
                async with (
                    stdio_client(params) as (read, write),
                    ClientSession(read, write) as session,
                ):
                    await session.initialize()
                    yield session

            return over_stdio
        server = serve_http(env, tmp_path / "uvicorn.log")
        servers.append(server)

        @asynccontextmanager
        async def over_http(principal: str = "alice") -> AsyncIterator[ClientSession]:
            headers = {"Authorization": f"Bearer {principal}"}
            hooks = {"response": [note_refusal]}
            async with httpx.AsyncClient(headers=headers, timeout=30, event_hooks=hooks) as http:
                url = f"{server.url}/mcp"
                async with (
                    streamable_http_client(url, http_client=http) as (
                        read,
                        write,
                        _,
                    ),
                    ClientSession(read, write) as session,
                ):
                    await session.initialize()
                    yield session

        return over_http

    try:
        yield start
    finally:
        for server in servers:
            server.close()
        if servers:  # pytest shows it only for a failed test: which request the server refused
            print((tmp_path / "uvicorn.log").read_text(errors="replace")[-20000:])
            print("refused:", *refused, sep="\n")


def runs(redis_url: str, prefix: str) -> int:
    return int(redis.Redis.from_url(redis_url).get(f"{prefix}:runs") or 0)


def gate(redis_url: str, prefix: str, closed: bool) -> None:
    client = redis.Redis.from_url(redis_url)
    if closed:
        client.set(f"{prefix}:gate", 1)
    else:
        client.delete(f"{prefix}:gate")
        client.rpush(f"{prefix}:open", 1)


def replayed(result: CallToolResult) -> bool:
    return bool((result.meta or {})["io.idemkey/replay"]["replayed"])


def text(result: CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, TextContent))


async def test_a_retry_after_a_dropped_response_replays_the_first_result(
    connect: Callable[[float], Connect], redis_url: str, prefix: str
) -> None:
    async with connect(10)() as session:
        gate(redis_url, prefix, closed=True)  # the tool runs past the client's timeout
        args = {"amount": 100, "idempotency_key": "k-1"}
        with pytest.raises(McpError, match="Timed out"):
            await session.call_tool("charge", args, read_timeout_seconds=timedelta(seconds=0.5))
        assert runs(redis_url, prefix) == 1
        gate(redis_url, prefix, closed=False)
        again = await session.call_tool("charge", args)  # waits for the first, then replays
    assert not again.isError
    assert again.structuredContent == {"charge_id": "ch_1", "amount": 100, "by": "alice"}
    assert replayed(again)
    assert "Replay" in text(again)
    assert runs(redis_url, prefix) == 1


async def test_changed_arguments_under_one_key_are_refused(
    connect: Callable[[float], Connect], redis_url: str, prefix: str
) -> None:
    async with connect(0)() as session:
        first = await session.call_tool("charge", {"amount": 100, "idempotency_key": "k-2"})
        other = await session.call_tool("charge", {"amount": 900, "idempotency_key": "k-2"})
    assert not first.isError
    assert not replayed(first)
    assert other.isError
    assert "idempotency_key_reused" in text(other)
    assert "use a new idempotency key" in text(other)
    assert runs(redis_url, prefix) == 1


async def test_ten_concurrent_duplicates_run_once(
    connect: Callable[[float], Connect], redis_url: str, prefix: str
) -> None:
    args = {"amount": 100, "idempotency_key": "k-3"}
    async with connect(0)() as session:
        gate(redis_url, prefix, closed=True)
        calls = [asyncio.ensure_future(session.call_tool("charge", args)) for _ in range(10)]
        # the first holds the key; the nine duplicates are refused while it runs
        for refused, finished in enumerate(asyncio.as_completed(calls, timeout=20), 1):
            await finished
            if refused == 9:
                break
        assert runs(redis_url, prefix) == 1
        gate(redis_url, prefix, closed=False)
        results = await asyncio.gather(*calls)
        later = await session.call_tool("charge", args)
    busy = [r for r in results if r.isError]
    assert len(busy) == 9
    assert all("idempotency_key_in_flight" in text(r) for r in busy)
    assert all("retry with the same idempotency key" in text(r) for r in busy)
    assert replayed(later)
    assert later.structuredContent == {"charge_id": "ch_1", "amount": 100, "by": "alice"}
    assert runs(redis_url, prefix) == 1


async def test_ten_concurrent_duplicates_with_the_default_wait_all_get_the_one_result(
    connect: Callable[[float], Connect], redis_url: str, prefix: str
) -> None:
    # IdempotentTools' default wait (5 s): duplicates that arrive while the first runs wait for
    # it and get its result, marked as a replay; none is refused, and the tool runs once.
    args = {"amount": 100, "idempotency_key": "k-5"}
    async with connect(5)() as session:
        gate(redis_url, prefix, closed=True)
        calls = [asyncio.ensure_future(session.call_tool("charge", args)) for _ in range(10)]
        deadline = time.monotonic() + 20
        while runs(redis_url, prefix) < 1:  # the first call is inside the tool, held
            assert time.monotonic() < deadline, "the tool never started"
            await asyncio.sleep(0.02)
        gate(redis_url, prefix, closed=False)
        results = await asyncio.wait_for(asyncio.gather(*calls), 20)
    assert not [r for r in results if r.isError]
    assert {str(r.structuredContent) for r in results} == {
        str({"charge_id": "ch_1", "amount": 100, "by": "alice"})
    }
    assert sum(replayed(r) for r in results) == 9
    assert runs(redis_url, prefix) == 1


async def test_two_principals_with_one_key_never_share_a_result(
    connect: Callable[[float], Connect], redis_url: str, prefix: str
) -> None:
    args = {"amount": 100, "idempotency_key": "k-4"}
    start = connect(0)
    async with start("alice") as alice, start("bob") as bob:
        for_alice = await alice.call_tool("charge", args)
        for_bob = await bob.call_tool("charge", args)
        alice_again = await alice.call_tool("charge", args)
    assert for_alice.structuredContent is not None
    assert for_bob.structuredContent is not None
    assert for_alice.structuredContent["by"] == "alice"
    assert for_bob.structuredContent["by"] == "bob"
    assert not replayed(for_bob)
    assert alice_again.structuredContent == for_alice.structuredContent
    assert runs(redis_url, prefix) == 2


def test_without_the_sdk_the_import_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "mcp" or n.startswith("mcp.")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    monkeypatch.delitem(sys.modules, "idemkey.contrib.mcp", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'idemkey-redis\[mcp\]'"):
        importlib.import_module("idemkey.contrib.mcp")


def test_mcp_page(private_redis_server: RedisServer, tmp_path: Path) -> None:
    # Each program as printed, run twice against one Redis: it prints the same both times.
    files = write_page("docs/mcp.md", tmp_path, redis_url=private_redis_server.url)
    names = [f.name for f in files]
    assert names == ["server.py", "client.py", "host_keys.py", "derived_keys.py"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    page = (ROOT / "docs/mcp.md").read_text("utf-8")
    printed = [p.split("```")[0] for p in page.split("It prints:\n\n```text\n")[1:]]
    for program, expected in zip(
        ["client.py", "host_keys.py", "derived_keys.py"], printed, strict=True
    ):
        for _ in range(2):
            done = subprocess.run(
                [sys.executable, program],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, program + done.stdout + done.stderr
            assert done.stdout == expected, program


async def test_the_key_in_meta_and_what_the_agent_is_told(redis_url: str, prefix: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    tools = IdempotentTools(AsyncRedisStore(client, Policy(prefix=prefix)), argument=None, ttl=7200)
    server = FastMCP("meta")
    sent: list[str] = []

    @tools.tool(server)
    def send_mail(to: str, ctx: Context[Any, Any, Any] | None = None) -> str:
        """Send a mail."""
        sent.append(to)
        return f"sent to {to}"

    async with create_connected_server_and_client_session(server) as session:
        (tool,) = (await session.list_tools()).tools
        missing = await session.call_tool("send_mail", {"to": "a@example.com"})
        meta = {"idempotencyKey": "m-1"}
        first = await session.call_tool("send_mail", {"to": "a@example.com"}, meta=meta)
        again = await session.call_tool("send_mail", {"to": "a@example.com"}, meta=meta)
    await client.aclose()
    assert tool.annotations is not None
    # the same arguments under another host key run again (issue 36: the hint follows the mode)
    assert tool.annotations.idempotentHint is False
    assert set(tool.inputSchema["properties"]) == {"to"}  # no key argument, no context
    assert "`_meta.idempotencyKey`" in (tool.description or "")
    assert "within 2 hours" in (tool.description or "")
    assert missing.isError
    assert "idempotency_key_invalid" in text(missing)
    assert text(first) == "sent to a@example.com"
    assert replayed(again)
    assert text(again).startswith("sent to a@example.com [idemkey] Replay")
    assert sent == ["a@example.com"]
