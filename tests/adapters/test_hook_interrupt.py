"""The middlewares: an on_event hook interrupted on ``claimed`` or ``takeover`` leaves the key
to lapse, as an app cancelled before its head does (the driver's ``abandon``).

The hook runs once Redis granted the claim, before the app: a Ctrl-C landing while a slow
hook exports the event, an exit, a cancel, raise there. Before, the claim stayed in Redis and
the store's heartbeat went on renewing it: every retry got 409 in_flight for as long as the
process lived. Now the claim is kept, no longer renewed, a ``cancelled`` entry names it, and
the retry after its lease runs the app (a takeover).
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
EVENTS = ["claimed", "takeover"]


class RaiseOn:
    """An on_event hook that raises ``error`` on the first event of each of ``kinds``, and
    keeps the fences of the claims it interrupted."""

    def __init__(self, kinds: tuple[str, ...], error: type[BaseException]) -> None:
        self.kinds, self.error = set(kinds), error
        self.fences: list[int | None] = []

    def __call__(self, event: Event) -> None:
        if event.kind in self.kinds:
            self.kinds.discard(event.kind)
            self.fences.append(event.fence)
            raise self.error()


def http_record(prefix: str) -> Record:
    return record_for(prefix, NO_CREDENTIALS, "POST", ROUTE, KEY)


def kept(entries: list[Any], wanted: list[tuple[str, int | None]]) -> bool:
    pairs = [(entry.kind, entry.fence) for entry in entries]
    return all(pair in pairs for pair in wanted)


# ---- WSGI ------------------------------------------------------------------------------------


@pytest.mark.parametrize("event", EVENTS)
@pytest.mark.parametrize("interruption", [KeyboardInterrupt, SystemExit], ids=lambda e: e.__name__)
def test_wsgi_hook_interrupted_leaves_the_key_to_lapse_and_the_retry_runs(
    real_client: redis.Redis, prefix: str, event: str, interruption: type[BaseException]
) -> None:
    # On "takeover", the hook is interrupted on "claimed" first: that claim, once lapsed, is
    # what the next request takes over (a WSGI app interrupted itself is released instead).
    kinds = ("claimed", "takeover") if event == "takeover" else ("claimed",)
    hook = RaiseOn(kinds, interruption)
    store = RedisStore(real_client, Policy(prefix=prefix, lease=LEASE, wait=0, on_event=hook))
    charges: list[str] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        charges.append("charged")
        start_response("201 Created", [("Content-Type", "text/plain"), ("Content-Length", "7")])
        return [b"charged"]

    middleware = WSGIMiddleware(app, store)
    record = http_record(prefix)

    def post() -> int:
        headers = [("Idempotency-Key", KEY), ("Content-Type", "application/json")]
        return call_wsgi(middleware, "POST", ROUTE, headers=headers, body=b"{}").status

    def lapse(what: str) -> None:
        wait_until(lambda: lease_left(real_client, record) <= 0, LAPSE_WAIT, what)

    try:
        for _ in kinds:
            with pytest.raises(interruption):
                post()
            assert post() == 409  # kept, not released: as an app cancelled before its head
            lapse("the lease to lapse (the heartbeat still renews the interrupted claim)")
        assert post() == 201  # the takeover runs the app
        assert post() == 201  # and the answer is replayed
        assert charges == ["charged"]
        wanted = [("cancelled", fence) for fence in hook.fences]
        if event == "takeover":
            wanted.append(("takeover", hook.fences[1]))
        wait_until(lambda: kept(store.uncertain(), wanted), 10, f"the entries {wanted}")
    finally:
        store.close()


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


@pytest.mark.parametrize("event", EVENTS)
@pytest.mark.parametrize(
    "interruption", [asyncio.CancelledError, KeyboardInterrupt], ids=lambda e: e.__name__
)
async def test_asgi_hook_interrupted_leaves_the_key_to_lapse_and_the_retry_runs(
    real_async_client: redis.asyncio.Redis,
    prefix: str,
    event: str,
    interruption: type[BaseException],
) -> None:
    hook = RaiseOn((event,), interruption)
    policy = Policy(prefix=prefix, lease=LEASE, wait=0, on_event=hook)
    store = AsyncRedisStore(real_async_client, policy)
    middleware = ASGIMiddleware(charge_app, store)
    record = http_record(prefix)

    async def lapsed() -> bool:
        return await lease_left(real_async_client, record) <= 0

    try:
        if event == "takeover":
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
        wanted = [("cancelled", fence)]
        if event == "takeover":
            wanted.append(("takeover", fence))

        async def entries() -> bool:
            return kept(await store.uncertain(), wanted)

        await async_wait_until(entries, 10, f"the entries {wanted}")
    finally:
        await store.aclose()
