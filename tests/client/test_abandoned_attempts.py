"""An attempt the caller gave up on harms nothing after, through real servers.

A sync attempt runs in a worker thread that the caller leaves behind at the deadline or on an
interrupt (Ctrl-C). Two things went wrong there:

* an interrupt while the attempt waited for a pooled connection did not stop it: the thread
  got the connection later and sent the POST after the caller was told the call was
  interrupted (with ``post()``, never learning its key);
* over HTTP/2, the deadline shut down the socket of the attempt's connection, which every other
  request on it shares: one call's deadline failed the neighbours (other threads' calls,
  plain ``client.http`` requests). The abandoned stream is left to end instead: with its own
  read timeout, not one clipped to the deadline, since on HTTP/2 any read's timeout ends every
  stream of the connection (httpcore keeps the first read error for all of them).

The asyncio client cancels its attempt instead; the same cases run on it, as guards.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import pytest

from idemkey.client import AsyncClient, Client, RetriesExhaustedError, RetryPolicy
from tests._servers import AppServer, wait_until

from ._scripted_server import ScriptedServer, Seen, answer

ROOT = Path(__file__).resolve().parents[2]


class Interrupted(BaseException):
    """What the signal handler raises in the waiting caller, as Ctrl-C raises
    KeyboardInterrupt (one the test runner would take for the user's own)."""


def pool_requests(http: httpx.Client | httpx.AsyncClient) -> int:
    """How many requests httpcore's pool holds, sent or waiting for a connection (private: the
    pool tells nothing public about a request that waits)."""
    return len(http._transport._pool._requests)  # type: ignore[attr-defined]


@contextlib.contextmanager
def held_connection() -> Iterator[tuple[ScriptedServer, threading.Event]]:
    """A server whose GET answers once the event is set: a GET holds the client's only
    connection until then, while a POST answers at once."""
    release = threading.Event()

    def respond(seen: Seen) -> bytes:
        if seen.method == "GET":
            release.wait(10.0)
        return answer(200 if seen.method == "GET" else 201)

    with ScriptedServer(respond) as server:
        try:
            yield server, release
        finally:
            release.set()


@contextlib.contextmanager
def interrupt_when(ready: Any) -> Iterator[None]:
    """Raise :class:`Interrupted` in this (the main) thread once ``ready()`` holds, from a
    signal, as Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run in the main thread only")

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, handler)
    main = threading.get_ident()

    def fire() -> None:
        wait_until(ready, 10.0, "the attempt to wait for a pooled connection")
        signal.pthread_kill(main, signal.SIGUSR1)

    firing = threading.Thread(target=fire, daemon=True)
    firing.start()
    try:
        yield
    finally:
        firing.join(15.0)
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="POSIX signals")
def test_an_interrupted_call_never_sends_its_post_later() -> None:
    with held_connection() as (server, release):
        http = httpx.Client(
            base_url=server.url, timeout=10.0, limits=httpx.Limits(max_connections=1)
        )
        with http, Client(http, retry=RetryPolicy(deadline=10.0)) as client:
            download = threading.Thread(target=http.get, args=("/download",))
            download.start()
            wait_until(lambda: server.seen, 10.0, "the GET to hold the connection")
            with interrupt_when(lambda: pool_requests(http) == 2), pytest.raises(Interrupted):
                client.post("/charges", json={"amount": 1000})
            release.set()
            download.join(10.0)
            # The abandoned attempt got the connection then: it ends, sent or not.
            wait_until(lambda: pool_requests(http) == 0, 10.0, "the abandoned attempt to end")
    assert [seen.method for seen in server.seen] == ["GET"]


async def waiting(http: httpx.AsyncClient) -> None:
    """Until the call waits for the pooled connection the GET holds (the pool signals nothing)."""
    while pool_requests(http) < 2:  # noqa: ASYNC110
        await asyncio.sleep(0.005)


async def test_a_cancelled_async_call_never_sends_its_post_later() -> None:
    with held_connection() as (server, release):
        limits = httpx.Limits(max_connections=1)
        http = httpx.AsyncClient(base_url=server.url, timeout=10.0, limits=limits)
        async with http, AsyncClient(http, retry=RetryPolicy(deadline=10.0)) as client:
            download = asyncio.create_task(http.get("/download"))
            await asyncio.to_thread(wait_until, lambda: server.seen, 10.0, "the GET")
            call = asyncio.create_task(client.post("/charges", json={"amount": 1000}))
            await asyncio.wait_for(waiting(http), 10.0)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            release.set()
            await download
    assert [seen.method for seen in server.seen] == ["GET"]


@pytest.fixture(scope="module")
def h2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """hypercorn serving ``_h2_app``: HTTP/2 with prior knowledge on a free port."""
    pytest.importorskip("hypercorn")
    pytest.importorskip("h2")

    def command(port: int) -> list[str]:
        return [
            sys.executable, "-m", "hypercorn", "tests.client._h2_app:app",
            "--bind", f"127.0.0.1:{port}", "--log-level", "warning",
        ]  # fmt: skip

    log = tmp_path_factory.mktemp("hypercorn") / "hypercorn.log"
    with AppServer(command, log=log, cwd=ROOT, name="hypercorn", timeout=30.0) as server:
        yield server.url


NEIGHBOUR = 3.0  # seconds between the neighbour's head and the rest of its body
SLOW = 6.0  # the slow call's body comes this long after its head...
DEADLINE = 1.5  # ... and the call gives up long before (its head well within it, under load)


def h2_options(hook: Any) -> dict[str, Any]:
    # One connection: the slow call and its neighbour are two streams of it. The neighbour
    # starts once the slow call's head arrived (the hook sees each head), as in the audit: the
    # slow call's own thread is the one reading the connection then.
    limits = httpx.Limits(max_connections=1)
    return {"http1": False, "http2": True, "limits": limits, "event_hooks": {"response": [hook]}}


def test_a_deadline_on_http2_leaves_the_other_streams_alone(h2: str) -> None:
    slow_head = threading.Event()

    def hook(response: httpx.Response) -> None:
        if response.request.method == "POST":
            slow_head.set()

    outcome: list[object] = []
    retry = RetryPolicy(deadline=DEADLINE)
    with Client(base_url=h2, timeout=10.0, retry=retry, **h2_options(hook)) as client:
        client.http.get("/health")  # the connection, made

        def neighbour() -> None:
            try:
                assert slow_head.wait(10.0)
                response = client.http.get(f"/trickle/{NEIGHBOUR}")
                outcome.append((response.http_version, response.content))
            except Exception as exc:
                outcome.append(exc)

        thread = threading.Thread(target=neighbour)
        thread.start()
        with pytest.raises(RetriesExhaustedError) as gave_up:
            client.post(f"/trickle/{SLOW}", json={"amount": 1})
        # The head came before the give-up, so the neighbour was in flight when it fired (else
        # the test would pass on a connection opened after it).
        assert slow_head.is_set()
        # httpcore's sync HTTP/2 lets the thread that reads keep its lock: the neighbour may
        # wait until the slow stream ends. It must not fail.
        thread.join(SLOW + 10.0)
    assert gave_up.value.reason == "deadline"
    assert outcome == [("HTTP/2", b'{"ok": true}')]


async def test_an_async_deadline_on_http2_leaves_the_other_streams_alone(h2: str) -> None:
    slow_head = asyncio.Event()

    async def hook(response: httpx.Response) -> None:
        if response.request.method == "POST":
            slow_head.set()

    async def neighbour() -> tuple[str, bytes]:
        await slow_head.wait()
        response = await client.http.get(f"/trickle/{NEIGHBOUR}")
        return response.http_version, response.content

    retry = RetryPolicy(deadline=DEADLINE)
    async with AsyncClient(base_url=h2, timeout=10.0, retry=retry, **h2_options(hook)) as client:
        await client.http.get("/health")
        task = asyncio.create_task(neighbour())
        with pytest.raises(RetriesExhaustedError):
            await client.post(f"/trickle/{SLOW}", json={"amount": 1})
        assert slow_head.is_set()  # the neighbour was in flight when the deadline fired
        assert await asyncio.wait_for(task, SLOW + 10.0) == ("HTTP/2", b'{"ok": true}')
