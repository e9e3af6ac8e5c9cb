"""RedisStore and AsyncRedisStore: the only code that talks to Redis.

Each method sends one script call and hands the reply to ``idemkey._core``; every decision
lives there. One source serves both stores:

* ``_async_store.py``: AsyncRedisStore, the source.
* ``_sync_store.py``: RedisStore, generated from it by ``scripts/unasync.py``; never edited.
* ``_concurrency/``: the hand-written pairs of what a task and a thread do differently
  (runtime, heartbeat, wake-up, shield), side by side.
* ``_base.py``: what both share (client check, scripts, policy, wait delays).
* ``_backend.py``: the client's library told from its class: its error classes, the script
  key count, the retry delay while a slot moves.
* ``_packing.py``: the lean path's eligibility check and its ``EVALSHA`` packer.
* ``_durable.py``, ``_server_check.py``: I/O-free decisions for ``Policy.durability`` and
  for ``check()``.
* ``status.py``, ``_async_status.py`` (and its twin): ``records()`` and ``record()``, the
  status of records read with SCAN.
* ``_glide.py``: the facade that gives AsyncRedisStore a valkey-glide client as the few
  redis-py operations it sends (imported only when such a client is given).
* ``operator.py``: what ``cancel()`` and ``forget()`` answer (:class:`Cancelled`,
  :class:`Forgotten`), decoded from their scripts' replies.
* ``_leases.py``: the leases a store holds and renews; ``diagnostics.py``: the server checks
  behind ``check()`` and ``idemkey doctor``.
"""

from __future__ import annotations

from ._async_store import AsyncRedisStore
from ._base import SCRIPT_NAMES, SCRIPTS
from ._concurrency._async_runtime import detach, uncancellable
from ._server_check import server_warnings
from ._sync_store import RedisStore
from .operator import Cancelled, Forgotten
from .status import STATES, RecordState, RecordStatus

__all__ = [
    "STATES",
    "SCRIPTS",
    "SCRIPT_NAMES",
    "AsyncRedisStore",
    "Cancelled",
    "Forgotten",
    "RecordState",
    "RecordStatus",
    "RedisStore",
    "detach",
    "server_warnings",
    "uncancellable",
]
