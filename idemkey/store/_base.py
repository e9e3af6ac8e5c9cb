"""What RedisStore and AsyncRedisStore share: the client check, the scripts, the backend's
error classes, the policy, and the retry delays. No I/O here.

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
from collections.abc import Callable
from importlib.resources import files
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol

if TYPE_CHECKING:
    from .._core import Record

from .._core import RECORD_LOST, next_poll_delay
from ..errors import ConfigurationError, StoreError
from ..events import RECORD_LOST_DETAIL, logger, report
from ..policy import Policy
from ._leases import Lease, LeaseTable

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

_Errors = tuple[type[BaseException], ...]


class Effects(Protocol):
    """Where committed results are found again (``idemkey.contrib.sqlalchemy.Effects``).

    ``find`` answers a claim: ``None`` (no committed row: run), the committed result, or
    ``COMMITTED_ONLY`` (committed with no result recorded). ``record`` writes a result into
    the row a fenced transaction of ``fence`` committed (``step``: a step's row)."""

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


def client_module(client: Any) -> str:
    """The redis-py or valkey-py module the client's class comes from (``"redis.client"``,
    ``"valkey.asyncio.cluster"``, ...), looking through subclasses: an application's own
    ``class Client(valkey.Valkey)`` is valkey-py's, and its errors are valkey-py's."""
    for cls in type(client).__mro__:
        module = cls.__module__
        if module.split(".", 1)[0] in ("redis", "valkey"):
            return module
    return str(type(client).__module__)


def asyncio_client(client: Any) -> bool | None:
    """Whether ``client`` is an asyncio client of redis-py or valkey-py (standalone, cluster,
    sentinel, or a class derived from one: fakeredis's, an application's); None when it comes
    from neither library (glide's facade, a stand-in), which is not checked."""
    module = client_module(client)
    if module.split(".", 1)[0] not in ("redis", "valkey"):
        return None
    return module.split(".")[1:2] == ["asyncio"]


def is_glide(client: Any) -> bool:
    """Whether ``client`` is a valkey-glide client (``glide.GlideClient``, its cluster twin, or
    an application's subclass), told without importing glide (an optional extra)."""
    return any(cls.__module__.split(".", 1)[0] == "glide" for cls in type(client).__mro__)


def _glide_facade(client: Any) -> bool:
    """Whether ``client`` is the store's wrapper of a glide client (``_glide.GlideFacade``)."""
    return getattr(client, "multiplexed", False) is True and hasattr(client, "idemkey_evalsha")


def _backend_errors(client: Any) -> tuple[_Errors, type[BaseException], _Errors]:
    """(errors to wrap as StoreError, the NOSCRIPT error, "slot is moving" errors) of the
    client's library.

    The cluster client raises its topology errors (no reachable node, slots not covered during
    a failover) as a class outside the RedisError tree; they are store errors all the same.
    """
    if _glide_facade(client):  # the facade says its own (``_glide.BACKEND_ERRORS``)
        facade_errors: tuple[_Errors, type[BaseException], _Errors] = client.idemkey_errors
        return facade_errors
    module = client_module(client)
    # Both asyncio cluster clients (valkey-py forked redis-py's) can tear a connection down
    # under a task that is using it while the topology changes (a slot moving, a failover: on
    # every fifth MOVED the client closes all its connections); the task then gets
    # AttributeError ("'NoneType' object has no attribute 'writelines'") or the library's
    # ConnectionError ("Connection closed by server"). Both are retried like a moving slot
    # (sending a script twice with one owner is safe), then a StoreError; a connection that
    # could not be made is not (``_slot_moving``).
    on_asyncio_cluster = module.endswith(".asyncio.cluster")
    if module.startswith("valkey"):
        from valkey.exceptions import ClusterError as ValkeyClusterError
        from valkey.exceptions import ConnectionError as ValkeyConnectionError
        from valkey.exceptions import NoScriptError as ValkeyNoScript
        from valkey.exceptions import TryAgainError as ValkeyTryAgain
        from valkey.exceptions import ValkeyClusterException, ValkeyError

        torn_down: _Errors = (AttributeError, ValkeyConnectionError) if on_asyncio_cluster else ()
        errors: _Errors = (ValkeyError, ValkeyClusterException, OSError, *torn_down)
        return errors, ValkeyNoScript, (ValkeyClusterError, ValkeyTryAgain, *torn_down)
    from redis.exceptions import (
        ClusterError,
        NoScriptError,
        RedisClusterException,
        RedisError,
        TryAgainError,
    )
    from redis.exceptions import ConnectionError as RedisConnectionError

    torn_down = (AttributeError, RedisConnectionError) if on_asyncio_cluster else ()
    return (
        (RedisError, RedisClusterException, OSError, *torn_down),
        NoScriptError,
        (ClusterError, TryAgainError, *torn_down),
    )


#: The keys every script of a record takes: the record's hash alone, its lease a field of it,
#: so a cluster slot being migrated serves each script through ASK (docs/design.md, "One key").
#: Code that splits a script call's ``keys_and_args`` (the glide facade's ``invoke_script``)
#: splits it here.
SCRIPT_KEYS: Final = 1

# redis-py's own cutoff: an argument longer than this is sent as its own chunk, not copied.
_BUFFER_CUTOFF: Final = 6000

# The methods of redis-py's clients the lean path stands in for: a subclass that overrides one
# (a hook, a tracer) gets the plain path, which calls them.
_SYNC_METHODS: Final = (
    "execute_command",
    "_execute_command",
    "_send_command_parse_response",
    "parse_response",
)
_ASYNC_METHODS: Final = (
    "execute_command",
    "_send_command_parse_response",
    "parse_response",
    "initialize",
)


def lean_eligible(client: Any, *, asyncio: bool) -> bool:
    """Whether the lean path (``_concurrency/_async_lean``) does exactly what ``execute_command``
    would for a script call on ``client``: redis-py 8 or later (the connection API it was
    written against and is tested on), its own client class or a subclass that overrides none
    of the command methods, one of its own pools and connection classes (not Sentinel's, not
    fakeredis'), no client-side cache, not a single-connection client, no response callback for
    EVALSHA, and redis-py's OpenTelemetry metrics off (the plain path records them). A cluster
    client, valkey-py and anything else get the plain path."""
    if client_module(client).split(".", 1)[0] != "redis":
        return False
    import redis

    try:
        if int(redis.__version__.split(".", 1)[0]) < 8:
            return False
    except ValueError:
        return False
    if asyncio:
        import redis.asyncio.client as clients
        import redis.asyncio.connection as connections

        methods = _ASYNC_METHODS
        single = getattr(client, "single_connection_client", True)
    else:
        import redis.client as clients  # type: ignore[no-redef]
        import redis.connection as connections  # type: ignore[no-redef]

        methods = _SYNC_METHODS
        single = getattr(client, "_single_connection_client", True)
    base = clients.Redis
    if not isinstance(client, base) or single or getattr(client, "connection", None) is not None:
        return False
    if any(getattr(type(client), name, None) is not getattr(base, name) for name in methods):
        return False
    pool: Any = getattr(client, "connection_pool", None)
    if type(pool) not in (connections.ConnectionPool, connections.BlockingConnectionPool):
        return False
    own = (
        connections.Connection,
        connections.SSLConnection,
        connections.UnixDomainSocketConnection,
    )
    if pool.connection_class not in own or getattr(pool, "cache", None) is not None:
        return False
    if pool.connection_kwargs.get("command_packer") is not None:  # the app's own packer
        return False
    callbacks = getattr(client, "response_callbacks", {})
    if "EVALSHA" in callbacks or b"EVALSHA" in callbacks:
        return False
    try:
        from redis.observability.recorder import is_enabled
    except ImportError:
        return True
    return not is_enabled()


Packer = Callable[[str, tuple[str | bytes | int, ...]], list[bytes]]


#: What the lean path's packer is checked on before it is used: text that is not ASCII (how the
#: client encodes it), bytes, integers of both signs and an argument past the copy cutoff.
_PROBE_ARGS: Final = ("é:{k}", b"\x00\xff", "owner", -1, 0, 86_400_000, b"x" * (_BUFFER_CUTOFF + 1))


def evalsha_packer(pool: Any) -> Packer | None:
    """How the lean path packs ``EVALSHA sha 1 *keys_and_args`` for ``pool``'s connections: the
    first of hiredis' packer (where hiredis is installed) and :func:`pack_evalsha` that writes
    byte for byte what the pool's own connection class packs for a probe command, or None (the
    plain path) where neither does.

    Checked once, here, rather than assumed: which packer a redis-py connection uses, and how
    it encodes text, is redis-py's private behaviour and has changed (8.2's sync connections
    pack text with the client's encoding, 8.1's with hiredis as UTF-8)."""
    try:
        connection = pool.connection_class(**pool.connection_kwargs)
        encode = pool.get_encoder().encode
        sha = "a" * 40
        theirs = b"".join(connection.pack_command("EVALSHA", sha, SCRIPT_KEYS, *_PROBE_ARGS))
    except Exception:  # a connection that cannot pack the probe: nothing to compare with
        return None
    for packer in _packers(encode):
        try:
            if b"".join(packer(sha, _PROBE_ARGS)) == theirs:
                return packer
        except Exception:  # this candidate cannot pack what the client can: try the next
            continue
    return None


def _packers(encode: Any) -> list[Packer]:
    """The lean path's candidate packers, fastest first."""
    candidates: list[Packer] = []
    from redis.utils import HIREDIS_AVAILABLE

    if HIREDIS_AVAILABLE:
        from hiredis import pack_command

        def hiredis_pack(sha: str, keys_and_args: tuple[str | bytes | int, ...]) -> list[bytes]:
            command = ("EVALSHA", sha, SCRIPT_KEYS, *keys_and_args)
            return [pack_command(command)]  # type: ignore[arg-type]

        candidates.append(hiredis_pack)
    heads: dict[tuple[str, int], bytes] = {}

    def python_pack(sha: str, keys_and_args: tuple[str | bytes | int, ...]) -> list[bytes]:
        return pack_evalsha(heads, encode, sha, keys_and_args)

    candidates.append(python_pack)
    return candidates


def pack_evalsha(
    heads: dict[tuple[str, int], bytes],
    encode: Any,
    sha: str,
    keys_and_args: tuple[str | bytes | int, ...],
) -> list[bytes]:
    """``EVALSHA sha 1 *keys_and_args`` in RESP, as redis-py's packer writes it: the head
    (array length, command, sha, key count) packed once per script and argument count and kept
    in ``heads``, each argument encoded with the client's ``encode``."""
    head = heads.get((sha, len(keys_and_args)))
    if head is None:
        count, digest = len(keys_and_args) + 3, sha.encode()
        head = b"*%d\r\n$7\r\nEVALSHA\r\n$%d\r\n%s\r\n$1\r\n%d\r\n" % (
            count,
            len(digest),
            digest,
            SCRIPT_KEYS,
        )
        heads[(sha, len(keys_and_args))] = head
    chunks: list[bytes] = []
    buffer = [head]
    for arg in keys_and_args:
        value = encode(arg)
        if len(value) > _BUFFER_CUTOFF:  # a large response body: sent as it is, not copied
            buffer.append(b"$%d\r\n" % len(value))
            chunks.append(b"".join(buffer))
            chunks.append(value)
            buffer = [b"\r\n"]
        else:
            buffer += (b"$%d\r\n" % len(value), value, b"\r\n")
    chunks.append(b"".join(buffer))
    return chunks


def _never_connected(exc: BaseException) -> bool:
    """Whether ``exc`` is a connection that could not be made (refused, unreachable, a connect
    timeout), not one that closed under a command: nothing reached Redis, and the client's own
    retries already tried again, so one more send would only double the wait."""
    if "connecting to" in str(exc):  # redis-py's and valkey-py's message for a failed connect
        return True
    cause = exc.__cause__ or exc.__context__
    return isinstance(cause, ConnectionRefusedError)


def _dropped_errors(client: Any) -> _Errors:
    """The errors of a connection that closed under a command (a server restart, a reset): the
    client's ``ConnectionError`` (its subclasses included) and the builtin one. Not timeouts:
    sending again after one would double the wait on a server that does not answer."""
    if _glide_facade(client):  # ``_glide.DROPPED_ERRORS``
        dropped: _Errors = client.idemkey_dropped_errors
        return dropped
    if client_module(client).startswith("valkey"):
        from valkey.exceptions import ConnectionError as ValkeyConnectionError

        return (ValkeyConnectionError, ConnectionError)
    from redis.exceptions import ConnectionError as RedisConnectionError

    return (RedisConnectionError, ConnectionError)


def _slot_moving(exc: BaseException, moving: _Errors) -> bool:
    """Whether Redis Cluster refused the script because its slot is being migrated.

    A script touches one key, the record, so a migrating slot serves it through ASK (idemkey
    0.2's scripts touched two, and met TRYAGAIN until the slot had moved). What is left: the
    client's redirect handling gives up after its tries (``ClusterError("TTL exhausted.")``,
    exactly that class; ``ClusterDownError`` is a subclass and means something else), TRYAGAIN
    for a script sent while a node still answers for both sides, or a connection the asyncio
    cluster client tore down under the call (``_backend_errors``). Sending the script again is
    safe: every script answers a re-send by its owner as it answered the first.
    On an asyncio cluster client a connection torn down under the call counts too (see
    ``_backend_errors``), but not one that could not be made.
    """
    return type(exc) in moving and not _never_connected(exc)


def _retry_delay(previous: float, deadline: float) -> float:
    """Backoff while a cluster slot moves or a redirect settles: 10 ms doubling to 100 ms."""
    return min(max(previous * 2, 0.01), 0.1, max(0.0, deadline - time.monotonic()))


# Waiting for an in-flight claim to end (see complete.lua): one XREAD BLOCK on the record's done
# stream at a time per store and record, for at most this long (a waiter that reads the stream
# after its entry expired, 10 s after it was written, re-claims by then), and never so long
# that the client's socket timeout cuts the read as a failure: a server at the default hz 10
# answers a block that timed out up to 100 ms late, and a busy host delays the reply further,
# so at least 200 ms and half the timeout are kept in hand.
_MAX_BLOCK: Final = 5.0
_SERVER_LATENESS: Final = 0.2
# Past this, the lease has lapsed; a little margin so the re-claim finds the lease lapsed.
_LAPSE_MARGIN: Final = 0.002


def _done_stream(record: Record) -> str:
    """The stream complete.lua and release.lua post to when waiters marked the record."""
    return record.record_key + ":done"


def _socket_timeout(client: Any) -> float | None:
    """The client's socket (read) timeout in seconds, None when it has none or it is unknown."""
    for owner in (getattr(client, "connection_pool", None), getattr(client, "nodes_manager", None)):
        kwargs = getattr(owner, "connection_kwargs", None)
        if isinstance(kwargs, dict):
            timeout = kwargs.get("socket_timeout")
            return float(timeout) if timeout else None
    timeout = getattr(client, "connection_kwargs", {}).get("socket_timeout")  # asyncio cluster
    return float(timeout) if timeout else None


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
        self._errors, self._noscript, self._moving = _backend_errors(client)
        self._scripts = {name: client.register_script(text) for name, text in SCRIPTS.items()}
        self._leases = LeaseTable()
        # (record key, owner) of the claims whose record was found lost (by the heartbeat, or
        # by complete.lua), until the guard or adapter asks (_record_lost): its lease_lost then
        # names the cause, even where the script cannot tell (a duplicate completed meanwhile).
        self._records_lost: set[tuple[str, str]] = set()

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

    def _lease_lost(self, lease: Lease, record_lost: bool = False) -> None:
        """A renewal was refused: the heartbeat stops renewing ``lease``.

        Taken over: INFO, not an event; the guard or adapter holding this claim reports the
        loss once, with its route and scope, when its complete or release is refused. The
        record lost (evicted, deleted): a ``record_lost`` event to the store's hook and a
        WARNING now, as a server that evicts records is a setting to fix and the request may
        run for long before its completion is refused (that refusal is its ``lease_lost``).
        """
        if record_lost:
            self._note_lost(lease.record, lease.owner)
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
