"""How many round trips each case costs, and what the server executed for it.

Two counts per Redis-backed case, from a separate short run before timing:

* round trips: packets of commands the client sent (a pipeline counts once), counted by a
  redis-py connection subclass; only clients made for this run count.
* ``INFO commandstats`` deltas on the server: ``evalsha`` calls per call, and every command
  (including those a script runs inside Redis). Exact on the suite's private server; on a
  shared server (``--redis-url``) other clients' traffic may add to it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio

from .cases import Case

__all__ = ["Counter", "count_round_trips", "counting_clients"]


class Counter:
    sends = 0


def counting_clients(url: str) -> tuple[Any, Any, type[Counter]]:
    """A sync and an async client whose connections count every packet they send."""

    class SyncConnection(redis.Connection):
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            Counter.sends += 1
            super().send_packed_command(command, check_health)

    class AsyncConnection(redis.asyncio.Connection):
        async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            Counter.sends += 1
            await super().send_packed_command(command, check_health)

    sync_pool = redis.ConnectionPool.from_url(url, connection_class=SyncConnection)
    async_pool = redis.asyncio.ConnectionPool.from_url(url, connection_class=AsyncConnection)
    # from_pool: the clients own their pools and disconnect them when closed.
    return redis.Redis.from_pool(sync_pool), redis.asyncio.Redis.from_pool(async_pool), Counter


def _commandstats(client: Any) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def count_round_trips(
    cases: Sequence[Case], admin: Any, calls: int, first_index: int = 0
) -> dict[str, dict[str, Any]]:
    """Run each case once, then ``calls`` times counted; per call: round trips, evalsha calls
    and server commands. Uses indices ``first_index`` to ``first_index + calls``."""
    out: dict[str, dict[str, Any]] = {}
    for case in cases:
        warm = case.run(first_index)  # loads scripts, opens connections: not counted
        if inspect.isawaitable(warm):
            await warm
        before_sends = Counter.sends
        before = _commandstats(admin)
        for i in range(first_index + 1, first_index + 1 + calls):
            result = case.run(i)
            if inspect.isawaitable(result):
                await result
        sends = Counter.sends - before_sends
        after = _commandstats(admin)
        delta = {k: v - before.get(k, 0) for k, v in after.items() if k != "info"}
        delta = {k: v for k, v in delta.items() if v}
        out[case.name] = {
            "round_trips": sends / calls,
            "evalsha": delta.get("evalsha", 0) / calls,
            "server_commands": {k: v / calls for k, v in sorted(delta.items())},
        }
    return out
