"""Ctrl-C under ``asyncio.run``: ``python -m tests.faults._sigint_worker URL PREFIX SCENARIO``.

The worker raises SIGINT itself (``signal.raise_signal``), at one point of its run, so the
moment is the same every time: ``asyncio.run``'s handler cancels the main task at once, the
cancel lands at the next await, and once the main task ends ``asyncio.run`` cancels every task
still pending (a write detached from a cancelled caller too). The test then reads Redis.

* ``complete``: two aguard jobs; the Ctrl-C comes as job 1's block ends while job 2's claim
  is on the wire, so job 1's completion waits for the store's next batch (``Batched``).
* ``claim``: the Ctrl-C comes once Redis applied aguard's claim, before its reply is read (a
  hook on the store's script call: the cancel lands there).
* ``claim-2``: as ``claim``, two Ctrl-C: the first cancels the main task, the second raises
  KeyboardInterrupt there, the first one's cancel still pending (the release must outlast it).
* ``block``: the Ctrl-C comes while the block runs, before it saved a result.
* ``asgi``: as ``complete``, the middleware's completion after the app's final message.
* ``asgi-claim``: as ``claim``, the middleware's claim.
* ``asgi-claim-2``: as ``claim-2``, the middleware's claim.

Prints ``interrupted`` when ``KeyboardInterrupt`` came out of ``asyncio.run``, as it should.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

import redis.asyncio

from idemkey import AsyncRedisStore, Policy, aguard
from idemkey.adapters.asgi import IdempotencyMiddleware

#: Long enough that a record the worker left claimed is still held when the test reads it.
LEASE = 60.0
#: The key of the job whose record the test reads; ``other`` is the second job's.
KEY = "charge"


def ctrl_c() -> None:
    signal.raise_signal(signal.SIGINT)


async def other_job(store: AsyncRedisStore) -> None:
    """A second job on the same store, whose claim is on the wire while job 1 ends. It waits
    for nothing: a cancel can be lost in redis-py's send (``asyncio.wait_for`` on Python 3.11
    returns a result that came with the cancel), and ``asyncio.run`` waits for every task."""
    async with aguard(store, "other", payload=1):
        pass


async def complete(store: AsyncRedisStore) -> None:
    async with aguard(store, KEY, payload=1) as call:
        call.save("charge-1")
        job = asyncio.create_task(other_job(store))
        await asyncio.sleep(0)  # job 2's claim goes out (no reply read yet)
        ctrl_c()  # as the block ends: the completion joins the batch after that claim
    await job


def ctrl_c_after_the_claim(store: AsyncRedisStore, presses: int = 1) -> None:
    """Raise SIGINT once Redis applied the next claim, and let the cancel land before its
    reply is handed back: the reply is lost, as when the cancel comes while it is read. A
    second press raises KeyboardInterrupt right there, the first one's cancel still pending."""
    real = store._eval

    async def script_call(name: str, *keys_and_args: str | bytes | int) -> Any:
        reply = await real(name, *keys_and_args)
        if name == "claim":
            for _ in range(presses):
                ctrl_c()
            await asyncio.sleep(0)  # the cancel lands here
        return reply

    store._eval = script_call  # type: ignore[method-assign]


async def claim(store: AsyncRedisStore) -> None:
    ctrl_c_after_the_claim(store)
    async with aguard(store, KEY, payload=1):
        print("the block ran although its claim's reply never came")


async def claim_twice(store: AsyncRedisStore) -> None:
    ctrl_c_after_the_claim(store, presses=2)
    async with aguard(store, KEY, payload=1):
        print("the block ran although its claim's reply never came")


async def block(store: AsyncRedisStore) -> None:
    async with aguard(store, KEY, payload=1):
        ctrl_c()
        await asyncio.Event().wait()


def middleware(store: AsyncRedisStore, app: Any) -> Any:
    """One keyed POST through the ASGI middleware."""

    async def request() -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            pass  # the server: sends at once, never waits

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/charges",
            "query_string": b"",
            "headers": [(b"idempotency-key", KEY.encode())],
        }
        await IdempotencyMiddleware(app, store)(scope, receive, send)

    return request


async def asgi(store: AsyncRedisStore) -> None:
    jobs: list[asyncio.Task[None]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        jobs.append(asyncio.create_task(other_job(store)))
        await asyncio.sleep(0)  # job 2's claim goes out (no reply read yet)
        await send({"type": "http.response.start", "status": 201, "headers": []})
        ctrl_c()  # as the final message goes out: the completion joins the next batch
        await send({"type": "http.response.body", "body": b"charged"})

    await middleware(store, app)()
    await jobs[0]


async def asgi_claim(store: AsyncRedisStore) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        print("the app ran although its claim's reply never came")

    ctrl_c_after_the_claim(store)
    await middleware(store, app)()


async def asgi_claim_twice(store: AsyncRedisStore) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        print("the app ran although its claim's reply never came")

    ctrl_c_after_the_claim(store, presses=2)
    await middleware(store, app)()


SCENARIOS = {
    "complete": complete,
    "claim": claim,
    "claim-2": claim_twice,
    "block": block,
    "asgi": asgi,
    "asgi-claim": asgi_claim,
    "asgi-claim-2": asgi_claim_twice,
}


def main(url: str, prefix: str, scenario: str) -> int:
    # As in a terminal: a runner that started this process with SIGINT ignored (a background
    # job) would leave it ignored, and asyncio.run then installs no handler of its own.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    store = AsyncRedisStore(redis.asyncio.Redis.from_url(url), Policy(prefix=prefix, lease=LEASE))
    try:
        asyncio.run(SCENARIOS[scenario](store))
    except KeyboardInterrupt:
        print("interrupted")
        return 0
    print("asyncio.run returned: no KeyboardInterrupt")
    return 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
