"""The lean script call on redis.asyncio's own connections; hand-written, twin of ``_sync_lean``.

``execute_command("EVALSHA", ...)`` spends most of its time in client-side Python: shuffling the
arguments into the packer, the observability hooks, the per-call closures. Here the command is
packed in one call to hiredis (or, without it or with a client encoding that is not UTF-8, in
Python with its static head, ``EVALSHA <sha> 2`` and the array length, packed once per script
and argument count; see ``_packing.evalsha_packer``), and sent on a
connection taken from the client's pool with ``send_packed_command`` and read with its parser
(``read_response``). What the plain path does around that is kept: the connection's retry
policy (``conn.retry``, with the same disconnect between attempts), its health check (inside
``send_packed_command``), its timeouts (the connection's own), the pool's checks when it hands
a connection out, and the release. Errors come out as the plain path raises them (NOSCRIPT is
a ``NoScriptError``), for the store's own mapping. ``lean_eligible`` (``_base``) says where it
applies; elsewhere the plain path runs.

:class:`Batched` (the default, see ``lean_for``) shares that work between the tasks of one
event loop: a call made while none of this store's calls is in flight is sent at once, as
:class:`Lean` sends it; calls made while one is in flight wait for the end of the loop
iteration and go out together, one write on one pooled connection, their replies read back in
order. With many requests in one process the pool checkout, the retry wrapper, the write and
the socket wakeups are then paid once per batch instead of once per call.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .._packing import Packer, evalsha_packer, lean_eligible

__all__ = ["Batched", "Lean", "lean_for"]

_Waiter = tuple[list[bytes], "asyncio.Future[Any]"]


class Lean:
    """EVALSHA on the client's pooled connections, the command's head packed once."""

    def __init__(self, client: Any, pack: Packer) -> None:
        self._pool = client.connection_pool
        self._pack = pack

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


class _LoopState:
    """What :class:`Batched` keeps for one event loop."""

    __slots__ = ("in_flight", "loop", "pending", "tasks")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.loop = loop
        self.in_flight = 0  # calls sent alone and batches, not yet answered
        self.pending: list[_Waiter] | None = None  # the next batch, its task scheduled
        self.tasks: set[asyncio.Task[None]] = set()  # the loop only keeps weak references


class Batched(Lean):
    """:class:`Lean`, with the calls that meet in one loop iteration sent as one batch.

    Each batch runs in a task of its own, not in a caller's: a caller cancelled while it waits
    only stops waiting (a call not yet sent is then left out), and the others still get their
    replies. Replies are read in the order the commands were written; an error reply (NOSCRIPT)
    is that call's exception and the next reply is read as usual. A connection error or a
    timeout goes through the connection's ``retry`` exactly as one call's does (a disconnect
    between attempts): the calls whose replies were read keep them, the others are sent again
    on the next attempt, and when the retries are spent each gets the error, for ``_eval``'s
    mapping as if it had been sent alone.

    The state is per event loop: a loop that died with calls in flight or a batch never sent
    (a worker's ``asyncio.run`` per job) leaves it behind, and whatever of it finishes later
    (a coroutine closed when collected) counts on the dead loop's state, not on the new one's.
    """

    def __init__(self, client: Any, pack: Packer) -> None:
        super().__init__(client, pack)
        self._state = _LoopState(None)

    async def evalsha(self, sha: str, keys_and_args: tuple[str | bytes | int, ...]) -> Any:
        loop = asyncio.get_running_loop()
        state = self._state
        if state.loop is not loop:
            state = self._state = _LoopState(loop)
        if not state.in_flight:
            state.in_flight += 1
            try:
                return await Lean.evalsha(self, sha, keys_and_args)
            finally:
                state.in_flight -= 1
        waiter: asyncio.Future[Any] = loop.create_future()
        if state.pending is None:
            state.pending = []
            # The task's first step runs after the callbacks already due in this iteration:
            # the calls they make join this batch.
            task = loop.create_task(self._send_batch(state))
            state.tasks.add(task)
            task.add_done_callback(state.tasks.discard)
        state.pending.append((self._pack(sha, keys_and_args), waiter))
        return await waiter

    async def _send_batch(self, state: _LoopState) -> None:
        batch = [entry for entry in state.pending or () if not entry[1].done()]
        state.pending = None
        if not batch:
            return
        state.in_flight += 1
        try:
            await self._send(batch)
        except BaseException as exc:  # the retries spent, or this task cancelled (loop ends)
            for _, waiter in batch:
                if not waiter.done():
                    waiter.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            state.in_flight -= 1

    async def _send(self, batch: list[_Waiter]) -> None:
        from redis.exceptions import ResponseError

        pool = self._pool
        conn = await pool.get_connection()
        unanswered = batch

        async def send() -> None:
            nonlocal unanswered
            await conn.send_packed_command(
                [chunk for command, _ in unanswered for chunk in command]
            )
            for index, (_, waiter) in enumerate(unanswered):
                try:
                    reply = await conn.read_response()
                except ResponseError as error:  # an error reply: the connection is fine
                    if not waiter.done():
                        waiter.set_exception(error)
                except BaseException:
                    unanswered = unanswered[index:]  # the next attempt sends these again
                    raise
                else:
                    if not waiter.done():
                        waiter.set_result(reply)
            unanswered = []

        async def failed(error: BaseException, failure_count: int) -> None:
            await conn.disconnect(error=error, failure_count=failure_count)

        try:
            await conn.retry.call_with_retry(send, failed, with_failure_count=True)
        finally:
            await pool.release(conn)


def lean_for(client: Any) -> Lean | None:
    """The lean path for ``client`` (batched), or None where the plain path must run."""
    if not lean_eligible(client, asyncio=True):
        return None
    pack = evalsha_packer(client.connection_pool)
    return None if pack is None else Batched(client, pack)
