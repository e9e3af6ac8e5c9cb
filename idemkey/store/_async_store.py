"""AsyncRedisStore: idempotency records in Redis.

One text for both stores: the async file is the source, and scripts/unasync.py writes the sync
one from it (see ``idemkey/store/__init__.py``). What a thread does differently from an
event-loop task (sleeping, the heartbeat, one-connection pipelines) comes from the hand-written
runtime and heartbeat modules imported below.

Each method sends one script call (how: ``_async_sender``, its base class) and hands the reply
to ``idemkey._core``; every decision lives there, in ``_durable`` and in ``_server_check``.
"""

# unasync: generates _sync_store.py
from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any, Literal, overload

from .._core import (
    Claimed,
    Decision,
    ExpiringDecision,
    InFlight,
    Mismatch,
    NotARecordError,
    Record,
    Replay,
    decode_checkpoint_reply,
    decode_claim_reply,
    new_owner,
    owner_tag,
)
from ..errors import EffectCommittedError, RecordFormatError, StoreError
from ..policy import Policy
from ._async_sender import AsyncSender
from ._async_status import read_statuses, scan_statuses
from ._base import COMMITTED_ONLY, AsyncEffects, _next_delay
from ._concurrency._async_keeper import AsyncKeeper
from ._concurrency._async_runtime import discover, sleep
from ._server_check import _report, server_warnings
from .operator import (
    Cancelled,
    Forgotten,
    Seen,
    decode_cancel_reply,
    decode_forget_reply,
    seen_args,
)
from .status import RecordStatus, _states
from .uncertain import UncertainEntry, decode_entry, uncertain_stream

__all__ = ["AsyncRedisStore"]

#: Seconds ``close()`` waits for the uncertain outcomes still being written.
CLOSE_DRAIN = 1.0


class AsyncRedisStore(AsyncSender):
    """Idempotency records in Redis.

    ``client`` is a ``redis.asyncio.Redis``, ``redis.asyncio.RedisCluster`` or
    ``valkey.asyncio.Valkey`` made with ``decode_responses=False``; the store does not close
    it. ``policy`` gives the default lease, retention and prefix for callers that pass none.
    """

    def __init__(
        self, client: Any, policy: Policy | None = None, *, effects: AsyncEffects | None = None
    ) -> None:
        super().__init__(client, policy)
        #: Where committed results are found again (``idemkey.contrib.sqlalchemy``), or None.
        self.effects = effects
        self._keeper = AsyncKeeper(self.client)

    async def aclose(self) -> None:
        """Stop the heartbeat; give the uncertain outcomes and cut-off writes being written up
        to a second (``CLOSE_DRAIN``) to land. The Redis client stays open: it belongs to the
        caller. No claim is renewed after it, an open guard's neither; a later claim starts the
        heartbeat again (``AsyncHeartbeat.aclose``): the store stays usable."""
        await super().aclose()
        await self._keeper.drain(CLOSE_DRAIN)

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
        record, for :meth:`records` to filter by route and scope and to tell its age. A reply
        :class:`RecordFormatError` refuses (a step name not UTF-8, a key of another type at the
        record's name) gives the claim back first, if there is one.
        """
        owner = owner or new_owner()
        lease_ms = lease_ms or self.policy.lease_ms
        ttl_ms = ttl_ms or self.policy.ttl_ms
        # The script's arguments, built once: ARGV[5] "I will wait" (the claim's end then wakes
        # us), ARGV[6] "expired" (read the tombstone), ARGV[7] the origin, kept for records().
        key, waits, tombstone = record.record_key, 1 if wait > 0 else 0, 1 if expired else 0
        args: tuple[str | bytes | int, ...] = (key, fingerprint, owner, lease_ms, ttl_ms)
        if origin:  # the script puts its clock's time before it
            args += (waits, tombstone, origin)
        elif waits or tombstone:
            args += (waits, tombstone)
        try:
            decision = decode_claim_reply(await self._eval("claim", *args), owner)
            if type(decision) is Replay:  # the usual retry: nothing more to do
                return decision
            if wait > 0 and type(decision) is InFlight:
                decision = await self._wait_for_end(record, owner, args, decision, wait)
        except RecordFormatError as exc:  # claimed, but holding what idemkey never writes:
            if type(exc) is not NotARecordError:  # give back (no hash there: nothing claimed)
                await self._eval("release", record.record_key, owner)
            raise
        if heartbeat and type(decision) is Claimed:
            self._watch(record, owner, lease_ms, decision.fence)
        if self.effects is not None and type(decision) is Claimed:
            # Redis may have forgotten the key (a restart without persistence, a failover,
            # an eviction) or the completion (a crash after the commit): the database says
            # whether a fenced transaction committed for it. Whatever the fence's value.
            return await self._recover(record, decision, ttl_ms, fingerprint)
        return decision

    async def _recover(
        self, record: Record, claim: Claimed, ttl_ms: int, fingerprint: str | bytes
    ) -> Decision:
        """A committed fenced result is the answer: complete the record with it and replay.
        A row committed with no result recorded: release and raise EffectCommittedError; one
        another request committed (it keeps its fingerprint): release, Mismatch (key reuse)."""
        try:
            stored = await self.effects.find(record) if self.effects is not None else None
        except StoreError:
            await self.release(record, claim.owner)  # fail closed: nothing runs unfenced
            raise
        if stored is None:
            return claim
        # An optional hook (contrib.sqlalchemy's; an Effects of the user's own may lack it): a
        # row that keeps its request's fingerprint tells on reuse.
        if (reused := getattr(stored, "reused", None)) is not None and reused(fingerprint):
            await self.release(record, claim.owner)
            return Mismatch()
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
        await self._follow_loop()
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
        record = self._named(key, scope, method, route)
        await self._follow_loop()
        try:
            found = await read_statuses(self.client, [record.record_key])
        except self._errors as exc:
            raise self._store_error("record", exc) from exc
        return found[0] if found else None

    async def uncertain(self, *, limit: int = 100) -> list[UncertainEntry]:
        """The latest uncertain outcomes under the policy's prefix, newest first, at most
        ``limit`` (the stream keeps about ``MAX_ENTRIES``). Redis failing raises
        :class:`~idemkey.errors.StoreError`."""
        stream = uncertain_stream(self.policy.prefix)
        await self._follow_loop()
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

    async def cancel(
        self, record: Record, *, abandon: bool = False, seen: Seen | None = None
    ) -> Cancelled | None:
        """Give up ``record``'s run on purpose (an operator's call, see cancel.lua): an
        in-progress record's owner loses it (its checkpoints and completion are refused from
        now on), and a released record with finished steps is released again. The finished
        steps are kept (the next claim resumes after them) unless ``abandon`` (the next claim
        runs the job from the start). Returns what was cancelled and the raised fence, None
        when there was nothing to cancel (no record, a completed one, a released one without
        steps). ``seen``: what the operator was shown; any other is kept (``changed``)."""
        return decode_cancel_reply(
            await self._eval("cancel", record.record_key, 1 if abandon else 0, *seen_args(seen))
        )

    async def forget(
        self, record: Record, *, force: bool = False, seen: Seen | None = None
    ) -> Forgotten:
        """Delete ``record`` (an operator's call, see forget.lua) with its expiry tombstone,
        a 0.2 lock string and its wake-up stream, so the next request with its key runs
        afresh. A record a live claim holds is kept (``held``) unless ``force``: its owner's
        completion is then refused, and a duplicate may run beside it. A lapsed, completed
        or released record is deleted, and a key of another type at the record's name (every
        claim refuses it); ``state`` says which it was ("foreign": that key, "": none).
        ``seen``: what the operator was shown; any other is kept (``changed``)."""
        return decode_forget_reply(
            await self._eval("forget", record.record_key, int(force), *seen_args(seen))
        )

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
        await self._follow_loop()
        try:
            await discover(self.client)
            for label, target in self._check_targets():
                labelled.append((label, server_warnings(await self._settings(target))))
        except self._errors:  # the node list itself (a cluster that cannot be reached)
            pass
        return _report(labelled)
