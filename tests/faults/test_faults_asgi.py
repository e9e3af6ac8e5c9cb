"""The Redis faults of test_faults.py, through the ASGI adapter (and AsyncRedisStore).

Redis unreachable before the claim: 503 problem, the app does not run (or, failing open, it
runs and ``unprotected`` is emitted). Redis lost after the app ran: the client gets the app's
real answer, ``store_error`` is emitted, and the record stays in progress until its lease
lapses, when a retry takes it over.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from idemkey import AsyncRedisStore, Event, Policy
from idemkey.adapters.asgi import IdempotencyMiddleware
from tests._servers import async_wait_until
from tests.faults._proxy import FaultProxy

if TYPE_CHECKING:
    from tests._servers import ExternalRedis, RedisServer

pytestmark = pytest.mark.redis


@pytest.fixture
def proxy(redis_server: RedisServer | ExternalRedis) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.host, redis_server.port) as fault_proxy:
        yield fault_proxy


class App:
    def __init__(self) -> None:
        self.runs = 0
        self.during: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.runs += 1
        while (await receive()).get("more_body"):
            pass
        if self.during is not None:
            self.during()
        body = json.dumps({"run": self.runs}).encode()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": body})


async def post(app: Any, key: str) -> tuple[int, dict[bytes, bytes], bytes]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/charges",
        "raw_path": b"/charges",
        "query_string": b"",
        "headers": [(b"idempotency-key", key.encode()), (b"content-type", b"application/json")],
    }
    inbox = [{"type": "http.request", "body": b"{}", "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return inbox.pop(0) if inbox else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), 20)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {n.lower(): v for n, v in start["headers"]}, body


def client_via(proxy: FaultProxy, retries: int) -> redis.asyncio.Redis:
    return redis.asyncio.Redis(
        host=proxy.host,
        port=proxy.port,
        socket_timeout=0.3,
        socket_connect_timeout=0.3,
        retry=Retry(NoBackoff(), retries),
    )


async def test_asgi_store_unreachable_is_503_and_the_app_does_not_run(
    proxy: FaultProxy, prefix: str
) -> None:
    events: list[Event] = []
    client = client_via(proxy, 1)
    store = AsyncRedisStore(client, Policy(prefix=prefix, on_event=events.append))
    app = App()
    web = IdempotencyMiddleware(app, store)
    try:
        proxy.refuse()
        proxy.cut()
        status, headers, body = await post(web, "k")
        assert status == 503
        assert headers[b"content-type"] == b"application/problem+json"
        assert json.loads(body)["code"] == "store_unavailable"
        assert headers[b"retry-after"].isdigit()
        assert app.runs == 0
        assert "store_error" in [e.kind for e in events]
        proxy.heal()
        assert (await post(web, "k"))[0] == 201
    finally:
        await store.aclose()
        await client.aclose()


async def test_asgi_fail_open_runs_the_app_unprotected(proxy: FaultProxy, prefix: str) -> None:
    events: list[Event] = []
    client = client_via(proxy, 0)
    policy = Policy(prefix=prefix, on_store_error="open", on_event=events.append)
    store = AsyncRedisStore(client, policy)
    app = App()
    web = IdempotencyMiddleware(app, store)
    try:
        proxy.blackhole()
        assert (await post(web, "k"))[0] == 201
        assert (await post(web, "k"))[0] == 201
        assert app.runs == 2
        assert [e.kind for e in events] == ["unprotected", "unprotected"]
    finally:
        await store.aclose()
        await client.aclose()


async def test_asgi_store_lost_after_the_app_ran_answers_and_holds_the_key_for_a_lease(
    proxy: FaultProxy, prefix: str
) -> None:
    events: list[Event] = []
    client = client_via(proxy, 1)
    lease = 1.0
    store = AsyncRedisStore(client, Policy(prefix=prefix, lease=lease, on_event=events.append))
    app = App()
    web = IdempotencyMiddleware(app, store)

    def lose_redis() -> None:
        proxy.refuse()
        proxy.cut()

    try:
        app.during = lose_redis
        status, _, body = await post(web, "k")
        assert status == 201
        assert json.loads(body) == {"run": 1}
        await async_wait_until(
            lambda: "store_error" in [e.kind for e in events], 10, "the store_error event"
        )
        app.during = None
        proxy.heal()
        assert (await post(web, "k"))[0] == 409  # in progress until the lease lapses
        assert app.runs == 1

        async def taken_over() -> bytes | None:
            status, _, body = await post(web, "k")
            return body if status == 201 else None

        body = await async_wait_until(taken_over, lease + 10, "a takeover after the lease")
        assert json.loads(body) == {"run": 2}
        assert "takeover" in [e.kind for e in events]
    finally:
        await store.aclose()
        await client.aclose()
