"""Faults between idemkey and Redis: late replies, black holes, cut connections, a frozen server.

A :class:`tests.faults._proxy.FaultProxy` sits between the client and a real ``redis-server``,
so a test can make Redis apply a command and lose its answer, or lose the connection in the
middle of a request. Every client has socket timeouts and every wait has a deadline: no test
here can hang.

What users must configure, shown by the first tests: a redis-py client retries a command that
timed out (redis-py 8 default: ``Retry(ExponentialWithJitterBackoff, 10)`` on ConnectionError
and TimeoutError). idemkey's scripts are safe to run twice with the same owner, so that re-send
turns a claim whose reply was lost into ``Claimed``; without retries, the caller gets
``StoreError`` while the claim it lost holds the key until its lease lapses.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry
from werkzeug.test import Client

from idemkey import (
    AsyncRedisStore,
    Event,
    Policy,
    RedisStore,
    StoreError,
    guard,
)
from idemkey._core import Claimed, InFlight, Replay, record_for
from idemkey.adapters.wsgi import IdempotencyMiddleware
from idemkey.guard import GUARD_METHOD
from tests._lease import lease_holder
from tests._servers import no_retry, wait_until
from tests.faults._proxy import FaultProxy

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from tests._servers import ExternalRedis, RedisServer

pytestmark = pytest.mark.redis

SOCKET_TIMEOUT = 0.3
LATE = 1.0  # a reply this late is past SOCKET_TIMEOUT whatever the machine's load


@pytest.fixture
def proxy(redis_server: RedisServer | ExternalRedis) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.host, redis_server.port) as fault_proxy:
        yield fault_proxy


def proxied(proxy: FaultProxy, retries: int) -> redis.Redis:
    retry = Retry(NoBackoff(), retries) if retries else no_retry()
    return redis.Redis(
        host=proxy.host,
        port=proxy.port,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=SOCKET_TIMEOUT,
        retry=retry,
    )


# ---------------------------------------------------------------------------------------------
# A reply lost after Redis applied the command
# ---------------------------------------------------------------------------------------------


def test_a_claim_whose_reply_is_late_comes_back_claimed_on_the_resend(
    proxy: FaultProxy, real_client: redis.Redis, prefix: str
) -> None:
    client = proxied(proxy, retries=2)
    store = RedisStore(client, Policy(prefix=prefix))
    record = record_for(prefix, "", "POST", "/r", "late")
    try:
        client.ping()  # connect first: the delay must hit the claim's reply
        proxy.delay_replies(LATE)
        decision = store.claim(record, "fp", heartbeat=False)
        # The first EVALSHA ran (the record holds our owner's lease); its reply was lost. The
        # re-send on a new connection found our own owner holding it: Claimed, not InFlight.
        assert isinstance(decision, Claimed)
        assert decision.takeover is False
        assert proxy.delayed == 1
        assert proxy.connections >= 2
        # One claim, not two: the re-send answered the first one's fence.
        assert real_client.hget(record.key, "fence") == str(decision.fence).encode()
        assert lease_holder(real_client, record) == decision.owner.encode()
        assert store.complete(record, decision.owner, b"ok")
        assert store.claim(record, "fp") == Replay(b"ok")
    finally:
        store.close()
        client.close()


def test_a_complete_whose_reply_is_late_is_stored_once(
    proxy: FaultProxy, real_client: redis.Redis, prefix: str
) -> None:
    client = proxied(proxy, retries=2)
    store = RedisStore(client, Policy(prefix=prefix))
    record = record_for(prefix, "", "POST", "/r", "late-complete")
    try:
        claim = store.claim(record, "fp", heartbeat=False)
        assert isinstance(claim, Claimed)
        proxy.delay_replies(LATE)
        assert store.complete(record, claim.owner, b"the response")  # re-sent: still ours
        assert proxy.delayed == 1
        assert real_client.hget(record.key, "resp") == b"the response"
        assert store.claim(record, "fp") == Replay(b"the response")
    finally:
        store.close()
        client.close()


def test_a_release_whose_reply_is_late_is_no_false_lease_lost(
    proxy: FaultProxy, real_client: redis.Redis, prefix: str
) -> None:
    """A guarded call that failed releases its record; the release's reply is lost and the
    client re-sends it: the re-send finds the record released by this same owner and answers
    released again, so the guard reports no lease_lost and keeps no uncertain outcome (a false
    alarm: nobody took the record over)."""
    client = proxied(proxy, retries=2)
    events: list[Event] = []
    store = RedisStore(client, Policy(prefix=prefix, on_event=events.append))
    record = record_for(prefix, "", GUARD_METHOD, "", "late-release")
    # A process that has run for a while: its scripts are loaded (else the late reply would
    # be a NOSCRIPT, and the release would first run on the re-send).
    for script in store._scripts.values():
        real_client.script_load(script.script)
    try:

        def declined() -> None:
            with guard(store, "late-release"):
                proxy.delay_replies(LATE)  # the next reply: the release's
                raise ValueError("card declined")

        with pytest.raises(ValueError, match="card declined"):
            declined()
        assert proxy.delayed == 1
        assert proxy.connections >= 2  # sent again on a new connection
        assert [e.kind for e in events] == ["claimed", "released"]
        assert real_client.hget(record.key, "state") is None  # released, once
        with guard(store, "late-release") as again:  # the retry runs afresh
            assert not again.replayed
            again.save("ok")
    finally:
        store.close()  # drains the uncertain outcomes being written
        client.close()
    assert [e.kind for e in events] == ["claimed", "released", "claimed", "completed"]
    reader = RedisStore(real_client, Policy(prefix=prefix))
    assert reader.uncertain() == []


async def test_an_async_claim_whose_reply_is_late_comes_back_claimed(
    proxy: FaultProxy, real_client: redis.Redis, prefix: str
) -> None:
    client = redis.asyncio.Redis(
        host=proxy.host,
        port=proxy.port,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=SOCKET_TIMEOUT,
        retry=redis.asyncio.retry.Retry(NoBackoff(), 2),
    )
    store = AsyncRedisStore(client, Policy(prefix=prefix))
    record = record_for(prefix, "", "POST", "/r", "late-async")
    try:
        await client.ping()
        proxy.delay_replies(LATE)
        decision = await store.claim(record, "fp", heartbeat=False)
        assert isinstance(decision, Claimed)
        assert decision.takeover is False
        assert proxy.delayed == 1
        assert real_client.hget(record.key, "fence") == str(decision.fence).encode()
    finally:
        await store.aclose()
        await client.aclose()


def test_without_retries_a_late_claim_is_a_store_error_and_holds_the_key(
    proxy: FaultProxy, real_client: redis.Redis, prefix: str
) -> None:
    """Why the client's retries matter: the lost claim keeps the key until its lease ends."""
    client = proxied(proxy, retries=0)
    store = RedisStore(client, Policy(prefix=prefix))
    record = record_for(prefix, "", "POST", "/r", "no-retry")
    try:
        client.ping()
        proxy.delay_replies(LATE)
        with pytest.raises(StoreError, match="Timeout"):
            store.claim(record, "fp", lease_ms=60_000, heartbeat=False)
        # Redis applied it: the next attempt (a new owner) finds the key taken.
        retry = store.claim(record, "fp", heartbeat=False)
        assert isinstance(retry, InFlight)
        assert retry.lease_remaining > 50  # the bound; retry_after is at most 1 s
    finally:
        store.close()
        client.close()


# ---------------------------------------------------------------------------------------------
# A silent network, a frozen server: bounded failures, never a hang
# ---------------------------------------------------------------------------------------------


def test_a_black_hole_before_the_claim_is_a_store_error_and_the_block_never_runs(
    proxy: FaultProxy, prefix: str
) -> None:
    client = proxied(proxy, retries=1)
    store = RedisStore(client, Policy(prefix=prefix))
    try:
        client.ping()
        proxy.blackhole()
        started = time.monotonic()
        with pytest.raises(StoreError), guard(store, "job", payload=b"x"):
            pytest.fail("the block ran without a claim")
        # Two attempts of SOCKET_TIMEOUT each, plus reconnects: seconds at most, not forever.
        assert time.monotonic() - started < 10
        proxy.heal()
        with guard(store, "job", payload=b"x") as call:
            assert not call.replayed
            call.save("after the network healed")
    finally:
        store.close()
        client.close()


def test_a_paused_redis_is_a_store_error_and_works_again_when_resumed(
    private_redis_server: RedisServer, prefix: str
) -> None:
    client = private_redis_server.client(
        socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT, retry=no_retry()
    )
    store = RedisStore(client, Policy(prefix=prefix))
    try:
        with guard(store, "before", payload=b"") as call:
            call.save(1)
        private_redis_server.pause()
        started = time.monotonic()
        with pytest.raises(StoreError), guard(store, "during", payload=b""):
            pytest.fail("the block ran without a claim")
        assert time.monotonic() - started < 10
        private_redis_server.resume()
        with guard(store, "before", payload=b"") as call:
            assert call.replayed
            assert call.result == 1
    finally:
        if private_redis_server.paused:
            private_redis_server.resume()
        store.close()
        client.close()


# ---------------------------------------------------------------------------------------------
# Through the WSGI adapter
# ---------------------------------------------------------------------------------------------


class CountingApp:
    """A WSGI app that counts its runs; ``during`` runs inside the handler (a fault, say)."""

    def __init__(self) -> None:
        self.runs = 0
        self.during: Any = None
        self.fences: list[int | None] = []

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> list[bytes]:
        self.runs += 1
        exchange = environ.get("idemkey.exchange")
        self.fences.append(exchange.claim.fence if exchange and exchange.claim else None)
        if self.during is not None:
            self.during()
        body = json.dumps({"run": self.runs}).encode()
        start_response("201 Created", [("Content-Type", "application/json")])
        return [body]


def post(client: Client, key: str) -> Any:
    return client.post("/charges", data=b'{"amount": 1}', headers={"Idempotency-Key": key})


def test_wsgi_store_unreachable_before_the_claim_is_503_and_the_app_does_not_run(
    proxy: FaultProxy, prefix: str
) -> None:
    events: list[Event] = []
    redis_client = proxied(proxy, retries=1)
    store = RedisStore(redis_client, Policy(prefix=prefix, on_event=events.append))
    app = CountingApp()
    web = Client(IdempotencyMiddleware(app, store))
    try:
        proxy.refuse()
        proxy.cut()
        reply = post(web, "k1")
        assert reply.status_code == 503
        assert reply.headers["Content-Type"] == "application/problem+json"
        assert reply.json["code"] == "store_unavailable"
        assert reply.headers["Retry-After"].isdigit()
        assert app.runs == 0
        assert [e.kind for e in events] == ["store_error"]
        proxy.heal()
        assert post(web, "k1").status_code == 201
        assert app.runs == 1
    finally:
        store.close()
        redis_client.close()


def test_wsgi_store_unreachable_fail_open_runs_the_app_and_says_so(
    proxy: FaultProxy, prefix: str
) -> None:
    events: list[Event] = []
    redis_client = proxied(proxy, retries=0)
    policy = Policy(prefix=prefix, on_store_error="open", on_event=events.append)
    store = RedisStore(redis_client, policy)
    app = CountingApp()
    web = Client(IdempotencyMiddleware(app, store))
    try:
        proxy.blackhole()
        assert post(web, "k1").status_code == 201
        assert post(web, "k1").status_code == 201  # unprotected: it runs again
        assert app.runs == 2
        assert [e.kind for e in events] == ["unprotected", "unprotected"]
    finally:
        store.close()
        redis_client.close()


def test_wsgi_store_lost_after_the_handler_ran_keeps_the_record_in_progress_until_the_lease(
    proxy: FaultProxy, real_client: redis.Redis, prefix: str
) -> None:
    """The client gets its real answer; the record cannot be completed, so it stays claimed
    (409 to retries) until its lease lapses; then a retry takes it over and runs again.
    This is the one failure where the handler runs twice: document it, size the lease."""
    events: list[Event] = []
    lock = threading.Lock()

    def on_event(event: Event) -> None:
        with lock:
            events.append(event)

    lease = 1.0
    redis_client = proxied(proxy, retries=1)
    store = RedisStore(redis_client, Policy(prefix=prefix, lease=lease, on_event=on_event))
    app = CountingApp()
    web = Client(IdempotencyMiddleware(app, store))

    def lose_redis() -> None:
        proxy.refuse()
        proxy.cut()

    try:
        app.during = lose_redis
        reply = post(web, "k")
        assert reply.status_code == 201
        assert reply.json == {"run": 1}  # the real response, not a 503
        assert "store_error" in [e.kind for e in events]
        app.during = None
        proxy.heal()

        exchange_record = next(e.record for e in events if e.kind == "claimed")
        key = f"{prefix}:{{{exchange_record}}}"
        assert real_client.hget(key, "state") == b"in_progress"
        retry = post(web, "k")
        assert retry.status_code == 409  # the lease still runs: no second run yet
        assert app.runs == 1

        again = wait_until(
            lambda: (r := post(web, "k")).status_code == 201 and r,
            timeout=lease + 10,
            message="the lease to lapse and a retry to take the record over",
        )
        assert again.json == {"run": 2}
        assert len(app.fences) == 2
        assert app.fences[1] > app.fences[0]
        assert "takeover" in [e.kind for e in events]
        assert post(web, "k").headers.get("Idempotent-Replayed") == "true"
    finally:
        store.close()
        redis_client.close()


def test_guard_store_lost_inside_the_block_raises_store_error_on_exit(
    proxy: FaultProxy, real_client: redis.Redis, prefix: str
) -> None:
    redis_client = proxied(proxy, retries=1)
    store = RedisStore(redis_client, Policy(prefix=prefix, lease=0.5))

    fences: list[int] = []

    def work_then_lose_redis() -> None:
        with guard(store, "job", payload=b"p") as call:
            fences.append(call.fence or 0)
            call.save("done")
            proxy.refuse()
            proxy.cut()

    try:
        with pytest.raises(StoreError):
            work_then_lose_redis()
        proxy.heal()
        record = record_for(prefix, "", GUARD_METHOD, "", "job")
        assert real_client.hget(record.key, "state") == b"in_progress"
        with guard(store, "job", payload=b"p", policy=store.policy.replace(wait=10)) as again:
            assert again.takeover
            assert (again.fence or 0) > fences[0]
            again.save("second run")
    finally:
        store.close()
        redis_client.close()
