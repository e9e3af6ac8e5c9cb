"""What a task and a thread do differently, side by side: each ``_async_<x>`` module has a
hand-written ``_sync_<x>`` twin that exports the same names. A generated sync file imports the
``_sync_`` one where its asyncio source imports the ``_async_`` one (scripts/unasync.py).

* ``_async_runtime`` / ``_sync_runtime``: sleeping, cancellation shielding, detached tasks,
  EVALSHA + WAIT on one connection.
* ``_async_heartbeat`` / ``_sync_heartbeat``: the lease-renewing task / thread.
* ``_async_wakeup`` / ``_sync_wakeup``: one blocking read per waited-on record, shared by the
  tasks / threads that wait on it.
* ``_async_shield`` / ``_sync_shield``: a settling write that outlives a cancelled request, or
  runs at once where nothing is cancelled.

``_async_append`` is no such pair: the keepers' one retry loop, its sync twin generated.
"""
