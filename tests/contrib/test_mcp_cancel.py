"""A host that cancels a tool call (``notifications/cancelled``) after the tool's side effect,
then retries with the same key: the tool ran once, and the retry gets its result (a replay).

Through the Python SDK's own ``ClientSession`` over streamable HTTP (real uvicorn) and stdio,
and through the TypeScript SDK's client, whose ``callTool(..., {timeout})`` sends the cancel
itself; against a real redis-server (docs/mcp.md, "A cancelled call").
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("mcp")
from mcp import McpError
from mcp.types import CancelledNotification, CancelledNotificationParams, ClientNotification

from tests.contrib.test_mcp import (
    Connect,
    connect,
    environment,
    gate,
    replayed,
    runs,
    serve_http,
)

pytestmark = pytest.mark.redis
HERE = Path(__file__).resolve().parent
__all__ = ["connect"]  # the fixture, shared with test_mcp.py


async def until(predicate: Callable[[], bool], timeout: float = 20, what: str = "it") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_a_call_cancelled_after_its_side_effect_is_replayed_on_retry(
    connect: Callable[[float], Connect], redis_url: str, prefix: str
) -> None:
    args = {"amount": 100, "idempotency_key": "cancel-1"}
    async with connect(10)() as session:
        gate(redis_url, prefix, closed=True)  # the tool charges, then waits
        request_id = session._request_id  # the id call_tool sends next
        first = asyncio.ensure_future(session.call_tool("charge", args))
        await until(lambda: runs(redis_url, prefix) == 1, what="the charge")
        cancel = CancelledNotificationParams(requestId=request_id, reason="host timeout")
        await session.send_notification(ClientNotification(CancelledNotification(params=cancel)))
        with pytest.raises(McpError, match="cancelled"):
            await asyncio.wait_for(first, 20)  # the SDK's answer to the cancelled request
        retry = asyncio.ensure_future(session.call_tool("charge", args))
        gate(redis_url, prefix, closed=False)  # the cancelled call's tool finishes
        again = await asyncio.wait_for(retry, 20)
    assert not again.isError, again
    assert replayed(again)
    assert again.structuredContent == {"charge_id": "ch_1", "amount": 100, "by": "alice"}
    assert runs(redis_url, prefix) == 1


@pytest.fixture(scope="session")
def typescript_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with tests/contrib/mcp_ts installed by ``npm ci`` (the pinned SDK)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed to run the TypeScript SDK's client")
    where = tmp_path_factory.mktemp("mcp_ts")
    for name in ("package.json", "package-lock.json", "client.mjs"):
        shutil.copy(HERE / "mcp_ts" / name, where / name)
    done = subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        pytest.skip(f"npm could not install the TypeScript SDK: {done.stderr[-500:]}")
    return where


def test_the_typescript_sdks_timeout_cancel_then_retry_charges_once(
    typescript_client: Path, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    server = serve_http(environment(redis_url, prefix, 10), tmp_path / "uvicorn.log")
    try:
        done = subprocess.run(
            ["node", "client.mjs", f"http://127.0.0.1:{server.port}/mcp", "ts-cancel-1"],
            cwd=typescript_client,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.close()
    assert done.returncode == 0, done.stdout + done.stderr
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    assert "timed out" in answers["first"]["error"].lower()  # the SDK's timeout, then its cancel
    retry = answers["retry"]
    assert not retry.get("isError"), retry
    assert retry["structuredContent"] == {"charge_id": "ch_1", "amount": 100}
    assert retry["_meta"]["io.idemkey/replay"] == {"replayed": True}
    assert runs(redis_url, prefix) == 1
