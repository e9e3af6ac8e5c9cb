"""The lean script call on redis.asyncio's own connections; hand-written, twin of ``_sync_lean``.

``execute_command("EVALSHA", ...)`` spends most of its time in client-side Python: packing the
whole command anew, the observability hooks, the per-call closures. Here the static head of the
command (``EVALSHA <sha> 2``, and the array length) is packed once per script and argument
count, the arguments are encoded with the client's own encoder, and the command is sent on a
connection taken from the client's pool with ``send_packed_command`` and read with its parser
(``read_response``). What the plain path does around that is kept: the connection's retry
policy (``conn.retry``, with the same disconnect between attempts), its health check (inside
``send_packed_command``), its timeouts (the connection's own), the pool's checks when it hands
a connection out, and the release. Errors come out as the plain path raises them (NOSCRIPT is
a ``NoScriptError``), for the store's own mapping. ``lean_eligible`` (``_base``) says where it
applies; elsewhere the plain path runs.
"""

from __future__ import annotations

from typing import Any

from .._base import lean_eligible, pack_evalsha

__all__ = ["Lean", "lean_for"]


class Lean:
    """EVALSHA on the client's pooled connections, the command's head packed once."""

    def __init__(self, client: Any) -> None:
        pool = client.connection_pool
        self._pool = pool
        self._encode = pool.get_encoder().encode
        self._heads: dict[tuple[str, int], bytes] = {}

    async def evalsha(self, sha: str, keys_and_args: tuple[str | bytes | int, ...]) -> Any:
        command = pack_evalsha(self._heads, self._encode, sha, keys_and_args)
        pool = self._pool
        conn = await pool.get_connection()

        async def send() -> Any:
            await conn.send_packed_command(command)
            return await conn.read_response()

        async def failed(error: BaseException, failure_count: int) -> None:
            # As the plain path's _close_connection: reconnect before the next attempt.
            await conn.disconnect(error=error, failure_count=failure_count)

        try:
            return await conn.retry.call_with_retry(send, failed, with_failure_count=True)
        finally:
            await pool.release(conn)


def lean_for(client: Any) -> Lean | None:
    """The lean path for ``client``, or None where the plain path must run."""
    return Lean(client) if lean_eligible(client, asyncio=True) else None
