"""The MCP server the tests of idemkey.contrib.mcp drive: one idempotent tool, ``charge``.

Served over streamable HTTP by uvicorn (``uvicorn tests.contrib._mcp_server:app``; bearer
tokens ``alice`` and ``bob`` authenticate those client ids) or over stdio
(``python -m tests.contrib._mcp_server``; the principal is ``$MCP_PRINCIPAL``). Redis is
``$REDIS_URL``, keys under ``$PREFIX``. Every run of the tool adds one to ``{PREFIX}:runs``;
while ``{PREFIX}:gate`` exists the tool waits (10 s at most) for an item on
``{PREFIX}:open`` before it returns. ``charge_slowly`` counts its runs there too, then takes 3 s.
"""

from __future__ import annotations

import asyncio
import os

import redis.asyncio
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.fastmcp import Context, FastMCP

from idemkey import AsyncRedisStore, Policy
from idemkey.contrib.mcp import IdempotentTools

PREFIX = os.environ["PREFIX"]
client = redis.asyncio.Redis.from_url(os.environ["REDIS_URL"])
store = AsyncRedisStore(client, Policy(prefix=PREFIX))
tools = IdempotentTools(
    store,
    wait=float(os.environ.get("MCP_WAIT", "0")),
    principal=lambda ctx: os.environ.get("MCP_PRINCIPAL"),
)


class Tokens:
    """Bearer token ``alice`` is client ``alice``, ``bob`` is ``bob``; nothing else passes."""

    async def verify_token(self, token: str) -> AccessToken | None:
        if token in ("alice", "bob"):
            return AccessToken(token=token, client_id=token, scopes=[])
        return None


def build(http: bool) -> FastMCP:
    auth = dict(
        auth=AuthSettings(
            issuer_url="http://127.0.0.1/", resource_server_url="http://127.0.0.1/mcp"
        ),
        token_verifier=Tokens(),
    )
    server = FastMCP("charges", **(auth if http else {}))  # type: ignore[arg-type]

    @tools.tool(server)
    async def charge(amount: int, ctx: Context) -> dict[str, object]:
        """Charge the card on file."""
        runs = await client.incr(f"{PREFIX}:runs")
        if await client.exists(f"{PREFIX}:gate"):
            await client.blpop([f"{PREFIX}:open"], timeout=10)
        return {"charge_id": f"ch_{runs}", "amount": amount, "by": tools.scope(ctx)}

    @tools.tool(server)
    async def charge_slowly(amount: int) -> dict[str, object]:
        """Charge the card on file, slowly (3 s after the charge)."""
        runs = await client.incr(f"{PREFIX}:runs")
        await asyncio.sleep(3)
        return {"charge_id": f"ch_{runs}", "amount": amount}

    return server


app = build(http=True).streamable_http_app()

if __name__ == "__main__":
    build(http=False).run("stdio")
