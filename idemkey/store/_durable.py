"""Policy.durability, without I/O: what an EVALSHA + WAIT answer means.

Claim, complete and checkpoint are sent as EVALSHA + WAIT in one pipeline, on one connection,
because WAIT counts the replicas that have this connection's writes. Both stores send that pipeline
(``send_with_wait`` in ``_async_runtime`` / ``_sync_runtime``) and act on the decision made here.
A store refuses at construction a ``Replicas`` timeout its client's read timeout would cut short
(``_check_durability``; ``_base._block_cap`` reads the same timeout).
"""

from __future__ import annotations

from typing import Any, Final

from ..errors import ConfigurationError, StoreError
from ..policy import Policy, Replicas

__all__ = []

#: What a server may answer a timed command (WAIT, XREAD BLOCK) past its timeout: at the
#: default hz 10 up to a tick (100 ms) late, and a busy host delays the reply further. Kept in
#: hand under the client's read timeout (WAIT 0.95 s on a 1 s read timed out 9 in 10).
_SERVER_LATENESS: Final = 0.2

# The scripts whose writes wait for replicas.
_DURABLE: Final = frozenset({"claim", "complete", "checkpoint"})
# Replies that mean "not on this node (now)": the cluster client handles them for plain calls,
# the durable path (its own pipeline to the slot's master) retries them. redis-py and valkey
# name them alike.
_REDIRECTS: Final = frozenset(
    {"MovedError", "AskError", "TryAgainError", "ClusterDownError", "MasterDownError"}
)


# Replies that mean "the connection dropped before an answer came". Sent again, like a redirect:
# every durable script answers the same to a re-send by its owner, and WAIT on the new
# connection still covers the first send (a connection that wrote nothing waits for the
# primary's current offset: seen on Redis 7.0). redis-py's sync pipeline re-sends by itself;
# an asyncio cluster node hands the error back, e.g. on a connection to a restarted node.
_DROPPED: Final = frozenset({"ConnectionError", "TimeoutError"})
_SENT_AGAIN_ON: Final = _REDIRECTS | _DROPPED


def _socket_timeout(client: Any) -> float | None:
    """The socket (read) timeout of the client's connections in seconds, None when they have
    none or it is unknown. A client made without one (from_url, a cluster) leaves it out of its
    pool's arguments: its connections take their class's default (none on redis-py 5, 5 s on
    8.2), read once per class from one made and never connected."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:  # a sync cluster: a node's pool, made as it connected (asyncio: none)
        nodes = getattr(getattr(client, "nodes_manager", None), "nodes_cache", None) or {}
        connections = (getattr(node, "redis_connection", None) for node in nodes.values())
        node_pools = (getattr(c, "connection_pool", None) for c in connections)
        pool = next((p for p in node_pools if p is not None), None)
    kwargs = getattr(pool or client, "connection_kwargs", None)  # asyncio cluster: its own
    if not isinstance(kwargs, dict):
        return None
    if "socket_timeout" in kwargs:
        timeout = kwargs["socket_timeout"]
    else:
        timeout = _default_timeout(getattr(pool, "connection_class", None), kwargs)
    return float(timeout) if timeout else None


_DEFAULT_TIMEOUTS: dict[Any, Any] = {}


def _default_timeout(connection_class: Any, kwargs: dict[str, Any]) -> Any:
    """The timeout ``connection_class`` takes when given none (``kwargs`` has none)."""
    if connection_class not in _DEFAULT_TIMEOUTS:
        try:
            _DEFAULT_TIMEOUTS[connection_class] = connection_class(**kwargs).socket_timeout
        except Exception:  # a stand-in client, a class that wants more: unknown
            return None
    return _DEFAULT_TIMEOUTS[connection_class]


def _check_durability(policy: Policy, client: Any) -> None:
    """A ``Replicas`` timeout the client's socket timeout cuts short: with a replica behind,
    every claim's WAIT outlasted the read, the claim timed out after Redis applied it (held
    until its lease lapsed, and redis-py sent the pipeline again, 15 s in all)."""
    durability, timeout = policy.durability, _socket_timeout(client)
    if (
        durability is not None
        and timeout is not None
        and durability.timeout + _SERVER_LATENESS >= timeout
    ):
        raise ConfigurationError(
            f"Replicas(timeout={durability.timeout:g}) must be shorter than the client's "
            f"socket_timeout ({timeout:g} s) by {_SERVER_LATENESS:g} s: WAIT would outlast "
            "the read"
        )


def _wrote(name: str, reply: Any) -> bool:
    """Whether a script reply means the call wrote (or found written, for a checkpoint): a
    claim (``{1, ...}``), a completion (1), a checkpoint (1 or the stored result)."""
    if name == "claim":
        return isinstance(reply, list) and bool(reply) and reply[0] == 1
    if name == "checkpoint":
        return reply == 1 or isinstance(reply, bytes)
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
    try:
        return reply, int(acked)
    except (TypeError, ValueError, OverflowError):  # b"OK", a list, inf: no Redis sends them
        raise StoreError(
            f"Redis answered WAIT during {name} with {acked!r:.60}, not a count of replicas"
        ) from None


# What an EVALSHA + WAIT answer asks of the store's shell (sync or async) next.
_DONE, _LOAD_SCRIPT, _SEND_AGAIN, _UNCONFIRMED = range(4)


def _durable_outcome(
    name: str,
    replies: list[Any],
    noscript: type[BaseException],
    durability: Replicas,
    may_retry: bool,
) -> tuple[int, Any]:
    """Decide on an EVALSHA + WAIT answer, without I/O.

    ``(_DONE, reply)``; ``(_LOAD_SCRIPT, None)``: load the script and send again (only while
    ``may_retry``); ``(_SEND_AGAIN, error)``: the slot is served elsewhere now or the
    connection dropped, so learn the topology and send again, or raise ``error`` when out of
    time; ``(_UNCONFIRMED, error)``: the script wrote but too few replicas have it, so raise
    ``error`` (after releasing a claim). Any other failure raises StoreError.
    """
    reply = replies[0]
    # A redirect is read before WAIT's reply: a node map that went stale in a failover sends to
    # the old master, which comes back as the new one's replica and answers MOVED to the script
    # and an error to WAIT ("cannot be used with replica instances"). Only the topology refresh
    # that a redirect asks for gets the store off that node.
    if type(reply).__name__ in _SENT_AGAIN_ON:
        return _SEND_AGAIN, StoreError(
            f"Redis failed during {name}: {type(reply).__name__}: {reply} (sent again until "
            "the store's slot_moving_wait ran out)"
        )
    if may_retry and isinstance(reply, noscript):
        return _LOAD_SCRIPT, None
    if isinstance(reply, BaseException):
        raise StoreError(f"Redis failed during {name}: {type(reply).__name__}: {reply}") from reply
    try:
        reply, acked = _durable_reply(name, replies)
    except StoreError as error:
        # WAIT failed after the script wrote: as unconfirmed, so a claim is released (its
        # caller is told StoreError and runs nothing) rather than held until its lease lapses.
        if _wrote(name, reply):
            return _UNCONFIRMED, error
        raise
    if _wrote(name, reply) and acked < durability.count:
        return _UNCONFIRMED, _unconfirmed(name, acked, durability)
    return _DONE, reply
