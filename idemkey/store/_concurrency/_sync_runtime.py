"""What threads do differently from asyncio; hand-written, twin of ``_async_runtime``.

The generated sync files call these where their async source awaits the asyncio versions. A
thread is never cancelled between sending a write and reading its reply, so the cancellation
helpers have nothing to shield: the write has already run to its end, inline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from ...policy import Replicas
from .._backend import SCRIPT_KEYS

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

sleep = time.sleep


class Cancelled(BaseException):
    """Never raised: a thread is not cancelled part way through a write.

    The generated code keeps its source's ``except Cancelled`` clauses, which then cost nothing
    (no wrapper around the hot path) and never run.
    """


def detach(done: object) -> None:
    """The sync counterpart of running a write in a task: it already ran, in this thread."""


def finish(done: object, retrying: float = 0.0) -> None:
    """The sync counterpart of running a write in a task and waiting for it: it already ran."""


def uncancellable(write: Callable[[], T]) -> T:
    """``write()``: a thread cannot be cancelled part way."""
    return write()


def discover(client: Any) -> None:
    """Let a sync cluster client learn its nodes again (one CLUSTER SLOTS): it learns them
    when it is made, and after a failover only from a command that a moved shard redirects,
    so a listing would scan a stale set of primaries."""
    nodes = getattr(client, "nodes_manager", None)
    if nodes is not None:
        nodes.initialize()


def send_with_wait(
    client: Any, keys_and_args: tuple[str | bytes | int, ...], sha: str, durability: Replicas
) -> list[Any]:
    """EVALSHA + WAIT sent on one connection (the key's master, in a cluster); their replies,
    errors included as values."""
    if hasattr(client, "get_node_from_key"):  # RedisCluster: that node's own client
        client = client.get_redis_connection(client.get_node_from_key(keys_and_args[0]))
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("EVALSHA", sha, SCRIPT_KEYS, *keys_and_args)
    pipe.execute_command("WAIT", durability.count, durability.timeout_ms)
    return list(pipe.execute(raise_on_error=False))


class LoopWatch:
    """Threads have no event loop: a store's connections never belong to a finished one."""

    __slots__ = ()

    #: Always False. ``bool()`` is False and a C call: every store call asks, and the sync
    #: path costs no Python frame for it (``python -m benchmarks.calls``).
    moved = staticmethod(bool)


def drop_other_loops(client: Any, watch: LoopWatch | None = None) -> None:
    """Nothing to drop (see :class:`LoopWatch`)."""
