"""What RedisStore and AsyncRedisStore share: the client check, the scripts, the policy, and
the wait delays. No I/O here. The backend's error classes and the script key count live in
``_backend``, the lean path's eligibility and packer in ``_packing`` (both re-exported here).

Scripts are registered per store instance (``client.register_script``), never on a class bound
to the first client. The hot path sends a bare ``EVALSHA``: on a plain redis-py client through
the lean path (``_concurrency/_async_lean``: the command's head packed once, sent on a pooled
connection), elsewhere with ``execute_command``, which saves redis-py's per-call argument
shuffling. Either falls back to the registered ``Script`` (which loads the script and retries)
when the server answers NOSCRIPT, e.g. after a restart or a failover.
"""

from __future__ import annotations

import math
import time
from functools import partial
from importlib.resources import files
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..events import Reporting
    from .uncertain import UncertainKind

from .._core import DONE_HINT, RECORD_LOST, Record, next_poll_delay, record_for
from .._core._names import record_prefix
from ..errors import ConfigurationError, InvalidKeyError, StoreError
from ..events import DEBUG, RECORD_LOST_DETAIL, logger, report
from ..policy import Policy
from ._backend import SCRIPT_KEYS, _backend_errors, _glide_facade, asyncio_client, is_glide
from ._durable import _SERVER_LATENESS, _check_durability, _socket_timeout
from ._leases import _RETRY_FRACTION, Lease, LeaseTable
from ._packing import Packer, evalsha_packer, lean_eligible, pack_evalsha
from .uncertain import entry_fields, uncertain_stream

__all__ = [
    "COMMITTED_ONLY",
    "AsyncEffects",
    "Effects",
    "Packer",
    "SCRIPTS",
    "SCRIPT_KEYS",
    "SCRIPT_NAMES",
    "StoreBase",
    "evalsha_packer",
    "lean_eligible",
    "pack_evalsha",
]

SCRIPT_NAMES: Final = (
    "claim",
    "complete",
    "release",
    "renew",
    "checkpoint",
    "attempt",
    "cancel",
    "forget",
)
SCRIPTS: Final[dict[str, str]] = {
    name: (files("idemkey") / "lua" / f"{name}.lua").read_text("utf-8") for name in SCRIPT_NAMES
}

# At most this many lost-record notes wait for a guard or adapter to ask (see _record_lost).
_MAX_LOST_NOTES: Final = 1024

# How long an idle async heartbeat waits for new claims before its task ends, and how often an
# idle heartbeat thread looks at its (empty) table.
_IDLE_SECONDS: Final = 1.0


class Effects(Protocol):
    """Where committed results are found again (``idemkey.contrib.sqlalchemy.Effects``).

    ``find`` answers a claim: ``None`` (no committed row: run), the committed result, or
    ``COMMITTED_ONLY`` (committed with no result recorded); a found value may have a
    ``reused(fingerprint) -> bool`` method (contrib's rows keep their request's fingerprint):
    True makes the claim key reuse (422), not a replay. ``record`` writes a result into the
    row a fenced transaction of ``fence`` committed (``step``: a step's row)."""

    def find(self, record: Record, step: str | None = None) -> bytes | None:
        """The committed row's result for ``record`` (or its ``step``), or None: no row."""

    def record(self, record: Record, step: str | None, fence: int, result: bytes) -> bool:
        """Write ``result`` into the committed row of ``fence``; False: no such row."""


class AsyncEffects(Protocol):
    """:class:`Effects` for :class:`AsyncRedisStore`."""

    async def find(self, record: Record, step: str | None = None) -> bytes | None:
        """The committed row's result for ``record`` (or its ``step``), or None: no row."""

    async def record(self, record: Record, step: str | None, fence: int, result: bytes) -> bool:
        """Write ``result`` into the committed row of ``fence``; False: no such row."""


#: ``Effects.find``'s answer for a row committed with no result recorded in it (the SQL
#: ``result`` column's marker, ``contrib.sqlalchemy.COMMITTED``).
COMMITTED_ONLY: Final = b"\x00committed"


# Waiting for an in-flight claim to end (see complete.lua): one XREAD BLOCK on the record's done
# stream at a time per store and record, for at most this long (a waiter that reads the stream
# after its entry expired, 10 s after it was written, re-claims by then), and never so long
# that the client's socket timeout cuts the read as a failure: a server at the default hz 10
# answers a block that timed out up to 100 ms late, and a busy host delays the reply further,
# so at least 200 ms (_SERVER_LATENESS) and half the timeout are kept in hand.
_MAX_BLOCK: Final = 5.0
# Past this, the lease has lapsed; a little margin so the re-claim finds the lease lapsed.
_LAPSE_MARGIN: Final = 0.002


def _done_stream(record: Record) -> str:
    """The stream complete.lua and release.lua post to when waiters marked the record."""
    return record.record_key + DONE_HINT


def _block_cap(client: Any) -> float:
    """The longest XREAD BLOCK this client can wait through, in seconds (0: none, so poll)."""
    timeout = _socket_timeout(client)
    if timeout is None:
        return _MAX_BLOCK
    cap = min(_MAX_BLOCK, timeout - _SERVER_LATENESS, timeout / 2)
    return cap if cap >= 0.05 else 0.0  # a socket timeout under 250 ms: poll


def _read_limit(client: Any) -> int:
    """How many records' done streams one store blocks on at once: a quarter of the client's
    connection pool (the requests being waited on need connections too), at most 32. None
    on glide's one multiplexed connection, where a blocked read stalls every other command:
    its waiters poll."""
    if _glide_facade(client):
        return 0
    pool_size = getattr(getattr(client, "connection_pool", None), "max_connections", None)
    if not isinstance(pool_size, int):
        return 32
    return max(1, min(32, pool_size // 4))


def _block_ms(lease_left: float, deadline: float, cap: float) -> int:
    """How long to block for an in-flight claim to end, in whole ms; 0: stop waiting.

    Never past the caller's wait, nor much past the lease (if it lapses without a completion,
    the re-claim takes over), nor ``cap``. At least 1 ms: XREAD BLOCK 0 would block forever.
    """
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return 0
    return max(1, math.ceil(min(remaining, lease_left + _LAPSE_MARGIN, cap) * 1000))


def _next_delay(previous: float, deadline: float) -> float:
    """Backoff while polling a record in flight, or retrying a completion, up to ``deadline``."""
    return next_poll_delay(previous, deadline - time.monotonic())


class StoreBase:
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

    #: Whether the store awaits its client (AsyncRedisStore) or calls it (RedisStore).
    awaits_client: ClassVar[bool]
    #: Writes the uncertain outcomes off the caller's path (each store's own keeper).
    _keeper: Any

    def __init__(self, client: Any, policy: Policy | None) -> None:
        if is_glide(client):  # AsyncRedisStore wraps one before it gets here (_glide)
            raise ConfigurationError(
                "valkey-glide's clients are asyncio: use AsyncRedisStore with a glide client, "
                "or RedisStore with a redis-py or valkey-py one"
            )
        kind = asyncio_client(client)
        if kind is not None and kind != self.awaits_client:
            # Caught here, not at the first call: an asyncio client under RedisStore answers
            # coroutines ("unexpected reply"), a sync one under AsyncRedisStore a TypeError.
            got = f"{type(client).__module__}.{type(client).__qualname__}"
            if self.awaits_client:
                raise ConfigurationError(
                    f"AsyncRedisStore needs an asyncio client, got a sync one ({got}): use "
                    "RedisStore with it, or pass a redis.asyncio / valkey.asyncio client"
                )
            raise ConfigurationError(
                f"RedisStore needs a sync client, got an asyncio one ({got}): use "
                "AsyncRedisStore with it, or pass a redis.Redis / valkey.Valkey (or cluster) client"
            )
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
        _check_durability(self.policy, client)
        self._errors, self._noscript, self._moving = _backend_errors(client)
        self._scripts = {name: client.register_script(text) for name, text in SCRIPTS.items()}
        self._leases = LeaseTable()
        # (record key, owner) of the claims whose record was found lost (by the heartbeat, or
        # by complete.lua), until the guard or adapter asks (_record_lost): its lease_lost then
        # names the cause, even where the script cannot tell (a duplicate completed meanwhile).
        self._records_lost: set[tuple[str, str]] = set()

    def keep_uncertain(
        self,
        kind: UncertainKind,
        source: Reporting,
        fence: int | None = None,
        detail: str = "",
        steps: tuple[str, ...] = (),
    ) -> None:
        """Append an uncertain outcome to its prefix's stream (see ``idemkey.store.uncertain``),
        off the caller's path: returns at once and never raises; a write that fails is lost.
        The guards and adapters call it, each the ``source`` that names its record, scope,
        method and route; the stream lives as long as the store's records."""
        try:
            record = source.record
            prefix = record_prefix(record.record_key)
            fields = entry_fields(
                kind, record.digest, source.scope, source.method, source.route, fence, detail, steps
            )
            self._keeper.keep(uncertain_stream(prefix), fields, self.policy.ttl_ms)
        except Exception as exc:  # never the request's problem
            logger.debug("idemkey could not keep an uncertain outcome: %s", exc)

    def _named(self, key: str | Record, scope: str, method: str, route: str) -> Record:
        """``key`` as a record: as given, or named as the adapters name it; a key or a part
        no adapter would name is refused, typed (it was an AttributeError from the digest)."""
        if isinstance(key, Record):
            return key
        if not isinstance(key, str) or not key:
            raise InvalidKeyError(f"a key must be a non-empty str, not {key!r:.40}")
        for name, part in (("scope", scope), ("method", method), ("route", route)):
            if not isinstance(part, str):
                raise ConfigurationError(f"{name} must be a str, not {type(part).__name__}")
        try:
            return record_for(self.policy.prefix, scope, method, route, key)
        except UnicodeEncodeError as exc:  # a lone surrogate where the digest needs UTF-8
            raise ConfigurationError(f"a record's name must be UTF-8 text: {exc}") from None

    def _completion_deadline(self, lease: Lease | None, started: float) -> float:
        """When a completion that started at ``started`` (monotonic) stops retrying."""
        lease_ms = lease.lease_ms if lease is not None else self.policy.lease_ms
        return started + min(self.completion_retry, lease_ms / 3000)

    def _check_targets(self) -> list[tuple[str, dict[str, Any]]]:
        """(label, execute_command kwargs) per server to check: each primary of a cluster."""
        primaries = getattr(self.client, "get_primaries", None)
        if primaries is None:
            return [("", {})]
        return [(node.name, {"target_nodes": node}) for node in primaries()]

    def _store_error(self, name: str, exc: BaseException) -> StoreError:
        return StoreError(f"Redis failed during {name}: {type(exc).__name__}: {exc}")

    def _refused(self, record: Record, owner: str, reply: object) -> bool:
        """A complete or release was not stored: keep whether complete.lua said the record was
        lost, for ``_record_lost``. Returns False (the answer to the caller)."""
        if reply == RECORD_LOST:
            self._note_lost(record, owner)
        return False

    def _note_lost(self, record: Record, owner: str) -> None:
        lost = self._records_lost
        if len(lost) >= _MAX_LOST_NOTES:  # nobody asks (the extension API): stay bounded
            lost.clear()
        lost.add((record.record_key, owner))

    def _record_lost(self, record: Record, owner: str) -> bool:
        """Whether the claim whose complete or release was just refused lost its record
        (evicted, deleted) rather than being taken over: complete.lua said so, or the
        heartbeat found it lost. Asked once per refusal, by the guards and adapters, to name
        the cause in their ``lease_lost``; the answer is then forgotten."""
        lost = self._records_lost
        if (record.record_key, owner) not in lost:
            return False
        lost.discard((record.record_key, owner))
        return True

    def _renewal_news(
        self, lease: Lease, reply: int | StoreError, failures: int, lost: bool
    ) -> Callable[[], None] | None:
        """What the heartbeat reports of a renewal's answer (``reply``; ``failures``: the
        lease's failed renewals in a row before it, ``lost``: the lease was lost just now), as
        a call it makes off its renewal loop, where an ``on_event`` hook or a log handler that
        is slow cannot delay the other claims' renewals. None: nothing to report.

        One WARNING per lease when its renewals start failing (Redis down), the next failures at
        DEBUG, one INFO line when it is renewed again: not a WARNING per failed renewal.
        """
        if lost:
            if reply == RECORD_LOST:
                # Noted now, not when reported: its guard asks once its completion is refused.
                self._note_lost(lease.record, lease.owner)
            return partial(self._lease_lost, lease, reply == RECORD_LOST)
        if not self._leases.holds(lease):  # completed meanwhile: nothing to say
            return None
        after = self._leases.failures(lease)
        if isinstance(reply, StoreError):
            if failures == 0:
                return partial(
                    logger.warning,
                    "idemkey heartbeat could not renew a lease: %s (retried every %g s; "
                    "further failures of this lease are logged at DEBUG)",
                    reply,
                    lease.lease_ms / 1000 / _RETRY_FRACTION,
                    extra={"idemkey_event": "store_error", "idemkey_record": lease.record.digest},
                )
            if not logger.isEnabledFor(DEBUG):
                return None
            return partial(
                logger.debug,
                "idemkey heartbeat could not renew a lease, %d times in a row: %s",
                after,
                reply,
                extra={"idemkey_record": lease.record.digest},
            )
        if failures and after == 0:
            return partial(
                logger.info,
                "idemkey heartbeat renewed a lease again, after %d failed renewals",
                failures,
                extra={"idemkey_record": lease.record.digest},
            )
        return None

    def _lease_lost(self, lease: Lease, record_lost: bool) -> None:
        """A renewal was refused: the heartbeat stopped renewing ``lease``.

        Taken over: INFO, not an event; the guard or adapter holding this claim reports the
        loss once, with its route and scope, when its complete or release is refused. The
        record lost (evicted, deleted): a ``record_lost`` event to the store's hook and a
        WARNING now, as a server that evicts records is a setting to fix and the request may
        run for long before its completion is refused (that refusal is its ``lease_lost``).
        """
        if record_lost:
            report(
                self.policy.on_event,
                "record_lost",
                lease.record,
                "",
                "",
                "",
                lease.fence,
                RECORD_LOST_DETAIL,
            )
            return
        logger.info(
            "idemkey heartbeat: a lease was taken over; renewal stopped",
            extra={"idemkey_event": "lease_lost", "idemkey_record": lease.record.digest},
        )
