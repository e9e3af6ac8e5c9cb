"""A Stainless-generated SDK (``increase``, pinned in the test extra) against a FastAPI app
guarded by idemkey, on a real uvicorn server on loopback and the session's real Redis.

The SDK sends one ``Idempotency-Key`` per call and keeps it across its retries. A handler
slower than the SDK's timeout: the first attempt times out, the retry finds the call in flight
and gets ``409 in_flight``. The SDK never retries a 409 on its own (only 408, 429 and 5xx), so
with ``Policy()`` defaults the application gets ``ConflictError`` for a charge that ran once;
with ``Policy(mark_retryable=True)`` the 409 carries ``x-should-retry: true``, which every
Stainless client obeys: it waits ``Retry-After`` and gets the replay.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis.asyncio

from idemkey import AsyncRedisStore, Policy
from idemkey.events import Event
from tests._servers import wait_until

increase = pytest.importorskip("increase")
uvicorn = pytest.importorskip("uvicorn")
pytestmark = pytest.mark.redis

#: Seconds the SDK waits for an answer; the handler takes longer (until a retry found it in
#: flight, so never by a guessed sleep).
SDK_TIMEOUT = 0.5


class Served:
    """The app on a uvicorn server in a thread, and what the test watches of it."""

    def __init__(self, redis_url: str, prefix: str, **policy: Any) -> None:
        from fastapi import FastAPI

        from idemkey.adapters.fastapi import Idempotency, IdempotentRoute

        self.runs = 0
        self.in_flight = threading.Event()  # a retry was answered 409 in_flight
        self.finish = threading.Event()  # the handler may answer

        def seen(event: Event) -> None:
            if event.kind == "in_flight":
                self.in_flight.set()

        client = redis.asyncio.Redis.from_url(redis_url)
        store = AsyncRedisStore(client, Policy(prefix=prefix, on_event=seen, **policy))
        idem = Idempotency(store)
        app = FastAPI()
        app.router.route_class = IdempotentRoute

        @app.post("/accounts", status_code=200, dependencies=[idem.guard()])
        async def create_account(body: dict[str, Any]) -> dict[str, Any]:
            self.runs += 1
            # Slower than the SDK's timeout: it answers once a retry found it in flight.
            await asyncio.to_thread(self.finish.wait, 30)
            return {"id": f"account_{self.runs}", "name": body.get("name"), "type": "account"}

        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, 20, "uvicorn to start")
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def close(self) -> None:
        self.finish.set()
        self.server.should_exit = True
        self.thread.join(20)


@pytest.fixture
def served(redis_url: str, prefix: str) -> Iterator[Callable[..., Served]]:
    made: list[Served] = []

    def start(**policy: Any) -> Served:
        made.append(Served(redis_url, prefix, **policy))
        return made[-1]

    yield start
    for one in made:
        one.close()


def sdk(server: Served) -> Any:
    return increase.Increase(
        api_key="test-key", base_url=server.url, timeout=SDK_TIMEOUT, max_retries=4
    )


def release_once_in_flight(server: Served) -> threading.Thread:
    """Let the handler answer as soon as a retry was answered 409 (in a thread)."""

    def run() -> None:
        if server.in_flight.wait(30):
            server.finish.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_with_mark_retryable_the_sdk_gets_the_replay(served: Callable[..., Served]) -> None:
    server = served(mark_retryable=True)
    helper = release_once_in_flight(server)
    with sdk(server) as client:
        account = client.accounts.create(name="ops")
    helper.join(5)
    assert server.in_flight.is_set()  # the SDK did meet the 409, and retried it
    assert account.id == "account_1"
    assert account.name == "ops"
    assert server.runs == 1


def test_without_it_the_sdk_raises_a_conflict_for_a_call_that_ran_once(
    served: Callable[..., Served],
) -> None:
    server = served()
    helper = release_once_in_flight(server)
    with sdk(server) as client, pytest.raises(increase.ConflictError) as raised:
        client.accounts.create(name="ops")
    helper.join(5)
    assert raised.value.response.headers.get("x-should-retry") is None
    assert raised.value.body["code"] == "in_flight"
    wait_until(lambda: server.runs == 1, 10, "the first call to run")
