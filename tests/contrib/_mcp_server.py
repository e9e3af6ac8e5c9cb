"""The MCP server the tests of idemkey.contrib.mcp drive: one idempotent tool, ``charge``.

Served over streamable HTTP by uvicorn (``uvicorn tests.contrib._mcp_server:app``, or
``:stateless_app`` with ``stateless_http=True``; bearer tokens ``alice`` and ``bob``
authenticate those client ids, and ``app:alice``, ``app:bob`` the users ``alice`` and ``bob``
of one client ``app``; an ``X-Tenant`` header is ``principal(ctx)``) or over stdio
(``python -m tests.contrib._mcp_server``; the principal is ``$MCP_PRINCIPAL``). Redis is
``$REDIS_URL``, keys under ``$PREFIX``. Every run of the tool adds one to ``{PREFIX}:runs``;
while ``{PREFIX}:gate`` exists the tool waits (10 s at most) for an item on
``{PREFIX}:open`` before it returns. ``charge_slowly`` counts its runs there too, then takes 3 s.
``charge_and_report`` charges, waits at the gate, then logs and reports progress to its host,
and sets ``{PREFIX}:reported`` to what those sends did (``sent``, or the exception).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import redis.asyncio
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.fastmcp import Context, FastMCP

from idemkey import AsyncRedisStore, Policy
from idemkey.contrib.mcp import IdempotentTools

PREFIX = os.environ["PREFIX"]
client = redis.asyncio.Redis.from_url(os.environ["REDIS_URL"])
store = AsyncRedisStore(client, Policy(prefix=PREFIX))
ISSUER = "https://issuer.example"


def principal(ctx: Context) -> str | None:
    """The ``X-Tenant`` header of the HTTP request, else ``$MCP_PRINCIPAL``."""
    request = ctx.request_context.request
    tenant = request.headers.get("x-tenant") if request is not None else None
    return tenant or os.environ.get("MCP_PRINCIPAL")


tools = IdempotentTools(store, wait=float(os.environ.get("MCP_WAIT", "0")), principal=principal)


class Tokens:
    """Bearer token ``alice`` is client ``alice``, ``bob`` is ``bob``; ``app:alice`` and
    ``app:bob`` are the users (subjects) ``alice`` and ``bob`` of the one client ``app``."""

    async def verify_token(self, token: str) -> AccessToken | None:
        if token in ("alice", "bob"):
            return AccessToken(token=token, client_id=token, scopes=[])
        if token in ("app:alice", "app:bob"):
            client_id, user = token.split(":")
            claims = {"iss": ISSUER}
            return AccessToken(
                token=token, client_id=client_id, scopes=[], subject=user, claims=claims
            )
        return None


def build(http: bool, stateless: bool = False) -> FastMCP:
    auth = dict(
        auth=AuthSettings(
            issuer_url="http://127.0.0.1/", resource_server_url="http://127.0.0.1/mcp"
        ),
        token_verifier=Tokens(),
    )
    options: dict[str, Any] = auth if http else {}
    server = FastMCP("charges", stateless_http=stateless, **options)

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

    @tools.tool(server)
    async def charge_and_report(amount: int, ctx: Context) -> dict[str, object]:
        """Charge the card on file, then tell the host."""
        runs = await client.incr(f"{PREFIX}:runs")
        if await client.exists(f"{PREFIX}:gate"):
            await client.blpop([f"{PREFIX}:open"], timeout=10)
        outcome = "sent"
        try:
            await ctx.report_progress(1, 1, "charged")
            await ctx.info("charged")
        except BaseException as exc:
            outcome = repr(exc)
            raise
        finally:
            await client.set(f"{PREFIX}:reported", outcome)
        return {"charge_id": f"ch_{runs}", "amount": amount}

    return server


app = build(http=True).streamable_http_app()
stateless_app = build(http=True, stateless=True).streamable_http_app()

if __name__ == "__main__":
    build(http=False).run("stdio")
