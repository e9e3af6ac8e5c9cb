"""One AsyncRedisStore across event loops, and across a Redis restart, on a real redis-server.

A worker that runs each job with ``asyncio.run()`` builds its store once, at import, and uses it
from a new event loop every time. Its client's pooled connections belong to the loop that made
them: before the store dropped them, every second job sent its claim on one (Redis applied it,
holding the key for the lease) and then failed with a bare ``RuntimeError: Event loop is
closed`` (a 500 through the ASGI middleware).

After a restart, redis-py's asyncio pool hands out a connection the server closed; on redis-py
5 (the floor; ``nox -s lowest_core`` runs this file on it) no command is retried whatever
``retry=`` says, so the first request got 503. The sync pool checks a connection as it hands it
out, so the sync store is the control.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry
from werkzeug.test import Client

from idemkey import AsyncRedisStore, Policy, RedisStore, aguard
from idemkey.adapters.asgi import IdempotencyMiddleware as AsgiMiddleware
from idemkey.adapters.wsgi import IdempotencyMiddleware as WsgiMiddleware

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from tests._servers import RedisServer

pytestmark = pytest.mark.redis

JOBS = 4


def worker_store(redis_url: str, prefix: str) -> tuple[redis.asyncio.Redis, AsyncRedisStore]:
    """What a worker module builds at import, outside any event loop: the README's client."""
    client = redis.asyncio.Redis.from_url(redis_url)
    return client, AsyncRedisStore(client, Policy(prefix=prefix))


def test_aguard_from_one_asyncio_run_per_job(redis_url: str, prefix: str) -> None:
    client, store = worker_store(redis_url, prefix)
    ran: list[int] = []

    async def job(n: int) -> tuple[bool, Any]:
        async with aguard(store, f"job-{n}") as call:
            if not call.replayed:
                ran.append(n)
                call.save({"job": n})
        return call.replayed, call.result

    async def last_job_then_close(n: int) -> tuple[bool, Any]:
        try:
            return await job(n)
        finally:
            await store.aclose()
            await client.aclose()

    first = [asyncio.run(job(n)) for n in range(JOBS)]
    again = [asyncio.run(job(n)) for n in range(JOBS - 1)]
    again.append(asyncio.run(last_job_then_close(JOBS - 1)))
    assert first == [(False, {"job": n}) for n in range(JOBS)]
    assert again == [(True, {"job": n}) for n in range(JOBS)]  # completed, not left claimed
    assert ran == list(range(JOBS))


async def _record_state(store: AsyncRedisStore) -> list[str]:
    status = await store.record("job")
    return [status.state] if status is not None else []


async def _states(store: AsyncRedisStore) -> list[str]:
    return [status.state async for status in store.records()]


async def _kinds(store: AsyncRedisStore) -> list[str]:
    return [entry.kind for entry in await store.uncertain()]


@pytest.mark.parametrize(
    ("read", "expected"),
    [(_record_state, ["complete"]), (_states, ["complete"]), (_kinds, [])],
    ids=["record", "records", "uncertain"],
)
def test_a_read_from_the_asyncio_run_after_a_job(
    redis_url: str, prefix: str, read: Callable[[AsyncRedisStore], Any], expected: list[str]
) -> None:
    # An operator's read (a health check, a sweep of uncertain outcomes) on the loop after a
    # job's: before, it raised a bare RuntimeError ("Event loop is closed", or a future
    # "attached to a different loop") from a pooled connection of the job's loop.
    client, store = worker_store(redis_url, prefix)

    async def job() -> None:
        async with aguard(store, "job") as call:
            if not call.replayed:
                call.save("done")

    async def read_then_close() -> list[str]:
        try:
            return list(await read(store))
        finally:
            await store.aclose()
            await client.aclose()

    asyncio.run(job())
    first = asyncio.run(read(store))
    asyncio.run(job())  # a replay, on a loop of its own
    again = asyncio.run(read_then_close())
    assert first == again == expected


async def _charge(scope: dict[str, Any], receive: Callable[..., Any], send: Any) -> None:
    while (await receive()).get("more_body"):
        pass
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": b'{"id":"ch_1"}'})


async def _post(app: Any, key: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        return await http.post("/charges", json={}, headers={"Idempotency-Key": key})


def test_asgi_middleware_from_one_asyncio_run_per_request(redis_url: str, prefix: str) -> None:
    client, store = worker_store(redis_url, prefix)
    app = AsgiMiddleware(_charge, store)

    async def close() -> None:
        await store.aclose()
        await client.aclose()

    async def post_then_close(key: str) -> httpx.Response:
        try:
            return await _post(app, key)
        finally:
            await close()

    first = [asyncio.run(_post(app, f"k{n}")) for n in range(JOBS)]
    replay = asyncio.run(post_then_close("k1"))
    assert [r.status_code for r in first] == [201] * JOBS, [r.text for r in first]
    assert replay.status_code == 201
    assert replay.headers.get("idempotent-replayed") == "true"


def _wsgi_charge(environ: WSGIEnvironment, start_response: StartResponse) -> list[bytes]:
    start_response("201 Created", [("Content-Type", "application/json")])
    return [b'{"id":"ch_1"}']


@pytest.mark.parametrize("loop", ["idle", "busy"])
async def test_asyncio_store_recovers_on_the_first_request_after_a_restart(
    private_redis_server: RedisServer, prefix: str, loop: str
) -> None:
    """``idle``: the event loop runs on while Redis restarts, and sees the server close its
    connection (hiredis's parser then notices; redis-py's own does not). ``busy``: the loop is
    held up meanwhile, so the next request checks the connection out before the loop saw it
    close; either parser hands it out then."""
    server = private_redis_server
    client = redis.asyncio.Redis(  # the README's settings
        host=server.host,
        port=server.port,
        socket_timeout=0.5,
        socket_connect_timeout=0.5,
        retry=AsyncRetry(NoBackoff(), 1),
    )
    store = AsyncRedisStore(client, Policy(prefix=prefix))
    app = AsgiMiddleware(_charge, store)
    try:
        assert (await _post(app, "before")).status_code == 201
        if loop == "idle":
            await asyncio.to_thread(server.restart)
        else:
            server.restart()
        after = await _post(app, "after")
        assert after.status_code == 201, after.text
    finally:
        await store.aclose()
        await client.aclose()


def test_sync_store_recovers_on_the_first_request_after_a_restart(
    private_redis_server: RedisServer, prefix: str
) -> None:
    server = private_redis_server
    client = redis.Redis(  # the README's settings
        host=server.host,
        port=server.port,
        socket_timeout=0.5,
        socket_connect_timeout=0.5,
        retry=Retry(NoBackoff(), 1),
    )
    store = RedisStore(client, Policy(prefix=prefix))
    http = Client(WsgiMiddleware(_wsgi_charge, store))
    # Buffered: each response is read and closed, as a WSGI server does, so each record
    # completes (unread, its claim stayed open and renewed after the test).
    post = partial(http.post, "/charges", json={}, buffered=True)
    try:
        assert post(headers={"Idempotency-Key": "b"}).status_code == 201
        server.restart()
        after = post(headers={"Idempotency-Key": "a"})
        assert after.status_code == 201, after.get_data(as_text=True)
    finally:
        store.close()
        client.close()
