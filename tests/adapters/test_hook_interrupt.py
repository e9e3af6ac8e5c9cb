"""The middlewares: an on_event hook interrupted on ``claimed`` frees the key at once; one
interrupted on ``takeover`` leaves it to lapse, as an app cancelled before its head does.

The hook runs once Redis granted the claim, before the app: a Ctrl-C landing while a slow
hook exports the event, an exit, a cancel, raise there. Before, the claim stayed in Redis and
the store's heartbeat went on renewing it: every retry got 409 in_flight for as long as the
process lived. Now a plain claim is released, as one whose reply a cancel cut off is (the app
never ran: the retry runs it at once, no entry), and a takeover, whose work the previous
executor may have done, is kept, no longer renewed, a ``cancelled`` entry names it, and the
retry after its lease takes it over again (the driver's ``abandon``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio

from idemkey import AsyncRedisStore, Event, Policy, RedisStore, current_call
from idemkey._core import Record, record_for
from idemkey.adapters.asgi import IdempotencyMiddleware as ASGIMiddleware
from idemkey.adapters.wsgi import IdempotencyMiddleware as WSGIMiddleware
from idemkey.http import Exchange, Headers, Request, begin
from idemkey.http._scope import NO_CREDENTIALS
from tests._lease import lease_left
from tests._servers import async_wait_until, wait_until
from tests.adapters.harness_wsgi import call_wsgi

pytestmark = pytest.mark.redis

KEY = "charge-1"
ROUTE = "/charges"
#: Short, so a claim nobody renews lapses soon; one the heartbeat renews never does.
LEASE = 0.5
#: How long a test waits for the lease to lapse: ten leases, far past one unrenewed.
LAPSE_WAIT = 10 * LEASE


class RaiseOn:
    """An on_event hook that raises ``error`` on the first event of ``kind``, and keeps the
    fence of the claim it interrupted."""

    def __init__(self, kind: str, error: type[BaseException]) -> None:
        self.kind, self.error = kind, error
        self.fences: list[int | None] = []

    def __call__(self, event: Event) -> None:
        if event.kind == self.kind and not self.fences:
            self.fences.append(event.fence)
            raise self.error()


def http_record(prefix: str) -> Record:
    return record_for(prefix, NO_CREDENTIALS, "POST", ROUTE, KEY)


def kinds_of(entries: list[Any]) -> list[tuple[str, int | None]]:
    return [(entry.kind, entry.fence) for entry in entries]


def crashed_claim(store: RedisStore, policy: Policy) -> None:
    """Claim the request's record as an executor that crashed would have left it: no
    heartbeat, so its lease lapses and the next request takes it over."""
    request = Request(
        "POST", ROUTE, "", Headers([("Idempotency-Key", KEY), ("Content-Type", "application/json")])
    )
    step = begin(policy, request)
    assert isinstance(step, Exchange)
    assert step.received(b"{}") is None
    store.claim(step.record, step.claiming(), owner="crashed", lease_ms=50, heartbeat=False)


# ---- WSGI ------------------------------------------------------------------------------------


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, SystemExit], ids=lambda e: e.__name__)
def test_wsgi_claimed_hook_interrupted_releases_the_key_and_the_retry_runs_at_once(
    real_client: redis.Redis, prefix: str, interruption: type[BaseException]
) -> None:
    hook = RaiseOn("claimed", interruption)
    store = RedisStore(real_client, Policy(prefix=prefix, lease=LEASE, wait=0, on_event=hook))
    charges: list[str] = []
    try:
        middleware = WSGIMiddleware(charging_wsgi_app(charges), store)
        with pytest.raises(interruption):
            wsgi_post(middleware)
        assert hook.fences
        assert wsgi_post(middleware) == 201  # released: the app never ran, the retry runs it
        assert wsgi_post(middleware) == 201  # and the answer is replayed
        assert charges == ["charged"]
        store._keeper.drain(10)
        assert kinds_of(store.uncertain()) == []  # nothing ran that an operator must check
    finally:
        store.close()


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, SystemExit], ids=lambda e: e.__name__)
def test_wsgi_takeover_hook_interrupted_leaves_the_key_to_lapse_and_the_retry_runs(
    real_client: redis.Redis, prefix: str, interruption: type[BaseException]
) -> None:
    hook = RaiseOn("takeover", interruption)
    policy = Policy(prefix=prefix, lease=LEASE, wait=0, on_event=hook)
    store = RedisStore(real_client, policy)
    charges: list[str] = []
    record = http_record(prefix)

    def lapse(what: str) -> None:
        wait_until(lambda: lease_left(real_client, record) <= 0, LAPSE_WAIT, what)

    try:
        middleware = WSGIMiddleware(charging_wsgi_app(charges), store)
        crashed_claim(store, policy)
        lapse("the crashed claim's lease to lapse")
        with pytest.raises(interruption):
            wsgi_post(middleware)
        (fence,) = hook.fences
        # Kept, not released: the crashed run's work is unknown, and a release would let the
        # retry run without call.takeover.
        assert wsgi_post(middleware) == 409
        lapse("the lease to lapse (the heartbeat still renews the interrupted claim)")
        assert wsgi_post(middleware) == 201  # the takeover runs the app
        assert wsgi_post(middleware) == 201  # and the answer is replayed
        assert charges == ["charged"]
        wanted = [("cancelled", fence), ("takeover", fence)]
        wait_until(
            lambda: all(pair in kinds_of(store.uncertain()) for pair in wanted),
            10,
            f"the entries {wanted}",
        )
    finally:
        store.close()


def charging_wsgi_app(charges: list[str]) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        charges.append("charged")
        start_response("201 Created", [("Content-Type", "text/plain"), ("Content-Length", "7")])
        return [b"charged"]

    return app


def wsgi_post(middleware: WSGIMiddleware) -> int:
    headers = [("Idempotency-Key", KEY), ("Content-Type", "application/json")]
    return call_wsgi(middleware, "POST", ROUTE, headers=headers, body=b"{}").status


# ---- ASGI ------------------------------------------------------------------------------------


async def charge_app(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b"charged"})


async def cancelled_app(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    raise asyncio.CancelledError  # before its head: the driver abandons the claim


async def post(middleware: ASGIMiddleware) -> int:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": ROUTE,
        "query_string": b"",
        "headers": [(b"idempotency-key", KEY.encode()), (b"content-length", b"2")],
    }
    await middleware(scope, receive, send)
    status: int = sent[0]["status"]
    return status


@pytest.mark.parametrize(
    "interruption", [asyncio.CancelledError, KeyboardInterrupt], ids=lambda e: e.__name__
)
async def test_asgi_claimed_hook_interrupted_releases_the_key_and_the_retry_runs_at_once(
    real_async_client: redis.asyncio.Redis, prefix: str, interruption: type[BaseException]
) -> None:
    hook = RaiseOn("claimed", interruption)
    policy = Policy(prefix=prefix, lease=LEASE, wait=0, on_event=hook)
    store = AsyncRedisStore(real_async_client, policy)
    middleware = ASGIMiddleware(charge_app, store)
    try:
        with pytest.raises(interruption):
            await post(middleware)
        assert hook.fences
        with pytest.raises(LookupError):  # the claim's call is not left current
            current_call()
        assert await post(middleware) == 201  # released: the retry runs the app at once
        assert await post(middleware) == 201  # and the answer is replayed
        await store._keeper.drain(10)
        assert kinds_of(await store.uncertain()) == []
    finally:
        await store.aclose()


@pytest.mark.parametrize(
    "interruption", [asyncio.CancelledError, KeyboardInterrupt], ids=lambda e: e.__name__
)
async def test_asgi_takeover_hook_interrupted_leaves_the_key_to_lapse_and_the_retry_runs(
    real_async_client: redis.asyncio.Redis, prefix: str, interruption: type[BaseException]
) -> None:
    hook = RaiseOn("takeover", interruption)
    policy = Policy(prefix=prefix, lease=LEASE, wait=0, on_event=hook)
    store = AsyncRedisStore(real_async_client, policy)
    middleware = ASGIMiddleware(charge_app, store)
    record = http_record(prefix)

    async def lapsed() -> bool:
        return await lease_left(real_async_client, record) <= 0

    try:
        # An app cancelled before its head: kept, unrenewed; the next claim takes over.
        with pytest.raises(asyncio.CancelledError):
            await post(ASGIMiddleware(cancelled_app, store))
        await async_wait_until(lapsed, LAPSE_WAIT, "the first lease to lapse")
        with pytest.raises(interruption):
            await post(middleware)
        (fence,) = hook.fences
        with pytest.raises(LookupError):  # the claim's call is not left current
            current_call()
        assert await post(middleware) == 409  # kept, not released
        await async_wait_until(
            lapsed, LAPSE_WAIT, "the lease to lapse (the heartbeat still renews the claim)"
        )
        assert await post(middleware) == 201  # the takeover runs the app
        assert await post(middleware) == 201  # and the answer is replayed
        wanted = [("cancelled", fence), ("takeover", fence)]

        async def entries() -> bool:
            kept = kinds_of(await store.uncertain())
            return all(pair in kept for pair in wanted)

        await async_wait_until(entries, 10, f"the entries {wanted}")
    finally:
        await store.aclose()
