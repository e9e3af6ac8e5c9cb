"""RedisStore and AsyncRedisStore: the only code that talks to Redis.

Each method sends one script call and hands the reply to ``idemkey._core``; every decision
lives there. One source serves both stores:

* ``_async_store.py``: AsyncRedisStore, the source.
* ``_sync_store.py``: RedisStore, generated from it by ``scripts/unasync.py``; never edited.
* ``_async_runtime.py`` / ``_sync_runtime.py``: what a task and a thread do differently
  (sleeping, cancellation shielding, EVALSHA + WAIT on one connection); hand-written.
* ``_async_heartbeat.py`` / ``_sync_heartbeat.py``: the lease-renewing task / thread.
* ``_async_wakeup.py`` / ``_sync_wakeup.py``: one blocking read per waited-on record, shared
  by the tasks / threads that wait on it; hand-written.
* ``_base.py``: what both share (client check, scripts, error classes, delays).
* ``_durable.py``, ``_server_check.py``: I/O-free decisions for ``Policy.durability`` and
  for ``check()``.
* ``_leases.py``: the leases a store holds and renews; ``diagnostics.py``: the server checks
  behind ``check()`` and ``idemkey doctor``.
"""

from __future__ import annotations

from ._async_runtime import detach, uncancellable
from ._async_store import AsyncRedisStore
from ._base import SCRIPT_NAMES, SCRIPTS
from ._server_check import server_warnings
from ._sync_store import RedisStore

__all__ = [
    "SCRIPTS",
    "SCRIPT_NAMES",
    "AsyncRedisStore",
    "RedisStore",
    "detach",
    "server_warnings",
    "uncancellable",
]
