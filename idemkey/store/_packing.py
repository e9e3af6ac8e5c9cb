"""The lean path's two checks, made once per client and pool: whether a client is eligible
(``lean_eligible``) and which packer writes ``EVALSHA`` byte for byte as the client's own
connection would (``evalsha_packer``, ``pack_evalsha``). No I/O here; used by
``_concurrency/_async_lean`` and its twin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from ._backend import SCRIPT_KEYS, client_module

__all__ = ["Packer", "evalsha_packer", "lean_eligible", "pack_evalsha"]

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
