"""The sync side of ``_async_redirect``; hand-written: there is nothing to route.

redis-py's and valkey-py's sync cluster clients take one connection of the importing node and
send ``ASKING`` and the command on it (``RedisCluster._execute_command``), so an ASK redirect is
served as the cluster means it; the sync store keeps the client's own path. This module exists
so the generated sync store imports the same names as its asyncio source.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["ClusterRoute", "route_for"]

_Errors = tuple[type[BaseException], ...]


class ClusterRoute:
    """Never made (see the module's doc); it has the asyncio route's interface."""

    keys: int

    def evalsha(self, sha: str, keys_and_args: tuple[str | bytes | int, ...]) -> Any:
        raise NotImplementedError("the sync cluster clients follow ASK on one connection")


def route_for(
    client: Any, scripts: Mapping[str, Any], handover: _Errors, wait: Callable[[], float]
) -> ClusterRoute | None:
    """None: a sync client's own path follows ASK on one connection."""
    return None
