"""AsyncRedisStore: idempotency records in Redis.

One text for both stores: the async file is the source, and scripts/unasync.py writes the sync
one from it (see ``idemkey/store/__init__.py``). What a thread does differently from an
event-loop task (sleeping, the heartbeat, one-connection pipelines) comes from the hand-written
runtime and heartbeat modules imported below.

Each method sends one script call and hands the reply to ``idemkey._core``; every decision
lives there, in ``_durable`` and in ``_server_check``.
"""

# unasync: generates _sync_store.py
from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any, Literal, overload

from .._core import (
    RECORD_LOST,
    Claimed,
    Decision,
    ExpiringDecision,
    InFlight,
    Record,
    Replay,
    decode_checkpoint_reply,
    decode_claim_reply,
    new_owner,
    owner_tag,
    record_for,
)
from ..errors import ConfigurationError, EffectCommittedError, StoreError
from ..events import logger
from ..policy import Policy
from ._async_status import read_statuses, scan_statuses
from ._backend import SCRIPT_KEYS, _dropped_errors, _never_connected, _retry_delay, _slot_moving
from ._base import (
    COMMITTED_ONLY,
    AsyncEffects,
    _block_cap,
    _block_ms,
    _done_stream,
    _next_delay,
    _read_limit,
)
from ._concurrency._async_heartbeat import AsyncHeartbeat
from ._concurrency._async_keeper import AsyncKeeper
from ._concurrency._async_lean import lean_for
from ._concurrency._async_redirect import route_for
from ._concurrency._async_runtime import (
    LoopWatch,
    discover,
    drop_other_loops,
    send_with_wait,
    sleep,
)
from ._concurrency._async_wakeup import AsyncWakeups
from ._durable import _DONE, _DURABLE, _LOAD_SCRIPT, _SEND_AGAIN, _UNCONFIRMED, _durable_outcome
from ._server_check import _CONFIG_NAMES, _config_pairs, _info_settings, _report, server_warnings
from .operator import Cancelled, Forgotten, decode_cancel_reply, decode_forget_reply
from .status import STATES, RecordStatus
from .uncertain import UncertainEntry, UncertainKind, decode_entry, entry_fields, uncertain_stream

__all__ = ["AsyncRedisStore"]

#: Seconds ``close()`` waits for the uncertain outcomes still being written.
CLOSE_DRAIN = 1.0


def _states(state: str | Collection[str] | None) -> frozenset[str] | None:
    """``records(state=...)`` as a set, every name checked: a typo must not list nothing."""
    if state is None:
        return None
    states = frozenset((state,) if isinstance(state, str) else state)
    unknown = sorted(states.difference(STATES))
    if unknown:
        raise ConfigurationError(f"unknown record state {unknown}: use one of {list(STATES)}")
    return states


class AsyncRedisStore(AsyncHeartbeat):
    """Idempotency records in Redis.

    ``client`` is a ``redis.asyncio.Redis``, ``redis.asyncio.RedisCluster`` or
    ``valkey.asyncio.Valkey`` made with ``decode_responses=False``; the store does not close
    it. ``policy`` gives the default lease, retention and prefix for callers that pass none.
    """

    def __init__(
        self, client: Any, policy: Policy | None = None, *, effects: AsyncEffects | None = None
    ) -> None:
        super().__init__(client, policy)
        client = self.client  # a valkey-glide client is wrapped by now (idemkey/store/_glide)
        #: Where committed results are found again (``idemkey.contrib.sqlalchemy``), or None.
        self.effects = effects
        self._wakeups = AsyncWakeups(self._read_done, _read_limit(client))
        self._block_cap = _block_cap(client)
        self._dropped = _dropped_errors(client)
        self._loops = LoopWatch()
        self._keeper = AsyncKeeper(client)
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

    async def aclose(self) -> None:
        """Stop the heartbeat, and give the uncertain outcomes being written up to a second
        (``CLOSE_DRAIN``) to land. The Redis client stays open: it belongs to the caller."""
        await super().aclose()
        await self._keeper.drain(CLOSE_DRAIN)

    async def _eval(self, name: str, *keys_and_args: str | bytes | int) -> Any:
        script = self._scripts[name]
        if self._loops.moved():  # another event loop: its connections are of no use here
            await drop_other_loops(self.client)
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
        if self._loops.moved():
            await drop_other_loops(self.client)
        if durability is None or name not in _DURABLE:
            return await AsyncRedisStore._eval(self, name, *keys_and_args)
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
                    with contextlib.suppress(StoreError):
                        key, _, owner, *_ = keys_and_args
                        await AsyncRedisStore._eval(self, "release", key, owner)
                raise value

    async def _refresh_topology(self) -> None:
        """After a redirect or a dead node, let a cluster client learn who serves what now."""
        nodes = getattr(self.client, "nodes_manager", None)
        if nodes is not None:
            with contextlib.suppress(*self._errors):
                await nodes.initialize()

    @overload
    async def claim(
        self,
        record: Record,
        fingerprint: str | bytes,
        *,
        owner: str | None = ...,
        lease_ms: int | None = ...,
        ttl_ms: int | None = ...,
        wait: float = ...,
        heartbeat: bool = ...,
        expired: Literal[False] = ...,
        origin: str = ...,
    ) -> Decision: ...
    @overload
    async def claim(
        self,
        record: Record,
        fingerprint: str | bytes,
        *,
        owner: str | None = ...,
        lease_ms: int | None = ...,
        ttl_ms: int | None = ...,
        wait: float = ...,
        heartbeat: bool = ...,
        expired: bool,
        origin: str = ...,
    ) -> ExpiringDecision: ...
    async def claim(
        self,
        record: Record,
        fingerprint: str | bytes,
        *,
        owner: str | None = None,
        lease_ms: int | None = None,
        ttl_ms: int | None = None,
        wait: float = 0.0,
        heartbeat: bool = True,
        expired: bool = False,
        origin: str = "",
    ) -> ExpiringDecision:
        """Claim ``record`` for a request with ``fingerprint``; see claim.lua for the answers.

        ``expired``: a record that is gone but whose tombstone (written by :meth:`complete`
        with ``grace_ms``) has this fingerprint answers :class:`~idemkey._core.Expired`.

        While another executor holds the record, wait up to ``wait`` seconds for it to finish
        (then the answer is its replay), woken by its completion or release. A ``Claimed``
        record is renewed by the store's heartbeat until it is completed or released (unless
        ``heartbeat=False``). ``origin`` (:func:`idemkey._core.record_origin`) is kept in the
        record, for :meth:`records` to filter by route and scope and to tell its age.
        """
        owner = owner or new_owner()
        lease_ms = lease_ms or self.policy.lease_ms
        ttl_ms = ttl_ms or self.policy.ttl_ms
        args: tuple[str | bytes | int, ...] = (
            record.record_key,
            fingerprint,
            owner,
            lease_ms,
            ttl_ms,
        )
        if wait > 0 or expired or origin:
            # ARGV[5] "I will wait": the claim's end then wakes us; ARGV[6] "expired": read the
            # tombstone; ARGV[7] the origin, kept for store.records().
            args = (*args, 1 if wait > 0 else 0, 1 if expired else 0)
            if origin:
                args = (*args, f"{int(time.time() * 1000)} {origin}")
        decision = decode_claim_reply(await self._eval("claim", *args), owner)
        if wait > 0 and type(decision) is InFlight:
            decision = await self._wait_for_end(record, owner, args, decision, wait)
        if heartbeat and type(decision) is Claimed:
            self._watch(record, owner, lease_ms, decision.fence)
        if self.effects is not None and type(decision) is Claimed:
            # Redis may have forgotten the key (a restart without persistence, a failover,
            # an eviction) or the completion (a crash after the commit): the database says
            # whether a fenced transaction committed for it. Whatever the fence's value.
            return await self._recover(record, decision, ttl_ms)
        return decision

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
        if self._loops.moved():
            await drop_other_loops(self.client)
        try:
            if hasattr(self.client, "get_node_from_key"):  # a cluster: no COMMAND GETKEYS
                node = self.client.get_node_from_key(stream)
                entries = await self.client.execute_command(*command, target_nodes=node)
            else:
                entries = await self.client.execute_command(*command)
        except self._errors:
            return None
        return bool(entries)

    async def _recover(self, record: Record, claim: Claimed, ttl_ms: int) -> Decision:
        """A committed fenced result is the answer: complete the record with it and replay.
        A row committed with no result recorded: release and raise EffectCommittedError."""
        try:
            stored = await self.effects.find(record) if self.effects is not None else None
        except StoreError:
            await self.release(record, claim.owner)  # fail closed: nothing runs unfenced
            raise
        if stored is None:
            return claim
        if stored == COMMITTED_ONLY:
            await self.release(record, claim.owner)
            raise EffectCommittedError()
        await self.complete(record, claim.owner, stored, ttl_ms=ttl_ms)
        return Replay(stored)

    async def complete(
        self,
        record: Record,
        owner: str,
        response: bytes,
        *,
        ttl_ms: int | None = None,
        grace_ms: int = 0,
        keep_origin: bool | None = None,
    ) -> bool:
        """Store ``response``; False when the record is no longer ours: another owner took it
        over, or it was lost from Redis under the claim (evicted, deleted; see
        ``_record_lost``). Nothing is written then. ``grace_ms`` > 0: also write a tombstone
        that outlives the record by that long (``Policy.expired_grace``, complete.lua).
        ``keep_origin``: keep the claim's origin (with the client's key) in the completed
        record; None: as the store's ``Policy.keep_key_after_completion`` says.

        A failed write is retried for up to ``completion_retry`` seconds (a third of the lease
        at most) before StoreError.
        """
        lease = self._unwatch(record, owner)
        ttl_ms = ttl_ms or self.policy.ttl_ms
        # The owner's tag is computed here only, and sent. With the claim's fence (kept with
        # its lease), complete.lua tells a lost record apart.
        args: tuple[str | bytes | int, ...] = (
            record.record_key,
            owner,
            response,
            ttl_ms,
            owner_tag(owner),
        )
        fence = lease.fence if lease is not None else None
        if fence is not None:
            args += (fence,)
        if keep_origin is None:
            keep_origin = self.policy.keep_key_after_completion
        if grace_ms > 0 or keep_origin:  # the optional arguments before, "" when unset
            args += (*(() if fence is not None else ("",)), grace_ms or "")
        if keep_origin:  # ARGV[7]: keep the claim's origin
            args += (1,)
        # The deadline counts from the first attempt, but only a failed one computes it.
        started, deadline, delay = time.monotonic(), 0.0, 0.0
        while True:
            try:
                reply = await self._eval("complete", *args)
                return reply == 1 or self._refused(record, owner, reply)
            except StoreError:
                if not deadline:
                    deadline = self._completion_deadline(lease, started)
                if (delay := _next_delay(delay, deadline)) <= 0:
                    raise
            await sleep(delay)

    async def release(self, record: Record, owner: str) -> bool:
        """Free an unfinished claim so a retry runs afresh; False when it was not ours."""
        self._unwatch(record, owner)
        reply = await self._eval("release", record.record_key, owner)
        return reply == 1 or self._refused(record, owner, reply)

    async def renew(self, record: Record, owner: str, *, lease_ms: int | None = None) -> bool:
        """Extend the lease by ``lease_ms``; False when it is no longer ours."""
        return await self._renew(record, owner, lease_ms or self.policy.lease_ms, None) == 1

    async def _renew(self, record: Record, owner: str, lease_ms: int, fence: int | None) -> int:
        """renew.lua's reply: 1 renewed, 0 another owner's, RECORD_LOST (only with the claim's
        ``fence``) the record was lost under the claim."""
        args: tuple[str | int, ...] = (record.record_key, owner, lease_ms)
        reply = await self._eval("renew", *(args if fence is None else (*args, fence)))
        return 1 if reply == 1 else RECORD_LOST if reply == RECORD_LOST else 0

    async def checkpoint(
        self, record: Record, owner: str, field: str, result: bytes
    ) -> bytes | None:
        """Store a finished step's ``result`` under ``field`` (see checkpoint.lua). Returns the
        step's stored result (``result``, or the one stored first), None when the record is no
        longer ours (nothing written). A failed write is retried like a completion."""
        args = (record.record_key, owner, field, result)
        deadline, delay = self._completion_deadline(None, time.monotonic()), 0.0
        while True:
            try:
                return decode_checkpoint_reply(await self._eval("checkpoint", *args), result)
            except StoreError:
                if (delay := _next_delay(delay, deadline)) <= 0:
                    raise
            await sleep(delay)

    async def records(
        self,
        *,
        state: str | Collection[str] | None = None,
        route: str | None = None,
        scope: str | None = None,
        method: str | None = None,
        limit: int | None = None,
        count: int = 1000,
        progress: Callable[[int, int], None] | None = None,
    ) -> AsyncIterator[RecordStatus]:
        """The records under the policy's prefix, as :class:`~idemkey.store.status.RecordStatus`,
        read with SCAN (``count`` keys a page, never KEYS) on every primary of a cluster.

        Filters: ``state`` (one of ``in_progress``, ``lapsed``, ``complete``, ``released``, or
        several), ``route`` (a route template or an ``@idempotent`` function's name),
        ``scope`` and ``method``, each an exact match (only records not yet complete keep
        where they came from); ``limit`` stops after that many. Pages
        are read as the caller iterates, so memory stays bounded by one page whatever the
        keyspace holds. A record may be seen twice or missed when it is written during the scan
        (SCAN's guarantee covers records that exist throughout). ``progress``, when given, is
        called after each page with the keys it looked at and the records it gave. Redis
        failing raises :class:`~idemkey.errors.StoreError`.
        """
        states = _states(state)
        try:
            await discover(self.client)  # a cluster's primaries, before they are scanned
            async for status in scan_statuses(
                self.client,
                self.policy.prefix,
                states=states,
                route=route,
                scope=scope,
                method=method,
                limit=limit,
                count=count,
                progress=progress,
            ):
                yield status
        except self._errors as exc:
            raise self._store_error("records", exc) from exc

    async def record(
        self, key: str | Record, *, scope: str = "", method: str = "GUARD", route: str = ""
    ) -> RecordStatus | None:
        """The status of one record, or None when there is none.

        ``key`` is a :class:`~idemkey._core.Record` or an idempotency key, named with
        ``scope``, ``method`` and ``route`` as the adapters name it: the defaults name a
        ``guard()`` record (method ``GUARD``, empty scope); an HTTP record needs its method,
        route template and scope (the default scope of a request without credentials is
        ``idemkey.http.NO_CREDENTIALS``).
        """
        record = (
            key
            if isinstance(key, Record)
            else record_for(self.policy.prefix, scope, method, route, key)
        )
        try:
            found = await read_statuses(self.client, [record.record_key])
        except self._errors as exc:
            raise self._store_error("record", exc) from exc
        return found[0] if found else None

    def keep_uncertain(
        self,
        kind: UncertainKind,
        record: Record,
        scope: str,
        method: str,
        route: str,
        fence: int | None = None,
        detail: str = "",
        steps: tuple[str, ...] = (),
    ) -> None:
        """Append an uncertain outcome to its prefix's stream (see ``idemkey.store.uncertain``),
        off the caller's path: returns at once and never raises; a write that fails is lost.
        The guards and adapters call it; the stream lives as long as the store's records."""
        try:
            prefix = record.record_key.rpartition(":{")[0]
            fields = entry_fields(kind, record.digest, scope, method, route, fence, detail, steps)
            self._keeper.keep(uncertain_stream(prefix), fields, self.policy.ttl_ms)
        except Exception as exc:  # never the request's problem
            logger.debug("idemkey could not keep an uncertain outcome: %s", exc)

    async def uncertain(self, *, limit: int = 100) -> list[UncertainEntry]:
        """The latest uncertain outcomes under the policy's prefix, newest first, at most
        ``limit`` (the stream keeps about ``MAX_ENTRIES``). Redis failing raises
        :class:`~idemkey.errors.StoreError`."""
        stream = uncertain_stream(self.policy.prefix)
        try:
            entries = await self.client.xrevrange(stream, "+", "-", count=limit)
        except self._errors as exc:
            raise self._store_error("uncertain", exc) from exc
        return [decode_entry(entry_id, fields) for entry_id, fields in entries]

    async def attempt(self, record: Record, owner: str, field: str) -> int | None:
        """Count one more attempt of the retried step whose attempt field is ``field`` (see
        attempt.lua): the attempt's number, counted across takeovers, or None when the record
        is no longer ours (nothing written)."""
        reply = await self._eval("attempt", record.record_key, owner, field)
        if type(reply) is not int or reply < 0:
            raise StoreError(f"unexpected reply from the attempt script: {reply!r:.200}")
        return reply or None

    async def cancel(self, record: Record, *, abandon: bool = False) -> Cancelled | None:
        """Give up ``record``'s run on purpose (an operator's call, see cancel.lua): an
        in-progress record's owner loses it (its checkpoints and completion are refused from
        now on), and a released record with finished steps is released again. The finished
        steps are kept (the next claim resumes after them) unless ``abandon`` (the next claim
        runs the job from the start). Returns what was cancelled and the raised fence, None
        when there was nothing to cancel (no record, a completed one, a released one without
        steps)."""
        return decode_cancel_reply(
            await self._eval("cancel", record.record_key, 1 if abandon else 0)
        )

    async def forget(self, record: Record, *, force: bool = False) -> Forgotten:
        """Delete ``record`` (an operator's call, see forget.lua) with its expiry tombstone,
        a 0.2 lock string and its wake-up stream, so the next request with its key runs
        afresh. A record a live claim holds is kept (``held``) unless ``force``: its owner's
        completion is then refused, and a duplicate may run beside it. A lapsed, completed
        or released record is deleted; ``state`` says which it was ("" when none)."""
        return decode_forget_reply(await self._eval("forget", record.record_key, 1 if force else 0))

    async def acheck(self) -> list[str]:
        """Warn when the server can lose records: an evicting ``maxmemory-policy`` (any but
        ``noeviction``: records carry a TTL, so ``volatile-*`` evicts them too) or nothing kept
        on disk. Returns the warnings (each also logged); an empty list means nothing found.

        An explicit call rather than I/O in ``__init__``: creating a store stays free of round
        trips and cannot fail because Redis is down or slow at import time, and the app picks
        the moment (startup, a health check). It never raises: where CONFIG is disabled
        (managed Redis) it reads INFO instead, and if that fails too it says nothing. On a
        cluster every primary is checked and each warning names its node.
        """
        labelled = []
        if self._loops.moved():
            await drop_other_loops(self.client)
        try:
            await discover(self.client)
            for label, target in self._check_targets():
                labelled.append((label, server_warnings(await self._settings(target))))
        except self._errors:  # the node list itself (a cluster that cannot be reached)
            pass
        return _report(labelled)

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
