"""A record's lease as a test reads and breaks it, on a sync or asyncio client alike.

Since 0.3 the lease is no key of its own: it is the record's field ``lease``, the claim's
deadline in Unix ms on the server's clock (claim.lua), so what a test once read as the lock's
``PTTL`` or ``GET`` is read here from the hash and the server's ``TIME``. A claim written by
0.2 kept it in the string ``<record>:lock``: :func:`lease_left` reads that too, as the store
does (``idemkey.store.status.lease_left_ms``).

Every function takes a redis-py client of either kind; on an asyncio one, await the result.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from idemkey.records import Record
from idemkey.store.status import lease_left_ms, server_ms

T = TypeVar("T")

__all__ = ["lapse", "lease_holder", "lease_left"]

# Lapse a live claim's lease now, as if its owner had crashed long enough ago: the deadline is
# moved to the past, the owner and everything else stay. KEYS[1] record hash. Reply: 1 lapsed,
# 0 no claim in progress (nothing written).
_LAPSE: str = """
if redis.call("HGET", KEYS[1], "state") ~= "in_progress" then
  return 0
end
redis.call("HSET", KEYS[1], "lease", 1)
redis.pcall("DEL", KEYS[1] .. ":lock")
return 1
"""


def _then(value: Any, after: Callable[[Any], T]) -> T | Awaitable[T]:
    """``after(value)``, awaiting ``value`` first when an asyncio client gave a coroutine."""
    if inspect.isawaitable(value):

        async def awaited() -> T:
            return after(await value)

        return awaited()
    return after(value)


def _read(client: Any, record: Record) -> Any:
    pipe = client.pipeline(transaction=False)
    pipe.hmget(record.record_key, "lease", "state", "owner")
    pipe.pttl(record.lock_key)
    pipe.execute_command("TIME")
    return pipe.execute()


def lease_left(client: Any, record: Record) -> int | Awaitable[int]:
    """Milliseconds left of the record's lease, -2 when no live claim holds it (the old lock's
    ``PTTL`` said -2 for a lock that was gone)."""

    def left(replies: list[Any]) -> int:
        (deadline, state, _owner), legacy, now = replies
        if state != b"in_progress":
            return -2
        return lease_left_ms(deadline, legacy, server_ms(now))

    return _then(_read(client, record), left)


def lease_holder(client: Any, record: Record) -> bytes | Awaitable[bytes | None] | None:
    """The owner whose live claim holds the record, None when none does (what ``GET`` of the
    old lock answered)."""

    def holder(replies: list[Any]) -> bytes | None:
        (deadline, state, owner), legacy, now = replies
        if state != b"in_progress" or lease_left_ms(deadline, legacy, server_ms(now)) <= 0:
            return None
        return owner if isinstance(owner, bytes) else None

    return _then(_read(client, record), holder)


def lapse(client: Any, record: Record) -> int | Awaitable[int]:
    """Let the record's lease lapse now (1), as a crashed owner's does; 0 when no claim is in
    progress. Unlike a real lapse nothing waits: the next claim takes the record over."""
    return _then(client.eval(_LAPSE, 1, record.record_key), int)
