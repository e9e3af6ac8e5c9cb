"""RedisStore and AsyncRedisStore: the only code that talks to Redis.

Each method sends one script call and hands the reply to ``_core``; every decision lives
there. The two classes stand side by side and differ only in ``await``.

Scripts are registered per store instance (``client.register_script``), never on a class bound
to the first client. The hot path sends a bare ``EVALSHA`` with ``execute_command``, which saves
redis-py's per-call argument shuffling, and falls back to the registered ``Script`` (which loads
the script and retries) when the server answers NOSCRIPT, e.g. after a restart or a failover.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import threading
import time
from collections.abc import Callable, Coroutine
from importlib.resources import files
from typing import Any, Final, Protocol, TypeVar

from ._core import (
    Claimed,
    Decision,
    InFlight,
    Record,
    Replay,
    decode_claim_reply,
    new_owner,
    next_poll_delay,
)
from ._leases import Lease, LeaseTable
from .errors import ConfigurationError, StoreError
from .events import logger
from .policy import Policy, Replicas

__all__ = ["AsyncRedisStore", "RedisStore", "detach", "uncancellable"]

T = TypeVar("T")

SCRIPT_NAMES: Final = ("claim", "complete", "release", "renew")
SCRIPTS: Final[dict[str, str]] = {
    name: (files("idemkey") / "lua" / f"{name}.lua").read_text("utf-8") for name in SCRIPT_NAMES
}


_Errors = tuple[type[BaseException], ...]


def _backend_errors(client: Any) -> tuple[_Errors, type[BaseException], _Errors]:
    """(errors to wrap as StoreError, the NOSCRIPT error, "slot is moving" errors) of the
    client's library.

    The cluster client raises its topology errors (no reachable node, slots not covered during
    a failover) as a class outside the RedisError tree; they are store errors all the same.
    """
    if type(client).__module__.startswith("valkey"):
        from valkey.exceptions import ClusterError as ValkeyClusterError
        from valkey.exceptions import NoScriptError as ValkeyNoScript
        from valkey.exceptions import TryAgainError as ValkeyTryAgain
        from valkey.exceptions import ValkeyClusterException, ValkeyError

        errors = (ValkeyError, ValkeyClusterException, OSError)
        return errors, ValkeyNoScript, (ValkeyClusterError, ValkeyTryAgain)
    from redis.exceptions import (
        ClusterError,
        NoScriptError,
        RedisClusterException,
        RedisError,
        TryAgainError,
    )

    if type(client).__module__ == "redis.asyncio.cluster":
        # redis-py's asyncio cluster client can tear a connection down under a task that is
        # using it while the topology changes (a slot moving, a failover); the task then gets
        # AttributeError ("'NoneType' object has no attribute 'writelines'"). It is retried like
        # a moving slot (sending a script twice with one owner is safe), then a StoreError.
        return (
            (RedisError, RedisClusterException, OSError, AttributeError),
            NoScriptError,
            (ClusterError, TryAgainError, AttributeError),
        )
    return (
        (RedisError, RedisClusterException, OSError),
        NoScriptError,
        (ClusterError, TryAgainError),
    )


def _slot_moving(exc: BaseException, moving: _Errors) -> bool:
    """Whether Redis Cluster refused the script because its slot is being migrated.

    A script touches two keys (record and lock). While their slot migrates, the cluster answers
    TRYAGAIN to a multi-key command unless both keys exist on the node asked, which a new record
    (no keys yet) or a completed one (no lock) never satisfies, until the slot has moved. The
    client retries TRYAGAIN for a moment, then raises ``ClusterError("TTL exhausted.")`` (exactly
    that class; ``ClusterDownError`` is a subclass and means something else). The script did not
    run, so sending it again is safe.
    """
    return type(exc) in moving


# Durability (Policy.durability): claim and complete are sent as EVALSHA + WAIT in one pipeline,
# on one connection, because WAIT counts the replicas that have this connection's writes.
_DURABLE: Final = frozenset({"claim", "complete"})
# Replies that mean "not on this node (now)": the cluster client handles them for plain calls,
# the durable path (its own pipeline to the slot's master) retries them. redis-py and valkey
# name them alike.
_REDIRECTS: Final = frozenset(
    {"MovedError", "AskError", "TryAgainError", "ClusterDownError", "MasterDownError"}
)


def _wrote(name: str, reply: Any) -> bool:
    """Whether a script reply means the call wrote: a claim (``{1, ...}``) or a completion (1)."""
    if name == "claim":
        return isinstance(reply, list) and bool(reply) and reply[0] == 1
    return bool(reply == 1)


def _unconfirmed(name: str, acked: int, durability: Replicas) -> StoreError:
    return StoreError(
        f"{name} reached {acked} of {durability.count} replicas within "
        f"{durability.timeout_ms} ms (Policy.durability): treated as failed"
    )


def _durable_reply(name: str, replies: list[Any]) -> tuple[Any, int]:
    """The script reply and the replica count from an EVALSHA + WAIT pipeline."""
    reply, acked = replies
    if isinstance(acked, BaseException):
        raise StoreError(f"Redis failed during {name} (WAIT): {acked}") from acked
    return reply, int(acked)


# What an EVALSHA + WAIT answer asks of the store's shell (sync or async) next.
_DONE, _LOAD_SCRIPT, _REDIRECTED, _UNCONFIRMED = range(4)


def _durable_outcome(
    name: str,
    replies: list[Any],
    noscript: type[BaseException],
    durability: Replicas,
    may_retry: bool,
) -> tuple[int, Any]:
    """Decide on an EVALSHA + WAIT answer, without I/O.

    ``(_DONE, reply)``; ``(_LOAD_SCRIPT, None)``: load the script and send again;
    ``(_REDIRECTED, None)``: the slot is elsewhere now, learn the topology and send again (both
    only while ``may_retry``); ``(_UNCONFIRMED, error)``: the script wrote but too few replicas
    have it, so raise ``error`` (after releasing a claim). Any other failure raises StoreError.
    """
    reply, acked = _durable_reply(name, replies)
    if may_retry and isinstance(reply, noscript):
        return _LOAD_SCRIPT, None
    if may_retry and type(reply).__name__ in _REDIRECTS:
        return _REDIRECTED, None
    if isinstance(reply, BaseException):
        raise StoreError(f"Redis failed during {name}: {type(reply).__name__}: {reply}") from reply
    if _wrote(name, reply) and acked < durability.count:
        return _UNCONFIRMED, _unconfirmed(name, acked, durability)
    return _DONE, reply


def _retry_delay(previous: float, deadline: float) -> float:
    """Backoff while a cluster slot moves or a redirect settles: 10 ms doubling to 100 ms."""
    return min(max(previous * 2, 0.01), 0.1, max(0.0, deadline - time.monotonic()))


# store.check(): the server settings that decide whether records can be lost (sans-IO part).
_CONFIG_NAMES: Final = ("maxmemory-policy", "maxmemory", "save", "appendonly")


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _config_pairs(reply: Any) -> dict[str, str]:
    """A CONFIG GET reply (a dict, or a flat list from older clients) as str -> str."""
    if isinstance(reply, dict):
        return {_text(name): _text(value) for name, value in reply.items()}
    if isinstance(reply, list):
        return {
            _text(name): _text(value) for name, value in zip(reply[::2], reply[1::2], strict=False)
        }
    return {}


def _info_settings(memory: Any, persistence: Any) -> dict[str, str]:
    """The same settings from INFO, where CONFIG is disabled (managed Redis).

    INFO shows the eviction policy and whether AOF is on, but not the RDB save points: without
    AOF, persistence is unknown and nothing is said about it.
    """
    settings: dict[str, str] = {}
    if isinstance(memory, dict) and "maxmemory_policy" in memory:
        settings["maxmemory-policy"] = _text(memory["maxmemory_policy"])
        settings["maxmemory"] = _text(memory.get("maxmemory", ""))
    if isinstance(persistence, dict) and str(persistence.get("aof_enabled")) == "1":
        settings["appendonly"], settings["save"] = "yes", ""
    return settings


def server_warnings(settings: dict[str, str]) -> list[str]:
    """What can lose records on a server with these settings (``CONFIG GET`` names)."""
    from .diagnostics import check_persistence, eviction_warning

    warnings = []
    if "maxmemory-policy" in settings:
        warning = eviction_warning(settings["maxmemory-policy"], settings.get("maxmemory"))
        if warning is not None:
            warnings.append(warning)
    if "save" in settings and "appendonly" in settings:
        persistence = check_persistence(settings["save"], settings["appendonly"])
        if persistence.verdict != "OK":
            warnings.append(persistence.detail)
    return warnings


def _report(labelled: list[tuple[str, list[str]]]) -> list[str]:
    warnings = [
        f"{label}: {text}" if label else text for label, texts in labelled for text in texts
    ]
    for warning in warnings:
        logger.warning("idemkey store check: %s", warning)
    return warnings


class Effects(Protocol):
    """Where committed results can be found again (``idemkey.contrib.sqlalchemy.Effects``)."""

    def lookup(self, record: Record) -> bytes | None: ...


class AsyncEffects(Protocol):
    """:class:`Effects` for :class:`AsyncRedisStore`."""

    async def lookup(self, record: Record) -> bytes | None: ...


def _next_delay(previous: float, deadline: float) -> float:
    return next_poll_delay(previous, deadline - time.monotonic())


class _StoreBase:
    """What both stores share: the client check, the scripts, the policy."""

    #: Seconds a call keeps retrying while its Redis Cluster slot is being migrated (see
    #: ``_slot_moving``); after that it raises StoreError. A slot moves in well under a second
    #: unless it holds a great many keys.
    slot_moving_wait: float = 2.0
    #: Seconds a completion keeps retrying a failed write (a dropped connection, a full pool)
    #: before it raises StoreError; at most a third of the lease, which stops being renewed
    #: once the completion starts. The work is done by then: a completion that never lands
    #: leaves the record in progress, and a retry runs the work again once the lease lapses.
    #: Safe to repeat: complete.lua answers the same to the same owner, and never overwrites
    #: another owner's record.
    completion_retry: float = 1.0

    def _completion_deadline(self, lease: Lease | None) -> float:
        lease_ms = lease.lease_ms if lease is not None else self.policy.lease_ms
        return time.monotonic() + min(self.completion_retry, lease_ms / 3000)

    def __init__(self, client: Any, policy: Policy | None) -> None:
        encoder = getattr(client, "get_encoder", None)
        if encoder is None or not hasattr(client, "execute_command"):
            raise ConfigurationError(
                f"expected a redis-py or valkey client, got {type(client).__name__}"
            )
        if getattr(encoder(), "decode_responses", False):
            raise ConfigurationError(
                "the Redis client must use decode_responses=False: stored responses are bytes"
            )
        self.client = client
        self.policy = policy if policy is not None else Policy()
        self._errors, self._noscript, self._moving = _backend_errors(client)
        self._scripts = {name: client.register_script(text) for name, text in SCRIPTS.items()}
        self._leases = LeaseTable()

    def _check_targets(self) -> list[tuple[str, dict[str, Any]]]:
        """(label, execute_command kwargs) per server to check: each primary of a cluster."""
        primaries = getattr(self.client, "get_primaries", None)
        if primaries is None:
            return [("", {})]
        return [(node.name, {"target_nodes": node}) for node in primaries()]

    def _store_error(self, name: str, exc: BaseException) -> StoreError:
        return StoreError(f"Redis failed during {name}: {type(exc).__name__}: {exc}")

    def _lease_lost(self, lease: Lease) -> None:
        # INFO, not an event: the guard or adapter holding this claim reports the loss once,
        # with its route and scope, when its complete or release is refused.
        logger.info(
            "idemkey heartbeat: a lease was taken over; renewal stopped",
            extra={"idemkey_event": "lease_lost", "idemkey_record": lease.record.digest},
        )


class RedisStore(_StoreBase):
    """Idempotency records in Redis, for threads and plain functions.

    ``client`` is a ``redis.Redis``, ``redis.cluster.RedisCluster`` or ``valkey.Valkey`` made
    with ``decode_responses=False``; the store does not close it. ``policy`` gives the default
    lease, retention and prefix for callers that pass none.
    """

    #: Seconds without a live claim after which the heartbeat thread ends (a new claim starts
    #: another), so an idle store can be garbage-collected.
    heartbeat_idle_exit: float = 30.0

    def __init__(
        self, client: Any, policy: Policy | None = None, *, effects: Effects | None = None
    ) -> None:
        super().__init__(client, policy)
        self.effects = effects
        self._wakeup = threading.Condition()
        self._heartbeat: threading.Thread | None = None
        # While the heartbeat thread waits: the monotonic time it wakes at by itself (inf when
        # it has no lease); 0.0 while it is not waiting, as it then rereads the table anyway.
        self._sleeping_until = 0.0
        self._pid = os.getpid()
        self._closed = False
        if self.policy.durability is not None:
            # Only with durability on: the plain _eval (the hot path) stays exactly as it is.
            self._eval = self._eval_durable  # type: ignore[method-assign]

    def _eval(self, name: str, *keys_and_args: str | bytes | int) -> Any:
        script = self._scripts[name]
        try:
            try:
                return self.client.execute_command("EVALSHA", script.sha, 2, *keys_and_args)
            except self._noscript:
                return script(keys_and_args[:2], keys_and_args[2:])
        except self._errors as exc:
            if _slot_moving(exc, self._moving):
                return self._eval_while_slot_moves(name, keys_and_args)
            raise self._store_error(name, exc) from exc

    def _eval_while_slot_moves(
        self, name: str, keys_and_args: tuple[str | bytes | int, ...]
    ) -> Any:
        script = self._scripts[name]
        deadline, delay = time.monotonic() + self.slot_moving_wait, 0.0
        while True:
            time.sleep(delay := _retry_delay(delay, deadline))
            try:
                return script(keys_and_args[:2], keys_and_args[2:])
            except self._errors as exc:
                if not _slot_moving(exc, self._moving) or time.monotonic() >= deadline:
                    raise self._store_error(name, exc) from exc

    def _eval_durable(self, name: str, *keys_and_args: str | bytes | int) -> Any:
        durability = self.policy.durability
        if durability is None or name not in _DURABLE:
            return RedisStore._eval(self, name, *keys_and_args)
        script = self._scripts[name]
        deadline, delay = time.monotonic() + self.slot_moving_wait, 0.0
        while True:
            try:
                pipe = self._pipeline(keys_and_args, script.sha, durability)
                replies = pipe.execute(raise_on_error=False)
                may_retry = time.monotonic() < deadline
                outcome, value = _durable_outcome(
                    name, replies, self._noscript, durability, may_retry
                )
                if outcome == _LOAD_SCRIPT:
                    self.client.script_load(script.script)
            except self._errors as exc:
                self._refresh_topology()
                raise self._store_error(name, exc) from exc
            if outcome == _DONE:
                return value
            if outcome == _REDIRECTED:
                self._refresh_topology()
                time.sleep(delay := _retry_delay(delay, deadline))
            elif outcome == _UNCONFIRMED:
                if name == "claim":  # free the key so a retry can run, if Redis lets us
                    with contextlib.suppress(StoreError):
                        key, lock, _, owner, *_ = keys_and_args
                        RedisStore._eval(self, "release", key, lock, owner)
                raise value

    def _pipeline(
        self, keys_and_args: tuple[str | bytes | int, ...], sha: str, durability: Replicas
    ) -> Any:
        """EVALSHA + WAIT queued on one connection: the key's master, in a cluster."""
        client = self.client
        if hasattr(client, "get_node_from_key"):  # RedisCluster: that node's own client
            client = client.get_redis_connection(client.get_node_from_key(keys_and_args[0]))
        pipe = client.pipeline(transaction=False)
        pipe.execute_command("EVALSHA", sha, 2, *keys_and_args)
        pipe.execute_command("WAIT", durability.count, durability.timeout_ms)
        return pipe

    def _refresh_topology(self) -> None:
        """After a redirect or a dead node, let a cluster client learn who serves what now."""
        nodes = getattr(self.client, "nodes_manager", None)
        if nodes is not None:
            with contextlib.suppress(*self._errors):
                nodes.initialize()

    def claim(
        self,
        record: Record,
        fingerprint: str,
        *,
        owner: str | None = None,
        lease_ms: int | None = None,
        ttl_ms: int | None = None,
        wait: float = 0.0,
        heartbeat: bool = True,
    ) -> Decision:
        """Claim ``record`` for a request with ``fingerprint``; see claim.lua for the answers.

        While another executor holds the record, poll with backoff for up to ``wait`` seconds
        for it to finish (then the answer is its replay). A ``Claimed`` record is renewed by the
        store's heartbeat until it is completed or released (unless ``heartbeat=False``).
        """
        owner = owner or new_owner()
        lease_ms = lease_ms or self.policy.lease_ms
        ttl_ms = ttl_ms or self.policy.ttl_ms
        args = (record.key, record.lock, fingerprint, owner, lease_ms, ttl_ms)
        decision = decode_claim_reply(self._eval("claim", *args), owner)
        if wait > 0 and type(decision) is InFlight:
            deadline, delay = time.monotonic() + wait, 0.0
            while type(decision) is InFlight and (delay := _next_delay(delay, deadline)) > 0:
                time.sleep(delay)
                decision = decode_claim_reply(self._eval("claim", *args), owner)
        if heartbeat and type(decision) is Claimed:
            self._watch(record, owner, lease_ms)
        if self.effects is not None and isinstance(decision, Claimed) and decision.fence > 1:
            # Not the key's first claim: a fenced transaction may have committed already.
            return self._recover(record, decision, ttl_ms)
        return decision

    def _recover(self, record: Record, claim: Claimed, ttl_ms: int) -> Decision:
        """A claim that is not the key's first: a committed fenced result is the answer."""
        try:
            stored = self.effects.lookup(record) if self.effects is not None else None
        except StoreError:
            self.release(record, claim.owner)  # fail closed: nothing runs unfenced
            raise
        if stored is None:
            return claim
        self.complete(record, claim.owner, stored, ttl_ms=ttl_ms)
        return Replay(stored)

    def complete(
        self, record: Record, owner: str, response: bytes, *, ttl_ms: int | None = None
    ) -> bool:
        """Store ``response``; False when another owner took over (nothing written).

        A failed write is retried for up to ``completion_retry`` seconds (a third of the lease
        at most) before StoreError.
        """
        lease = self._unwatch(record, owner)
        args = (record.key, record.lock, owner, response, ttl_ms or self.policy.ttl_ms)
        deadline, delay = self._completion_deadline(lease), 0.0
        while True:
            try:
                return bool(self._eval("complete", *args) == 1)
            except StoreError:
                if (delay := _next_delay(delay, deadline)) <= 0:
                    raise
            time.sleep(delay)

    def release(self, record: Record, owner: str) -> bool:
        """Free an unfinished claim so a retry runs afresh; False when it was not ours."""
        self._unwatch(record, owner)
        return bool(self._eval("release", record.key, record.lock, owner) == 1)

    def renew(self, record: Record, owner: str, *, lease_ms: int | None = None) -> bool:
        """Extend the lease by ``lease_ms``; False when it is no longer ours."""
        lease_ms = lease_ms or self.policy.lease_ms
        return bool(self._eval("renew", record.key, record.lock, owner, lease_ms) == 1)

    def check(self) -> list[str]:
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
        try:
            for label, target in self._check_targets():
                labelled.append((label, server_warnings(self._settings(target))))
        except self._errors:  # the node list itself (a cluster that cannot be reached)
            pass
        return _report(labelled)

    def _settings(self, target: dict[str, Any]) -> dict[str, str]:
        ask = self.client.execute_command
        try:
            settings: dict[str, str] = {}
            for name in _CONFIG_NAMES:
                settings.update(_config_pairs(ask("CONFIG", "GET", name, **target)))
            return settings
        except self._errors:
            pass
        try:
            return _info_settings(
                ask("INFO", "memory", **target), ask("INFO", "persistence", **target)
            )
        except self._errors:
            return {}

    def close(self) -> None:
        """Stop the heartbeat. The Redis client stays open: it belongs to the caller."""
        with self._condition():
            self._closed = True
            self._leases.clear()
            self._wakeup.notify_all()

    # The heartbeat: one daemon thread per store renews every live claim of this process.

    def _condition(self) -> threading.Condition:
        """The heartbeat's condition, checked for a fork before anyone takes it.

        In a forked child the parent's claims and thread are not ours, and the parent's lock may
        be held forever by its heartbeat thread (caught mid-loop by the fork, and gone): start
        afresh with a new condition, or the child's first claim would hang.
        """
        if self._pid != os.getpid():
            self._pid, self._heartbeat = os.getpid(), None
            self._wakeup = threading.Condition()
            self._leases.clear()
            self._sleeping_until = 0.0
        return self._wakeup

    def _watch(self, record: Record, owner: str, lease_ms: int) -> None:
        with self._condition():
            due = self._leases.add(record, owner, lease_ms, time.monotonic())
            if self._heartbeat is None and not self._closed:
                self._heartbeat = threading.Thread(
                    target=self._beat, name="idemkey-heartbeat", daemon=True
                )
                self._heartbeat.start()
            # Wake the heartbeat only if this lease falls due before it wakes by itself. With
            # one lease length, a new claim is due after every live one; waking the thread on
            # each claim made it fight the request thread for the GIL (~9 us per guarded call).
            if due < self._sleeping_until:
                self._wakeup.notify()

    def _unwatch(self, record: Record, owner: str) -> Lease | None:
        with self._condition():
            return self._leases.remove(record, owner)

    def _beat(self) -> None:
        idle_since: float | None = None
        while True:
            with self._wakeup:
                due = self._leases.due(time.monotonic())
                while not due and not self._closed:
                    next_due = self._leases.next_due()
                    now = time.monotonic()
                    if next_due is not None:
                        idle_since = None
                    elif idle_since is None:
                        idle_since = now
                    elif now - idle_since >= self.heartbeat_idle_exit:
                        # Long idle: end, so the thread does not keep the store alive; the next
                        # claim starts a new one (under this same lock, so none is missed).
                        self._heartbeat = None
                        return
                    # Without a lease, still wake every _IDLE_SECONDS: a new claim then needs no
                    # notify unless it falls due sooner. Sleeping for ever made every claim wake
                    # the thread, which found the claim already completed and slept for ever
                    # again: a GIL ping-pong per request.
                    wake = now + _IDLE_SECONDS if next_due is None else next_due
                    self._sleeping_until = wake
                    self._wakeup.wait(max(0.0, wake - now))
                    self._sleeping_until = 0.0
                    due = self._leases.due(time.monotonic())
                if self._closed:
                    return
            for lease in due:
                try:
                    ours = self.renew(lease.record, lease.owner, lease_ms=lease.lease_ms)
                except StoreError as exc:
                    logger.warning("idemkey heartbeat could not renew a lease: %s", exc)
                    ours = None
                with self._wakeup:
                    if not self._leases.holds(lease):
                        continue  # completed or released meanwhile: its answer means nothing
                    if ours is None:
                        self._leases.failed(lease, time.monotonic())
                    elif ours:
                        self._leases.renewed(lease, time.monotonic())
                    else:
                        self._leases.remove(lease.record, lease.owner)
                if ours is False:
                    self._lease_lost(lease)


class AsyncRedisStore(_StoreBase):
    """Idempotency records in Redis, for asyncio: ``redis.asyncio.Redis``, its ``RedisCluster``
    or ``valkey.asyncio.Valkey``, made with ``decode_responses=False``."""

    def __init__(
        self, client: Any, policy: Policy | None = None, *, effects: AsyncEffects | None = None
    ) -> None:
        super().__init__(client, policy)
        self.effects = effects
        self._heartbeat: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        # While the heartbeat task waits: the loop time it wakes at by itself; else 0.0.
        self._sleeping_until = 0.0
        if self.policy.durability is not None:
            # Only with durability on: the plain _eval (the hot path) stays exactly as it is.
            self._eval = self._eval_durable  # type: ignore[method-assign]

    async def _eval(self, name: str, *keys_and_args: str | bytes | int) -> Any:
        script = self._scripts[name]
        try:
            try:
                return await self.client.execute_command("EVALSHA", script.sha, 2, *keys_and_args)
            except self._noscript:
                return await script(keys_and_args[:2], keys_and_args[2:])
        except self._errors as exc:
            if _slot_moving(exc, self._moving):
                return await self._eval_while_slot_moves(name, keys_and_args)
            raise self._store_error(name, exc) from exc

    async def _eval_while_slot_moves(
        self, name: str, keys_and_args: tuple[str | bytes | int, ...]
    ) -> Any:
        script = self._scripts[name]
        deadline, delay = time.monotonic() + self.slot_moving_wait, 0.0
        while True:
            await asyncio.sleep(delay := _retry_delay(delay, deadline))
            try:
                return await script(keys_and_args[:2], keys_and_args[2:])
            except self._errors as exc:
                if not _slot_moving(exc, self._moving) or time.monotonic() >= deadline:
                    raise self._store_error(name, exc) from exc

    async def _eval_durable(self, name: str, *keys_and_args: str | bytes | int) -> Any:
        durability = self.policy.durability
        if durability is None or name not in _DURABLE:
            return await AsyncRedisStore._eval(self, name, *keys_and_args)
        script = self._scripts[name]
        deadline, delay = time.monotonic() + self.slot_moving_wait, 0.0
        while True:
            try:
                replies = await self._send_with_wait(keys_and_args, script.sha, durability)
                may_retry = time.monotonic() < deadline
                outcome, value = _durable_outcome(
                    name, replies, self._noscript, durability, may_retry
                )
                if outcome == _LOAD_SCRIPT:
                    await self.client.script_load(script.script)
            except self._errors as exc:
                await self._refresh_topology()
                raise self._store_error(name, exc) from exc
            if outcome == _DONE:
                return value
            if outcome == _REDIRECTED:
                await self._refresh_topology()
                await asyncio.sleep(delay := _retry_delay(delay, deadline))
            elif outcome == _UNCONFIRMED:
                if name == "claim":  # free the key so a retry can run, if Redis lets us
                    with contextlib.suppress(StoreError):
                        key, lock, _, owner, *_ = keys_and_args
                        await AsyncRedisStore._eval(self, "release", key, lock, owner)
                raise value

    async def _send_with_wait(
        self, keys_and_args: tuple[str | bytes | int, ...], sha: str, durability: Replicas
    ) -> list[Any]:
        """EVALSHA + WAIT sent on one connection: the key's master, in a cluster."""
        client = self.client
        commands = (
            ("EVALSHA", sha, 2, *keys_and_args),
            ("WAIT", durability.count, durability.timeout_ms),
        )
        if hasattr(client, "get_node_from_key"):
            # The asyncio RedisCluster has no per-node client: its node sends a pipeline of
            # PipelineCommand on one of its connections (what its ClusterPipeline does).
            await client.initialize()  # a no-op once the topology is known
            node = client.get_node_from_key(keys_and_args[0])
            pipeline_command = importlib.import_module(type(client).__module__).PipelineCommand
            queued = [pipeline_command(i, *command) for i, command in enumerate(commands)]
            await node.execute_pipeline(queued)
            return [command.result for command in queued]
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute(raise_on_error=False))

    async def _refresh_topology(self) -> None:
        """After a redirect or a dead node, let a cluster client learn who serves what now."""
        nodes = getattr(self.client, "nodes_manager", None)
        if nodes is not None:
            with contextlib.suppress(*self._errors):
                await nodes.initialize()

    async def claim(
        self,
        record: Record,
        fingerprint: str,
        *,
        owner: str | None = None,
        lease_ms: int | None = None,
        ttl_ms: int | None = None,
        wait: float = 0.0,
        heartbeat: bool = True,
    ) -> Decision:
        """Claim ``record`` for a request with ``fingerprint``; see :meth:`RedisStore.claim`."""
        owner = owner or new_owner()
        lease_ms = lease_ms or self.policy.lease_ms
        ttl_ms = ttl_ms or self.policy.ttl_ms
        args = (record.key, record.lock, fingerprint, owner, lease_ms, ttl_ms)
        decision = decode_claim_reply(await self._eval("claim", *args), owner)
        if wait > 0 and type(decision) is InFlight:
            deadline, delay = time.monotonic() + wait, 0.0
            while type(decision) is InFlight and (delay := _next_delay(delay, deadline)) > 0:
                await asyncio.sleep(delay)
                decision = decode_claim_reply(await self._eval("claim", *args), owner)
        if heartbeat and type(decision) is Claimed:
            self._watch(record, owner, lease_ms)
        if self.effects is not None and isinstance(decision, Claimed) and decision.fence > 1:
            # Not the key's first claim: a fenced transaction may have committed already.
            return await self._recover(record, decision, ttl_ms)
        return decision

    async def _recover(self, record: Record, claim: Claimed, ttl_ms: int) -> Decision:
        """A claim that is not the key's first: a committed fenced result is the answer."""
        try:
            stored = await self.effects.lookup(record) if self.effects is not None else None
        except StoreError:
            await self.release(record, claim.owner)  # fail closed: nothing runs unfenced
            raise
        if stored is None:
            return claim
        await self.complete(record, claim.owner, stored, ttl_ms=ttl_ms)
        return Replay(stored)

    async def complete(
        self, record: Record, owner: str, response: bytes, *, ttl_ms: int | None = None
    ) -> bool:
        """Store ``response``; False when another owner took over (nothing written).

        A failed write is retried for up to ``completion_retry`` seconds (a third of the lease
        at most) before StoreError.
        """
        lease = self._leases.remove(record, owner)
        args = (record.key, record.lock, owner, response, ttl_ms or self.policy.ttl_ms)
        deadline, delay = self._completion_deadline(lease), 0.0
        while True:
            try:
                return bool(await self._eval("complete", *args) == 1)
            except StoreError:
                if (delay := _next_delay(delay, deadline)) <= 0:
                    raise
            await asyncio.sleep(delay)

    async def release(self, record: Record, owner: str) -> bool:
        """Free an unfinished claim so a retry runs afresh; False when it was not ours."""
        self._leases.remove(record, owner)
        return bool(await self._eval("release", record.key, record.lock, owner) == 1)

    async def renew(self, record: Record, owner: str, *, lease_ms: int | None = None) -> bool:
        """Extend the lease by ``lease_ms``; False when it is no longer ours."""
        lease_ms = lease_ms or self.policy.lease_ms
        return bool(await self._eval("renew", record.key, record.lock, owner, lease_ms) == 1)

    async def acheck(self) -> list[str]:
        """The asyncio twin of :meth:`RedisStore.check`: warnings about record loss."""
        labelled = []
        try:
            if hasattr(self.client, "get_primaries"):
                await self.client.initialize()  # the node list is known only after it
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

    async def aclose(self) -> None:
        """Stop the heartbeat. The Redis client stays open: it belongs to the caller."""
        self._leases.clear()
        task, self._heartbeat = self._heartbeat, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # The heartbeat: one task renews every live claim; it ends when none is left for a while,
    # so no task outlives its event loop's work.

    def _watch(self, record: Record, owner: str, lease_ms: int) -> None:
        due = self._leases.add(record, owner, lease_ms, time.monotonic())
        task = self._heartbeat
        if task is None or task.done() or task.get_loop() is not asyncio.get_running_loop():
            self._sleeping_until = 0.0
            self._wakeup = asyncio.Event()
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat(self._wakeup))
        elif self._wakeup is not None and due < self._sleeping_until:
            # Only when due before the task wakes by itself: waking it on every claim costs
            # a task switch per request.
            self._wakeup.set()

    async def _beat(self, wakeup: asyncio.Event) -> None:
        while True:
            next_due = self._leases.next_due()
            now = time.monotonic()
            if next_due is None or next_due > now:
                wakeup.clear()
                timeout = _IDLE_SECONDS if next_due is None else next_due - now
                self._sleeping_until = now + timeout
                try:
                    await asyncio.wait_for(wakeup.wait(), timeout)
                except asyncio.TimeoutError:
                    if not self._leases:
                        return
                finally:
                    self._sleeping_until = 0.0
                continue
            due = self._leases.due(now)
            answers = await asyncio.gather(
                *(self._renew_quietly(lease) for lease in due), return_exceptions=False
            )
            for lease, ours in zip(due, answers, strict=True):
                if not self._leases.holds(lease):
                    continue
                if ours is None:
                    self._leases.failed(lease, time.monotonic())
                elif ours:
                    self._leases.renewed(lease, time.monotonic())
                else:
                    self._leases.remove(lease.record, lease.owner)
                    self._lease_lost(lease)

    async def _renew_quietly(self, lease: Lease) -> bool | None:
        try:
            return await self.renew(lease.record, lease.owner, lease_ms=lease.lease_ms)
        except StoreError as exc:
            logger.warning("idemkey heartbeat could not renew a lease: %s", exc)
            return None


# Writes that a cancellation cut off, finished in their own task; held here because the event
# loop keeps only weak references to tasks.
_detached: set[asyncio.Task[Any]] = set()


def detach(write: Coroutine[Any, Any, Any]) -> None:
    """Run a store write to its end in a task of its own, whatever happens to the caller."""
    task = asyncio.get_running_loop().create_task(write)
    _detached.add(task)
    task.add_done_callback(_detached_done)


def _detached_done(task: asyncio.Task[Any]) -> None:
    _detached.discard(task)
    if not task.cancelled() and (error := task.exception()) is not None:
        logger.warning("idemkey could not finish a write cut off by a cancellation: %s", error)


async def uncancellable(write: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Await ``write()``; if the caller is cancelled meanwhile, send it again in a task.

    For complete and release after the work is done: left unwritten, the record would stay in
    progress and a retry would run the work again once the lease lapsed. Cheaper than
    ``asyncio.shield`` on every call (no task unless a cancellation comes), and safe because
    both scripts answer the same when sent twice with one owner.
    """
    try:
        return await write()
    except asyncio.CancelledError:
        detach(write())
        raise


# How long an idle async heartbeat waits for new claims before its task ends, and how often an
# idle heartbeat thread looks at its (empty) table.
_IDLE_SECONDS: Final = 1.0
