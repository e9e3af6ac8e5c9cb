"""What asyncio code does differently from threads; hand-written, twin of ``_sync_runtime``.

Generated sync files import ``_sync_runtime`` where their async source imports this module
(scripts/unasync.py maps ``_async_<name>`` to ``_sync_<name>``), so both must export the same
names: ``Cancelled``, ``sleep``, ``detach``, ``finish``, ``uncancellable``, ``discover``,
``send_with_wait``, ``LoopWatch`` and ``drop_other_loops``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import socket
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

from ...errors import ConfigurationError
from ...events import logger
from ...policy import Replicas
from .._backend import SCRIPT_KEYS, client_module

__all__ = [
    "Cancelled",
    "LoopWatch",
    "detach",
    "discover",
    "drop_other_loops",
    "finish",
    "send_with_wait",
    "sleep",
    "uncancellable",
]

T = TypeVar("T")

sleep = asyncio.sleep
#: What a cancelled task gets at its await: the write it was waiting on may or may not have
#: been applied, so ``except Cancelled`` clauses finish or undo it with :func:`finish`.
Cancelled = asyncio.CancelledError

# Writes that a cancellation cut off, finished in their own task; held here because the event
# loop keeps only weak references to tasks.
_detached: set[asyncio.Task[Any]] = set()

#: Seconds a cancelled caller waits for its write (:func:`finish`) past the write's own
#: retrying: the round trip of its last attempt, on a server that answers.
FINISH_WAIT: Final = 1.0


def detach(write: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Run a store write to its end in a task of its own, whatever happens to the caller."""
    task = asyncio.get_running_loop().create_task(write)
    _detached.add(task)
    task.add_done_callback(_detached_done)
    return task


async def finish(write: Coroutine[Any, Any, Any], retrying: float = 0.0) -> None:
    """:func:`detach` the write of a caller whose cancel came while it was on its way, and wait
    for it, up to ``retrying`` (how long the write itself may retry) and FINISH_WAIT seconds.

    A task alone is not enough: ``asyncio.run`` (Ctrl-C, or its main task ending) cancels
    every task left, a write just detached too, before it went out. The caller's cancel has
    been delivered, so it can wait; cancelled again, it stops waiting (quietly: it re-raises
    its first cancel) and the write goes on in its task.
    """
    task = detach(write)
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait((task,), timeout=retrying + FINISH_WAIT)


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


async def discover(client: Any) -> None:
    """Let an asyncio cluster client learn its nodes: it knows them only after initialize()."""
    if hasattr(client, "get_primaries"):
        await client.initialize()


async def send_with_wait(
    client: Any, keys_and_args: tuple[str | bytes | int, ...], sha: str, durability: Replicas
) -> list[Any]:
    """EVALSHA + WAIT sent on one connection (the key's master, in a cluster); their replies,
    errors included as values."""
    commands = (
        ("EVALSHA", sha, SCRIPT_KEYS, *keys_and_args),
        ("WAIT", durability.count, durability.timeout_ms),
    )
    if hasattr(client, "get_node_from_key"):
        # The asyncio RedisCluster has no per-node client: its node sends a pipeline of
        # PipelineCommand on one of its connections (what its ClusterPipeline does).
        await client.initialize()  # a no-op once the topology is known
        node = client.get_node_from_key(keys_and_args[0])
        pipeline_command = importlib.import_module(client_module(client)).PipelineCommand
        queued = [pipeline_command(i, *command) for i, command in enumerate(commands)]
        await node.execute_pipeline(queued)
        return [command.result for command in queued]
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return list(await pipe.execute(raise_on_error=False))


class LoopWatch:
    """The event loop a store last sent a command from.

    A worker that runs each job with ``asyncio.run()`` uses one store, and one client, from a
    new event loop each time; the client's pooled connections still belong to the loop that
    made them, which is closed by then. redis-py sends on such a connection (the write goes
    out: Redis applies it), then fails to read the reply with a bare ``RuntimeError`` ("Event
    loop is closed"). So the first command from another loop drops those connections first.
    """

    __slots__ = ("_loop",)

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def moved(self) -> bool:
        """Whether this call runs on another event loop than the last one (the first: True)."""
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return False
        self._loop = loop
        return True

    def forget(self) -> None:
        """The next call is asked again (:func:`drop_other_loops` refused this loop)."""
        self._loop = None


async def drop_other_loops(client: Any, watch: LoopWatch | None = None) -> None:
    """Disconnect ``client``'s connections made on an event loop that no longer runs (closed, or
    stopped), so its pool makes new ones on this one. Connections of this loop, or of a loop
    still running in another thread, are left alone."""
    here = asyncio.get_running_loop()
    glide_loop = getattr(getattr(client, "glide", None), "_loop", None)
    if glide_loop is not None and glide_loop is not here and not glide_loop.is_running():
        # valkey-glide answers on the loop its client was made on: from a loop that has gone
        # every reply is lost, and the call waited forever, past its request timeout. Every
        # later call on this loop is refused too (``watch`` forgets it).
        if watch is not None:
            watch.forget()
        raise ConfigurationError(
            "a valkey-glide client answers only on the event loop it was made on, and that "
            "loop has ended: make the glide client and its AsyncRedisStore in each loop "
            "(asyncio.run) that uses them"
        )
    for connection in _connections(client):
        writer = getattr(connection, "_writer", None)
        loop = getattr(writer, "_loop", None)  # asyncio.StreamWriter's loop
        if writer is None or loop is None or loop is here or loop.is_running():
            continue
        transport = writer.transport
        # redis-py's own disconnect clears the connection's state; the transport's close
        # raises on a closed loop (it schedules its socket's closing there), so close that here.
        with contextlib.suppress(RuntimeError, OSError):
            await connection.disconnect(nowait=True)
        _close_socket(transport)


def _connections(client: Any) -> list[Any]:
    """Every connection object of a redis-py (or valkey) asyncio client, idle or in use."""
    found: list[Any] = []
    pool = getattr(client, "connection_pool", None)
    for name in ("_available_connections", "_in_use_connections"):
        found.extend(getattr(pool, name, ()))
    single = getattr(client, "connection", None)  # single_connection_client=True
    if single is not None and single not in found:
        found.append(single)
    nodes = getattr(getattr(client, "nodes_manager", None), "nodes_cache", None)
    if isinstance(nodes, dict):  # RedisCluster: each node keeps its own connections
        for node in nodes.values():
            found.extend(getattr(node, "_connections", ()))
    return found


def _close_socket(transport: Any) -> None:
    """Close the socket of a transport whose loop will never run its close callback.

    CPython's selector transports close their socket in a callback on their loop; left open,
    the socket lingers until garbage collection, which warns "unclosed transport".
    """
    sock = getattr(transport, "_sock", None)
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.close()
        transport._sock = None
