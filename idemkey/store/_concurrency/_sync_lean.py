"""The lean script call on redis-py's own connections; hand-written, twin of ``_async_lean``.

See ``_async_lean`` for what is kept from ``execute_command``. What a sync client does besides:
a connection marked for reconnect (a maintenance notification) is reconnected before it goes
back to the pool, as ``Redis._execute_command`` does. What it does not: batch the calls of
several threads (``_async_lean.Batched``): handing each reply to its thread would cost about
what a batch saves (docs/design.md, "Batched script calls").
"""

from __future__ import annotations

from typing import Any

from .._packing import Packer, evalsha_packer, lean_eligible

__all__ = ["Lean", "lean_for"]


class Lean:
    """EVALSHA on the client's pooled connections, the command's head packed once."""

    def __init__(self, client: Any, pack: Packer) -> None:
        self._pool = client.connection_pool
        self._pack = pack

    def evalsha(self, sha: str, keys_and_args: tuple[str | bytes | int, ...]) -> Any:
        command = self._pack(sha, keys_and_args)
        pool = self._pool
        conn = pool.get_connection()

        def send() -> Any:
            conn.send_packed_command(command)
            return conn.read_response()

        def failed(error: BaseException, failure_count: int) -> None:
            conn.disconnect()  # as the plain path's _close_connection

        try:
            return conn.retry.call_with_retry(send, failed, with_failure_count=True)
        finally:
            try:
                if conn.should_reconnect():
                    conn.disconnect()
                    conn.connect()
            finally:
                pool.release(conn)


def lean_for(client: Any) -> Lean | None:
    """The lean path for ``client``, or None where the plain path must run."""
    if not lean_eligible(client, asyncio=False):
        return None
    pack = evalsha_packer(client.connection_pool)
    return None if pack is None else Lean(client, pack)
