"""Policy(durability=Replicas(n, timeout)) against a real primary and replica.

With durability on, a claim or a completion is acknowledged only once ``n`` replicas confirm it
(Redis WAIT on the script's own connection); otherwise it fails closed: a claim is released and
raises StoreError (503 through an adapter, the handler never runs), a completion raises
StoreError. Reads (a replay) are never refused for want of replicas.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
import redis
from werkzeug.test import Client

from idemkey import (
    AsyncRedisStore,
    ConfigurationError,
    Policy,
    RedisStore,
    StoreError,
    aguard,
    guard,
)
from idemkey._core import Claimed, Replay, record_for
from idemkey.adapters.wsgi import IdempotencyMiddleware
from idemkey.guard import GUARD_METHOD
from idemkey.policy import Replicas
from tests._lease import lease_left
from tests._servers import (
    WAKE_BOUND,
    RedisServer,
    async_wait_until,
    no_async_retry,
    no_retry,
    wait_until,
    write_confirmed,
)

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

pytestmark = pytest.mark.redis

TIMEOUT = 0.5  # seconds a write waits for its replica (generous: the machine may be busy)


def _replication(client: redis.Redis) -> dict[str, Any]:
    info: dict[str, Any] = client.info("replication")
    return info


@pytest.fixture
def pair(
    redis_server_factory: Callable[..., RedisServer],
) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A primary and one replica that is in sync."""
    # No 5 s wait before the first full sync, and no 10 s wait for a lagging replica at
    # shutdown (a test may leave it paused): the fixture stays fast.
    primary = redis_server_factory(["--repl-diskless-sync-delay", "0", "--shutdown-timeout", "0"])
    replica = redis_server_factory(["--replicaof", primary.host, str(primary.port)])
    probe = replica.client(socket_timeout=2, retry=no_retry())
    try:
        wait_until(
            lambda: _replication(probe).get("master_link_status") == "up",
            15,
            "the replica to sync",
        )
    finally:
        probe.close()
    wait_streaming(primary)
    yield primary, replica
    if replica.paused:
        replica.resume()


def wait_streaming(primary: RedisServer) -> None:
    """Wait until the replica acknowledges writes: after a full sync (or a pause) it takes its
    first REPLCONF ACK, up to a second later, before WAIT can count it."""
    client = primary.client(socket_timeout=5, retry=no_retry())
    try:
        wait_until(lambda: write_confirmed(client), 15, "the replica to acknowledge writes")
    finally:
        client.close()


def client_of(server: RedisServer) -> redis.Redis:
    return server.client(socket_timeout=5, socket_connect_timeout=2, retry=no_retry())


def test_an_acknowledged_write_is_already_on_the_replica(
    pair: tuple[RedisServer, RedisServer], prefix: str
) -> None:
    primary, replica = pair
    client, replica_client = client_of(primary), client_of(replica)
    store = RedisStore(client, Policy(prefix=prefix, durability=Replicas(1, TIMEOUT)))
    try:
        for i in range(50):
            record = record_for(prefix, "", GUARD_METHOD, "", f"job-{i}")
            with guard(store, f"job-{i}", payload=i) as call:
                # The claim was confirmed by the replica before the block began...
                assert replica_client.hget(record.key, "state") == b"in_progress"
                call.save(i)
            # ...and the completion before the guard returned. No waiting: WAIT did it.
            assert replica_client.hexists(record.key, "resp")  # complete
        with guard(store, "job-7", payload=7) as call:
            assert call.replayed
            assert call.result == 7
    finally:
        store.close()
        client.close()
        replica_client.close()


def test_a_durable_claim_whose_reply_is_lost_is_released(
    pair: tuple[RedisServer, RedisServer], prefix: str
) -> None:
    """Redis applied the claim and confirmed it, the reply never came back (the read timed
    out): the caller is told StoreError, so nothing runs, and the claim is released at once,
    not held until its lease lapses (every retry a RequestInFlightError meanwhile)."""
    from tests.faults._proxy import FaultProxy

    primary, _replica = pair
    direct = client_of(primary)
    with FaultProxy(primary.host, primary.port) as proxy:
        client = redis.Redis(host=proxy.host, port=proxy.port, socket_timeout=1, retry=no_retry())
        policy = Policy(prefix=prefix, durability=Replicas(1, TIMEOUT), lease=30)
        store = RedisStore(client, policy)
        record = record_for(prefix, "", GUARD_METHOD, "", "job")
        try:
            with guard(store, "warm", payload=b"") as call:  # scripts loaded, pool warm
                call.save(1)
            proxy.delay_replies(3)
            with pytest.raises(StoreError, match="Timeout"), guard(store, "job", payload=b""):
                pytest.fail("the block ran on a claim whose reply was lost")
            assert direct.hget(record.key, "state") is None  # released: a retry may run
            assert lease_left(direct, record) == -2
        finally:
            store.close()
            client.close()
            direct.close()


def test_replicas_waited_longer_than_the_client_reads_are_refused(
    pair: tuple[RedisServer, RedisServer], prefix: str
) -> None:
    client = pair[0].client(socket_timeout=1.0)
    try:
        for timeout in (2.0, 0.95):  # past the read, or too close to it (a server is late)
            with pytest.raises(ConfigurationError, match=r"must be shorter than the client's"):
                RedisStore(client, Policy(prefix=prefix, durability=Replicas(1, timeout)))
        RedisStore(client, Policy(prefix=prefix, durability=Replicas(1, 0.5)))
    finally:
        client.close()


def test_a_claim_no_replica_confirms_fails_closed_and_frees_the_key(
    pair: tuple[RedisServer, RedisServer], prefix: str
) -> None:
    primary, replica = pair
    client = client_of(primary)
    store = RedisStore(client, Policy(prefix=prefix, durability=Replicas(1, TIMEOUT)))
    try:
        with guard(store, "done", payload=b"") as call:
            call.save("kept")
        replica.pause()
        started = time.monotonic()
        with (
            pytest.raises(StoreError, match=r"claim reached 0 of 1 replicas"),
            guard(store, "job", payload=b""),
        ):
            pytest.fail("the block ran on a claim no replica confirmed")
        assert time.monotonic() - started < 5
        record = record_for(prefix, "", GUARD_METHOD, "", "job")
        # Released (only the fence counter stays): a retry may run.
        assert lease_left(client, record) == -2
        assert not client.hexists(record.key, "lease")
        assert client.hget(record.key, "state") is None
        # A replay writes nothing: it is answered (after WAIT's timeout), not refused.
        with guard(store, "done", payload=b"") as call:
            assert call.replayed
            assert call.result == "kept"
        replica.resume()
        wait_streaming(primary)
        with guard(store, "job", payload=b"") as call:
            assert not call.replayed
            call.save("after the replica came back")
    finally:
        store.close()
        client.close()


def test_a_completion_no_replica_confirms_raises_store_error(
    pair: tuple[RedisServer, RedisServer], prefix: str
) -> None:
    primary, replica = pair
    client = client_of(primary)
    store = RedisStore(client, Policy(prefix=prefix, durability=Replicas(1, TIMEOUT)))

    def work_while_the_replica_stalls() -> None:
        with guard(store, "job", payload=b"") as call:
            replica.pause()
            call.save("done")

    try:
        with pytest.raises(StoreError, match=r"complete reached 0 of 1 replicas"):
            work_while_the_replica_stalls()
        # The primary has it (WAIT cannot take a write back); only its durability is unknown.
        record = record_for(prefix, "", GUARD_METHOD, "", "job")
        assert client.hexists(record.key, "resp")  # complete
    finally:
        store.close()
        client.close()


def counting_app() -> tuple[list[int], Any]:
    runs: list[int] = []

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> list[bytes]:
        runs.append(1)
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [b"created"]

    return runs, app


def test_wsgi_answers_503_when_no_replica_confirms_the_claim(
    pair: tuple[RedisServer, RedisServer], prefix: str
) -> None:
    primary, replica = pair
    client = client_of(primary)
    store = RedisStore(client, Policy(prefix=prefix, durability=Replicas(1, TIMEOUT)))
    runs, app = counting_app()
    web = Client(IdempotencyMiddleware(app, store))
    try:
        replica.pause()
        reply = web.post("/charges", data=b"{}", headers={"Idempotency-Key": "k"})
        assert reply.status_code == 503
        assert reply.json["code"] == "store_unavailable"
        assert runs == []
        replica.resume()
        wait_streaming(primary)
        assert web.post("/charges", data=b"{}", headers={"Idempotency-Key": "k"}).status_code == 201
        assert runs == [1]
    finally:
        store.close()
        client.close()


async def test_async_durable_writes(pair: tuple[RedisServer, RedisServer], prefix: str) -> None:
    primary, replica = pair
    client = primary.async_client(socket_timeout=5, retry=no_async_retry())
    replica_client = client_of(replica)
    store = AsyncRedisStore(client, Policy(prefix=prefix, durability=Replicas(1, TIMEOUT)))
    try:
        async with aguard(store, "a", payload=b"") as call:
            call.save("one")
        record = record_for(prefix, "", GUARD_METHOD, "", "a")
        assert replica_client.hexists(record.key, "resp")  # complete
        replica.pause()
        with pytest.raises(StoreError, match="replicas"):
            async with aguard(store, "b", payload=b""):
                pytest.fail("the block ran on a claim no replica confirmed")
        other = record_for(prefix, "", GUARD_METHOD, "", "b")
        assert await lease_left(client, other) == -2
        assert not await client.hexists(other.key, "lease")
        assert await client.hget(other.key, "state") is None
        async with aguard(store, "a", payload=b"") as call:
            assert call.result == "one"
    finally:
        await store.aclose()
        await client.aclose()
        replica_client.close()


def test_durability_asks_for_more_replicas_than_there_are(
    pair: tuple[RedisServer, RedisServer], prefix: str
) -> None:
    primary, _ = pair
    client = client_of(primary)
    store = RedisStore(client, Policy(prefix=prefix, durability=Replicas(2, TIMEOUT)))
    record = record_for(prefix, "", "POST", "/r", "two")
    try:
        with pytest.raises(StoreError, match="1 of 2 replicas"):
            store.claim(record, "fp")
        # Renewals and releases are not replicated-waited (the lease is not worth a WAIT).
        plain = RedisStore(client, Policy(prefix=prefix))
        claim = plain.claim(record, "fp", heartbeat=False)
        assert isinstance(claim, Claimed)
        assert store.renew(record, claim.owner)
        assert store.release(record, claim.owner)
    finally:
        store.close()
        client.close()


async def test_a_durable_waiter_is_woken_by_the_completion(
    pair: tuple[RedisServer, RedisServer], prefix: str
) -> None:
    # The in-flight claim marks the record through EVALSHA + WAIT like any claim; the waiter
    # then blocks on the primary and is woken by the (confirmed) completion.
    primary, _ = pair
    client = primary.async_client(socket_timeout=5, retry=no_async_retry())
    admin = client_of(primary)
    store = AsyncRedisStore(client, Policy(prefix=prefix, durability=Replicas(1, TIMEOUT)))
    record = record_for(prefix, "", "POST", "/w", "k")
    try:
        first = await store.claim(record, "fp")
        assert isinstance(first, Claimed)
        waiter = asyncio.ensure_future(store.claim(record, "fp", wait=10))
        await async_wait_until(
            lambda: int(admin.info("clients")["blocked_clients"]), 10, "the waiter's read"
        )
        assert await store.complete(record, first.owner, b"resp")
        completed = time.monotonic()
        assert await waiter == Replay(b"resp")
        assert time.monotonic() - completed < WAKE_BOUND
    finally:
        await store.aclose()
        await client.aclose()
        admin.close()
