"""What AsyncRedisStore sends, and how: a script call (the lean path, the cluster route, glide's
facade or ``execute_command``; NOSCRIPT, a dropped connection, a moving slot, durability), the
blocking read of a done stream its waiters share, and the server settings ``acheck`` reads.
AsyncRedisStore (``_async_store``) builds its calls on this class; every decision lives in
``_backend``, ``_durable`` and ``_server_check``.
"""

# unasync: generates _sync_sender.py
from __future__ import annotations

import contextlib
import time
from typing import Any

from .._core import RECORD_LOST, ExpiringDecision, InFlight, Record, decode_claim_reply
from ..errors import StoreError
from ..policy import Policy
from ._backend import SCRIPT_KEYS, _dropped_errors, _never_connected, _retry_delay, _slot_moving
from ._base import _block_cap, _block_ms, _done_stream, _next_delay, _read_limit
from ._concurrency._async_heartbeat import AsyncHeartbeat
from ._concurrency._async_lean import lean_for
from ._concurrency._async_redirect import route_for
from ._concurrency._async_runtime import LoopWatch, drop_other_loops, send_with_wait, sleep
from ._concurrency._async_wakeup import AsyncWakeups
from ._durable import _DONE, _DURABLE, _LOAD_SCRIPT, _SEND_AGAIN, _UNCONFIRMED, _durable_outcome
from ._server_check import _CONFIG_NAMES, _config_pairs, _info_settings

__all__ = ["AsyncSender"]


class AsyncSender(AsyncHeartbeat):
    """How AsyncRedisStore sends its scripts and reads (its base class, not used alone)."""

    def __init__(self, client: Any, policy: Policy | None = None) -> None:
        super().__init__(client, policy)
        client = self.client  # a valkey-glide client is wrapped by now (idemkey/store/_glide)
        self._wakeups = AsyncWakeups(self._read_done, _read_limit(client))
        self._block_cap = _block_cap(client)
        self._dropped = _dropped_errors(client)
        self._loops = LoopWatch()
        lean = lean_for(client)
        #: Where the cluster client's own ASK handling sends ASKING and the script on two
        #: pooled connections (the asyncio ones), the store's own route, which sends them on
        #: one (see the ``redirect`` module beside the lean one); else None.
        self._route = route_for(client, self._scripts, self._errors, self._slot_moving_wait)
        #: How a script call is sent: that route, the lean path on a plain redis-py client,
        #: glide's invoke_script on its facade, else the plain one (``_packing.lean_eligible``).
        #: All answer alike (tests/store/test_lean.py, tests/cluster/test_ask.py,
        #: tests/store/test_glide.py).
        self._evalsha = (
            self._route.evalsha
            if self._route is not None
            else lean.evalsha
            if lean is not None
            else getattr(client, "idemkey_evalsha", None) or self._plain_evalsha
        )
        if self.policy.durability is not None:
            # Only with durability on: the plain _eval (the hot path) stays exactly as it is.
            self._eval = self._eval_durable  # type: ignore[method-assign]

    async def _eval(self, name: str, *keys_and_args: str | bytes | int) -> Any:
        script = self._scripts[name]
        if self._loops.moved():  # another event loop: its connections are of no use here
            await drop_other_loops(self.client, self._loops)
        try:
            try:
                return await self._evalsha(script.sha, keys_and_args)
            except self._noscript:
                keys, args = keys_and_args[:SCRIPT_KEYS], keys_and_args[SCRIPT_KEYS:]
                return await script(keys, args)
        except self._errors as exc:
            if _slot_moving(exc, self._moving):
                return await self._eval_while_slot_moves(name, keys_and_args)
            if isinstance(exc, self._dropped) and not _never_connected(exc):
                return await self._eval_again(name, keys_and_args)
            raise self._store_error(name, exc) from exc

    async def _follow_loop(self) -> None:
        """Before a command sent by hand (not through ``_eval``): drop the connections of the
        event loop this store ran on last, when this is another (``LoopWatch``)."""
        if self._loops.moved():
            await drop_other_loops(self.client, self._loops)

    async def _plain_evalsha(self, sha: str, keys_and_args: tuple[str | bytes | int, ...]) -> Any:
        return await self.client.execute_command("EVALSHA", sha, SCRIPT_KEYS, *keys_and_args)

    def _slot_moving_wait(self) -> float:
        return self.slot_moving_wait  # read per call: a caller may change it on the store

    async def _send_again(self, name: str, keys_and_args: tuple[str | bytes | int, ...]) -> Any:
        """A script sent once more: through the store's own route where it has one (the
        client's ASK handling is what it avoids), else the registered script, which loads it
        on NOSCRIPT."""
        script = self._scripts[name]
        if self._route is not None:
            return await self._route.evalsha(script.sha, keys_and_args)
        return await script(keys_and_args[:SCRIPT_KEYS], keys_and_args[SCRIPT_KEYS:])

    async def _eval_again(self, name: str, keys_and_args: tuple[str | bytes | int, ...]) -> Any:
        """Send a script once more after its connection was dropped (a pooled connection the
        server closed when it restarted: redis-py's asyncio pool hands it out unchecked, and
        redis-py 5 retries no command, whatever ``retry=`` says). Safe: every script answers a
        re-send by its owner as it answered the first."""
        try:
            return await self._send_again(name, keys_and_args)
        except self._errors as exc:
            raise self._store_error(name, exc) from exc

    async def _eval_while_slot_moves(
        self, name: str, keys_and_args: tuple[str | bytes | int, ...]
    ) -> Any:
        deadline, delay = time.monotonic() + self.slot_moving_wait, 0.0
        while True:
            await sleep(delay := _retry_delay(delay, deadline))
            try:
                return await self._send_again(name, keys_and_args)
            except self._errors as exc:
                if not _slot_moving(exc, self._moving) or time.monotonic() >= deadline:
                    raise self._store_error(name, exc) from exc

    async def _eval_durable(self, name: str, *keys_and_args: str | bytes | int) -> Any:
        durability = self.policy.durability
        if self._loops.moved():  # inline, as in _eval: every claim and completion comes here
            await drop_other_loops(self.client, self._loops)
        if durability is None or name not in _DURABLE:
            return await AsyncSender._eval(self, name, *keys_and_args)
        script = self._scripts[name]
        deadline, delay = time.monotonic() + self.slot_moving_wait, 0.0
        while True:
            try:
                replies = await send_with_wait(self.client, keys_and_args, script.sha, durability)
                may_retry = time.monotonic() < deadline
                outcome, value = _durable_outcome(
                    name, replies, self._noscript, durability, may_retry
                )
                if outcome == _LOAD_SCRIPT:
                    await self.client.script_load(script.script)
            except self._errors as exc:
                await self._refresh_topology()
                if name == "claim":  # it may have been applied before the reply was lost
                    await self._release_quietly(keys_and_args)
                raise self._store_error(name, exc) from exc
            except StoreError:  # a failure in the replies (a dead node's pooled connection)
                await self._refresh_topology()
                raise
            if outcome == _DONE:
                return value
            if outcome == _SEND_AGAIN:
                await self._refresh_topology()
                if not may_retry:
                    raise value
                await sleep(delay := _retry_delay(delay, deadline))
            elif outcome == _UNCONFIRMED:
                if name == "claim":  # free the key so a retry can run, if Redis lets us
                    await self._release_quietly(keys_and_args)
                raise value

    async def _release_quietly(self, claim_args: tuple[str | bytes | int, ...]) -> None:
        """Release a durable claim that failed (its owner's alone: release.lua checks it), if
        Redis lets us: the caller is told StoreError, so nothing runs under it."""
        with contextlib.suppress(StoreError):
            key, _, owner, *_ = claim_args
            await AsyncSender._eval(self, "release", key, owner)

    async def _refresh_topology(self) -> None:
        """After a redirect or a dead node, let a cluster client learn who serves what now."""
        nodes = getattr(self.client, "nodes_manager", None)
        if nodes is not None:
            with contextlib.suppress(*self._errors):
                await nodes.initialize()

    async def _wait_for_end(
        self,
        record: Record,
        owner: str,
        args: tuple[str | bytes | int, ...],
        decision: InFlight,
        wait: float,
    ) -> ExpiringDecision:
        """Claim again (``args``: the claim's, sent by ``owner``) each time the claim in flight
        ends, for up to ``wait`` seconds.

        The end (complete or release) posts to the record's done stream, which a blocking
        XREAD shared by this store's waiters is watching; a lease that lapses with no end is
        noticed when the read times out with it, and taken over. Where no read can be made
        (too many records waited on, a read that failed), poll with backoff.
        """
        stream = _done_stream(record)
        deadline, delay = time.monotonic() + wait, 0.0
        answer: ExpiringDecision = decision
        while type(answer) is InFlight:
            block_ms = _block_ms(answer.lease_remaining, deadline, self._block_cap)
            if block_ms == 0:
                break
            woken = await self._wakeups.wait(stream, block_ms)
            if woken is None:  # no read could be made
                if (delay := _next_delay(delay, deadline)) <= 0:
                    break
                await sleep(delay)
            answer = decode_claim_reply(await self._eval("claim", *args), owner)
            if woken and type(answer) is InFlight:
                # Woken, yet in flight: another waiter claimed the record after a release
                # (its claim dropped the stream), or an entry the claim could not drop. Back
                # off as a poll would, so that an entry that stays cannot make a loop.
                if (delay := _next_delay(delay, deadline)) <= 0:
                    break
                await sleep(delay)
        return answer

    async def _read_done(self, stream: str, block_ms: int) -> bool | None:
        """XREAD BLOCK on a done stream from its start: True when it has an entry, False when
        the block ended without one, None when the read failed."""
        command = ("XREAD", "BLOCK", block_ms, "STREAMS", stream, "0-0")
        await self._follow_loop()
        try:
            if hasattr(self.client, "get_node_from_key"):  # a cluster: no COMMAND GETKEYS
                node = self.client.get_node_from_key(stream)
                entries = await self.client.execute_command(*command, target_nodes=node)
            else:
                entries = await self.client.execute_command(*command)
        except self._errors:
            return None
        return bool(entries)

    async def _settings(self, target: dict[str, Any]) -> dict[str, str]:
        ask = self.client.execute_command
        try:
            settings: dict[str, str] = {}
            for name in _CONFIG_NAMES:
                settings.update(_config_pairs(await ask("CONFIG", "GET", name, **target)))
            return settings
        except self._errors:
            pass
        try:
            memory = await ask("INFO", "memory", **target)
            return _info_settings(memory, await ask("INFO", "persistence", **target))
        except self._errors:
            return {}

    async def _renew(self, record: Record, owner: str, lease_ms: int, fence: int | None) -> int:
        """renew.lua's reply: 1 renewed, 0 another owner's, RECORD_LOST (only with the claim's
        ``fence``) the record was lost under the claim."""
        args: tuple[str | int, ...] = (record.record_key, owner, lease_ms)
        reply = await self._eval("renew", *(args if fence is None else (*args, fence)))
        return 1 if reply == 1 else RECORD_LOST if reply == RECORD_LOST else 0
