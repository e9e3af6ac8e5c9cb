"""The lean script call on redis.asyncio's own connections; hand-written, twin of ``_sync_lean``.

``execute_command("EVALSHA", ...)`` spends most of its time in client-side Python: shuffling the
arguments into the packer, the observability hooks, the per-call closures. Here the command is
packed in one call to hiredis (or, without it or with a client encoding that is not UTF-8, in
Python with its static head, ``EVALSHA <sha> 2`` and the array length, packed once per script
and argument count; see ``_base.evalsha_packer``), and sent on a
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

from .._base import evalsha_packer, lean_eligible

__all__ = ["Lean", "lean_for"]


class Lean:
    """EVALSHA on the client's pooled connections, the command's head packed once."""

    def __init__(self, client: Any) -> None:
        pool = client.connection_pool
        self._pool = pool
        self._pack = evalsha_packer(pool.get_encoder(), packs_with_hiredis=False)

    async def evalsha(self, sha: str, keys_and_args: tuple[str | bytes | int, ...]) -> Any:
        command = self._pack(sha, keys_and_args)
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
