"""A store over ``redis.sentinel.Sentinel(...).master_for(...)``: one master, one replica, one
sentinel, all started here on free ports. The store works through the sentinel-managed client,
durable writes are confirmed by the replica, and after the master is killed the sentinel
promotes the replica and requests resume on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.sentinel import Sentinel

from idemkey import Policy, RedisStore, Replicas, StoreError, guard
from tests._servers import RedisServer, no_retry, wait_until

pytestmark = pytest.mark.redis

SERVICE = "idemkey-test"


class SentinelServer(RedisServer):
    """``redis-server sentinel.conf --sentinel`` watching one master, quorum 1."""

    def __init__(self, master: RedisServer, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conf = Path(self.dir) / "sentinel.conf"
        self.conf.write_text(
            f"sentinel monitor {SERVICE} {master.host} {master.port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
        )

    def _command(self) -> list[str]:
        # The config file comes first (sentinel mode rewrites it, so it lives in our dir);
        # --save and --appendonly are not sentinel options.
        executable, *options = super()._command()
        kept = [
            arg
            for i, arg in enumerate(options)
            if arg not in ("--save", "--appendonly")
            and (i == 0 or options[i - 1] not in ("--save", "--appendonly"))
        ]
        return [executable, str(self.conf), "--sentinel", *kept]


@pytest.fixture
def sentinel_setup(
    redis_server_factory: Callable[..., RedisServer],
) -> Iterator[tuple[RedisServer, RedisServer, SentinelServer]]:
    master = redis_server_factory(["--repl-diskless-sync-delay", "0"])
    replica = redis_server_factory(
        ["--replicaof", master.host, str(master.port), "--repl-diskless-sync-delay", "0"]
    )
    probe = replica.client(socket_timeout=2, retry=no_retry())
    try:
        wait_until(lambda: probe.info("replication").get("master_link_status") == "up", 15, "sync")
    finally:
        probe.close()
    sentinel = SentinelServer(master)
    sentinel.start()
    try:
        # The sentinel has found the replica (it asks the master every 10 s at first).
        sentinel_client = sentinel.client(socket_timeout=2, retry=no_retry())
        wait_until(
            lambda: sentinel_client.sentinel_slaves(SERVICE),
            30,
            "the sentinel to discover the replica",
        )
        sentinel_client.close()
        yield master, replica, sentinel
    finally:
        sentinel.close()


def sentinel_store(sentinel: SentinelServer, **policy: Any) -> tuple[Sentinel, RedisStore]:
    watcher = Sentinel(
        [(sentinel.host, sentinel.port)],
        socket_timeout=1.0,
        sentinel_kwargs={"socket_timeout": 1.0},
    )
    client = watcher.master_for(SERVICE, socket_timeout=1.0, socket_connect_timeout=0.5)
    return watcher, RedisStore(client, Policy(**policy))


def test_a_store_over_a_sentinel_master_works_and_survives_a_failover(
    sentinel_setup: tuple[RedisServer, RedisServer, SentinelServer], prefix: str
) -> None:
    master, replica, sentinel = sentinel_setup
    watcher, store = sentinel_store(sentinel, prefix=prefix)
    # Its own client: a WAIT of 2 s (generous: under two suites at once 0.5 s was missed) needs
    # a socket timeout past it (the store refuses one within 0.2 s of the read's).
    durable_client = watcher.master_for(SERVICE, socket_timeout=5.0, socket_connect_timeout=0.5)
    durable = RedisStore(durable_client, Policy(prefix=prefix, durability=Replicas(1, 2.0)))
    try:
        for i in range(20):
            with guard(store, f"job-{i}", payload=i) as call:
                call.save(i)
        with guard(durable, "durable", payload=b"") as call:
            call.save("on the replica too")
        replica_client = replica.client(socket_timeout=2, retry=no_retry())
        assert replica_client.dbsize() >= 21  # durable: WAIT confirmed it; others replicated
        replica_client.close()

        master.kill()

        def resumed() -> bool:
            with guard(store, "after-failover", payload=b"") as call:
                if not call.replayed:
                    call.save("on the promoted replica")
            return True

        wait_until(resumed, 30, "the sentinel to promote the replica", ignore=(StoreError,))
        promoted = replica.client(socket_timeout=2, retry=no_retry())
        assert promoted.info("replication")["role"] == "master"
        promoted.close()
        # What was acknowledged with durability survived the failover.
        with guard(store, "durable", payload=b"") as call:
            assert call.replayed
            assert call.result == "on the replica too"
    finally:
        store.close()
        durable.close()
        with contextlib.suppress(redis.RedisError):
            store.client.close()
        with contextlib.suppress(redis.RedisError):
            durable_client.close()
