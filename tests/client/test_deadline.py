"""``RetryPolicy.deadline`` bounds the whole call, against a real server that trickles.

A byte every 0.1 s never lets a read time out, so only a bound on the call itself stops it:
each caller here (the two clients and the two transports, built as docs/client.md shows) gives up
within a second of its deadline (slack for a loaded box; the whole answer takes 10 s), with its
documented error, whether the server trickles the body or the head; and the connection the
attempt held is closed then, not when the server is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from idemkey.client import (
    AsyncClient,
    AsyncIdempotentTransport,
    Client,
    IdempotentTransport,
    RetriesExhaustedError,
    RetryPolicy,
)
from tests._servers import wait_until

from ._slow_server import Mode, SlowServer

DEADLINE = 0.75  # under the 2 s read timeout: only the deadline can end the attempt
# Under the read timeout too, and far under the 10 s answer. Half a second was not enough on a
# 2-core box running four test workers beside other suites: 1.25-1.44 s seen, building the
# client and its event loop counted then; only the call is timed now.
MARGIN = 1.0
# 100 bytes at 0.1 s: a 10 s answer, and no read ever waits more than 0.1 s.
INTERVAL = 0.1


class Clock:
    """When the call itself started and ended: the deadline bounds that, not the set-up."""

    def __init__(self) -> None:
        self.started = self.ended = 0.0

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        self.started = time.monotonic()
        try:
            yield
        finally:
            self.ended = time.monotonic()


def via_client(url: str, clock: Clock) -> object:
    retry = RetryPolicy(deadline=DEADLINE)
    with Client(base_url=url, timeout=2.0, retry=retry) as client, clock.call():
        return client.post("/charges", json={"amount": 1000})


def via_async_client(url: str, clock: Clock) -> object:
    async def call() -> object:
        retry = RetryPolicy(deadline=DEADLINE)
        async with AsyncClient(base_url=url, timeout=2.0, retry=retry) as client:
            with clock.call():
                return await client.post("/charges", json={"amount": 1000})

    return asyncio.run(call())


def via_transport(url: str, clock: Clock) -> object:
    transport = IdempotentTransport(retry=RetryPolicy(deadline=DEADLINE))
    with httpx.Client(base_url=url, timeout=2.0, transport=transport) as http, clock.call():
        return http.post("/charges", json={"amount": 1000})


def via_async_transport(url: str, clock: Clock) -> object:
    async def call() -> object:
        transport = AsyncIdempotentTransport(retry=RetryPolicy(deadline=DEADLINE))
        async with httpx.AsyncClient(base_url=url, timeout=2.0, transport=transport) as http:
            with clock.call():
                return await http.post("/charges", json={"amount": 1000})

    return asyncio.run(call())


CALLERS: dict[str, tuple[Callable[[str, Clock], object], type[Exception]]] = {
    # The clients raise their own error; the transports raise only httpx errors.
    "client": (via_client, RetriesExhaustedError),
    "async-client": (via_async_client, RetriesExhaustedError),
    "transport": (via_transport, httpx.TimeoutException),
    "async-transport": (via_async_transport, httpx.TimeoutException),
}


@pytest.fixture(params=["body", "head"])
def trickling(request: pytest.FixtureRequest) -> Iterator[SlowServer]:
    mode: Mode = request.param
    with SlowServer(mode, interval=INTERVAL, size=100) as server:
        yield server


@pytest.mark.parametrize("caller", list(CALLERS))
def test_the_deadline_bounds_a_trickled_answer(trickling: SlowServer, caller: str) -> None:
    call, error = CALLERS[caller]
    clock = Clock()
    try:
        outcome: object = call(trickling.url, clock)
    except Exception as exc:
        outcome = exc
    ended = clock.ended
    elapsed = ended - clock.started
    assert isinstance(outcome, error), f"{outcome!r} after {elapsed:.1f} s"
    assert elapsed < DEADLINE + MARGIN, f"{outcome!r} after {elapsed:.1f} s"
    if isinstance(outcome, RetriesExhaustedError):
        assert outcome.reason == "deadline"
        assert isinstance(outcome.__cause__, httpx.TimeoutException)
    assert len(trickling.seen) == 1  # no attempt started that could not finish in time
    # The attempt's connection is dropped at the deadline: the server notices within a few
    # of its writes, long before its 10 s answer is through.
    wait_until(lambda: trickling.left, 2.0, "the server to see the client leave")
    assert trickling.left[0] - ended < 1.0


FORKED = """
import os, sys
from idemkey.client import Client, RetryPolicy

with Client(base_url=sys.argv[1], retry=RetryPolicy(deadline=5.0)) as client:
    client.post("/charges", json={})  # the parent now has an idle attempt thread
    child = os.fork()
    if child == 0:  # none of the parent's threads came along: the call must not wait for one
        os._exit(0 if client.post("/charges", json={}).status_code == 200 else 1)
    _, status = os.waitpid(child, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_a_forked_child_gets_its_own_attempt_threads() -> None:
    """A Celery prefork child calls with the client its parent imported and used."""
    with SlowServer("fast") as server:
        done = subprocess.run(
            [sys.executable, "-c", FORKED, server.url], timeout=30, capture_output=True
        )
    assert done.returncode == 0, done.stderr.decode()
    assert len(server.seen) == 2
