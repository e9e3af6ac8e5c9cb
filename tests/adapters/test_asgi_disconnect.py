"""A client that disconnects mid-handler, on a real uvicorn (docs/guarantees.md, "Cancellation").

Under uvicorn the app runs on when its client leaves: its response is stored, and the retry
with the same key gets it (one payment). Where the server cancels the request's task instead
(``cancelling_app``), before the response started, the key is kept until its lease lapses:
the retry is refused with 409 rather than paying again at once, and an ``uncertain`` entry
tells the operator. In process: a server whose send raises once its client left.
"""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
import redis.asyncio

from idemkey import AsyncRedisStore, Policy, RedisStore
from idemkey.adapters.asgi import IdempotencyMiddleware, Receive, Scope, Send
from tests._servers import HOST, AppServer, wait_until
from tests.adapters.test_asgi import Channel, Message, body_messages, call

pytestmark = pytest.mark.redis
ROOT = Path(__file__).resolve().parents[2]
JSON_HEADER = (b"content-type", b"application/json")


def serve(name: str, redis_url: str, prefix: str, tmp_path: Path) -> AppServer:
    return AppServer(
        lambda port: [sys.executable, "-m", "uvicorn", f"tests.adapters.disconnect_app:{name}",
                      "--host", HOST, "--port", str(port)],
        log=tmp_path / "uvicorn.log", cwd=ROOT, redis_url=redis_url, prefix=prefix,
        env={"PYTHONPATH": str(ROOT)}, name="uvicorn",
    )  # fmt: skip


@pytest.fixture
def paid(redis_url: str, prefix: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.set(f"{prefix}:gate", 1)  # the handler pays, then waits for the gate
    yield client
    client.close()


def runs(client: redis.Redis, prefix: str) -> int:
    return int(client.get(f"{prefix}:runs") or 0)


def pay_and_leave(server: AppServer, client: redis.Redis, prefix: str) -> None:
    """Send the payment, wait until the handler paid, and close the connection unanswered."""
    with socket.create_connection((HOST, server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /pay HTTP/1.1\r\nHost: test\r\nIdempotency-Key: pay-1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        )
        wait_until(lambda: runs(client, prefix) == 1, 20, "the payment")


def retry(server: AppServer) -> httpx.Response:
    headers = {"Idempotency-Key": "pay-1", "Content-Type": "application/json"}
    return httpx.post(f"{server.url}/pay", content=b"{}", headers=headers, timeout=20)


def test_under_uvicorn_the_handler_of_a_client_that_left_runs_on_and_is_replayed(
    redis_url: str, prefix: str, tmp_path: Path, paid: redis.Redis
) -> None:
    server = serve("app", redis_url, prefix, tmp_path)
    try:
        pay_and_leave(server, paid, prefix)
        paid.delete(f"{prefix}:gate")
        paid.rpush(f"{prefix}:open", 1)  # the handler of the client that left finishes
        again = wait_until(lambda: (r := retry(server)).status_code == 201 and r, 20, "a replay")
        assert runs(paid, prefix) == 1
    finally:
        server.close()  # deletes the test's keys
    assert again.json() == {"payment": "pay_1"}
    assert again.headers["Idempotent-Replayed"] == "true"


def test_an_app_cancelled_before_its_response_keeps_the_key_until_the_lease_lapses(
    redis_url: str, prefix: str, tmp_path: Path, paid: redis.Redis
) -> None:
    server = serve("cancelling_app", redis_url, prefix, tmp_path)
    store = RedisStore(paid, Policy(prefix=prefix))
    try:
        pay_and_leave(server, paid, prefix)
        (entry,) = wait_until(store.uncertain, 20, "the uncertain entry")
        refused = retry(server)  # within the lease: not a second payment
        assert refused.status_code == 409, refused.text
        assert runs(paid, prefix) == 1
        # The claim is no longer renewed: after its lease (1.5 s) a retry takes it over.
        paid.delete(f"{prefix}:gate")
        later = wait_until(lambda: (r := retry(server)).status_code == 201 and r, 20, "a rerun")
    finally:
        store.close()
        server.close()
    assert entry.kind == "cancelled"
    assert later.json() == {"payment": "pay_2"}  # the operator was told to check pay_1 first


# ---- in process: a server whose send fails --------------------------------------------------


class Gone(Channel):
    """A server whose client left before the response started: every send raises."""

    async def send(self, message: Message) -> None:
        raise OSError("the client left")


@pytest.mark.parametrize("app_goes_on", [False, True], ids=["app-raises", "app-sends-its-body"])
async def test_a_head_the_server_could_not_send_still_completes_the_record(
    real_async_client: redis.asyncio.Redis, prefix: str, app_goes_on: bool
) -> None:
    # The app did its work and produced its head: as for a final message the server could
    # not send, the record completes. Before, the key was released and the retry ran it again.
    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix))
    runs: list[int] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        runs.append(1)
        try:
            await send({"type": "http.response.start", "status": 201, "headers": [JSON_HEADER]})
        except OSError:
            if not app_goes_on:
                raise
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": b'{"id":"ch_1"}'})

    middleware = IdempotencyMiddleware(app, store)
    body = b'{"amount": 1}'
    try:
        with contextlib.nullcontext() if app_goes_on else pytest.raises(OSError, match="left"):
            await call(middleware, body, channel=Gone(body_messages(body)))
        replay = await call(middleware, body)
    finally:
        await store.aclose()
    assert runs == [1]
    assert (replay.status, replay.headers["idempotent-replayed"]) == (201, "true")
    if app_goes_on:
        assert replay.body == b'{"id":"ch_1"}'
    else:
        assert replay.headers["idempotent-body-not-kept"] == "true"
