"""Real eviction of a running request's keys, for the eviction tests (guard and HTTP).

A real ``redis-server`` with ``maxmemory`` and ``maxmemory-policy volatile-lru``, as a shared
cache often runs, is filled with keys that have no TTL (a cache that never expires): under
``volatile-*`` only keys with a TTL can be evicted, so the keys eviction takes are exactly
idemkey's: the running request's record, its lease a field of it.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from idemkey.records import Record
from tests._servers import RedisServer, wait_until


def evicting_server(factory: Callable[..., RedisServer]) -> RedisServer:
    """A private server with ``maxmemory-policy volatile-lru`` (``maxmemory`` is set later,
    just above what it uses, by :func:`evict_every_key_with_a_ttl`)."""
    return factory(["--maxmemory-policy", "volatile-lru"])


def evict_every_key_with_a_ttl(admin: redis.Redis, record: Record, filler: str = "cache:{}") -> int:
    """Fill the server past ``maxmemory`` with keys that have no TTL until eviction has taken
    the record (and its lease with it), then free the filler (as the cache's owner would, so
    that new claims are accepted again). Returns the number of keys evicted.

    ``filler`` names the filler keys (``{}`` is their number): on a cluster node, a name with
    the record's hash tag keeps them on the record's node."""
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", used + 512 * 1024)
    chunk, fillers = b"x" * (64 * 1024), []

    def evicted() -> bool:
        name = filler.replace("{}", str(len(fillers)))
        try:
            admin.set(name, chunk)  # no TTL: never a candidate under volatile-lru
            fillers.append(name)
        except redis.exceptions.OutOfMemoryError:  # nothing with a TTL is left to evict
            pass
        return admin.exists(record.key) == 0

    wait_until(evicted, timeout=10, message="eviction to take the record")
    admin.delete(*fillers)
    return int(admin.info("stats")["evicted_keys"])
