"""What asyncio code does differently from threads; hand-written, twin of ``_sync_runtime``.

Generated sync files import ``_sync_runtime`` where their async source imports this module
(scripts/unasync.py maps ``_async_<name>`` to ``_sync_<name>``), so both must export the same
names: ``Cancelled``, ``sleep``, ``detach``, ``uncancellable``, ``discover`` and
``send_with_wait``.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ..events import logger
from ..policy import Replicas

__all__ = [
    "Cancelled",
    "detach",
    "discover",
    "send_with_wait",
    "sleep",
    "uncancellable",
]

T = TypeVar("T")

sleep = asyncio.sleep
#: What a cancelled task gets at its await: the write it was waiting on may or may not have
#: been applied, so ``except Cancelled`` clauses finish or undo it with :func:`detach`.
Cancelled = asyncio.CancelledError

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
