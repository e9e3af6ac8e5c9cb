"""A keyed request keeps what the caller put on it, through real sockets.

* Request extensions: a transport rebuilt each attempt with ``{"timeout": ...}`` only, so a
  keyed POST lost httpcore's ``target`` (the server got another path), ``sni_hostname`` and
  ``trace``, which a GET through the same transport kept.
* A deadline of any size: ``RetryPolicy(deadline=sys.maxsize)`` with ``timeout=None`` made
  every sync call a raw ``OverflowError`` before anything was sent (the deadline became each
  socket timeout).
* A body that is an async stream: ``AsyncIdempotentTransport`` raised idemkey's
  ``ConfigurationError`` for an ordinary streaming upload; it is sent once, as it is.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from idemkey.client import (
    AsyncClient,
    AsyncIdempotentTransport,
    Client,
    IdempotentTransport,
    RetryPolicy,
)
from tests._servers import wait_until

from ._scripted_server import ScriptedServer, answer
from ._slow_server import SlowServer

TARGET = "/v1/files/a%2Fb"  # what httpx would send as /v1/files/a/b

#: One 503 first: the second attempt must carry the caller's extensions too.
RETRY = RetryPolicy(max_attempts=2, deadline=10.0, backoff=0.01, backoff_cap=0.01)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """503 first, then 201."""
    answers = iter([answer(503), answer(201)])
    with ScriptedServer(lambda _: next(answers, answer(201))) as running:
        yield running


def test_the_sync_transport_keeps_the_callers_extensions(server: ScriptedServer) -> None:
    events: list[str] = []
    extensions = {"target": TARGET.encode(), "trace": lambda event, info: events.append(event)}
    with httpx.Client(base_url=server.url, transport=IdempotentTransport(retry=RETRY)) as http:
        response = http.post("/ignored", json={}, extensions=extensions)
    assert response.status_code == 201
    assert [seen.target for seen in server.seen] == [TARGET, TARGET]
    assert events.count("http11.send_request_headers.started") == 2  # both attempts traced
    keys = {seen.headers["idempotency-key"] for seen in server.seen}
    assert keys == {response.request.headers["Idempotency-Key"]}


async def test_the_async_transport_keeps_the_callers_extensions(server: ScriptedServer) -> None:
    events: list[str] = []

    async def trace(event: str, info: dict[str, Any]) -> None:
        events.append(event)

    extensions = {"target": TARGET.encode(), "trace": trace}
    transport = AsyncIdempotentTransport(retry=RETRY)
    async with httpx.AsyncClient(base_url=server.url, transport=transport) as http:
        response = await http.post("/ignored", json={}, extensions=extensions)
    assert response.status_code == 201
    assert [seen.target for seen in server.seen] == [TARGET, TARGET]
    assert events.count("http11.send_request_headers.started") == 2


def test_the_callers_trace_leaves_the_deadline_its_own() -> None:
    """The sync attempt traces too (to find the socket it shuts at the deadline): both run."""
    events: list[str] = []
    extensions = {"trace": lambda event, info: events.append(event)}
    transport = IdempotentTransport(retry=RetryPolicy(deadline=0.5))
    with SlowServer("body", interval=0.1) as slow:
        with (
            httpx.Client(base_url=slow.url, timeout=5.0, transport=transport) as http,
            pytest.raises(httpx.TimeoutException),
        ):
            http.post("/charges", json={}, extensions=extensions)
        # The connection was dropped at the deadline, not at the end of a 10 s answer.
        wait_until(lambda: slow.left, 3.0, "the server to see the client leave")
    assert "connection.connect_tcp.complete" in events


def huge(shell: str, url: str) -> int:
    """A POST with no timeout and a deadline as long as an int can say, through ``shell``."""
    policy = RetryPolicy(deadline=sys.maxsize)
    if shell == "client":
        with Client(base_url=url, timeout=None, retry=policy) as client:
            return client.post("/charges", json={}).status_code
    with httpx.Client(base_url=url, timeout=None, transport=IdempotentTransport(retry=policy)) as h:
        return h.post("/charges", json={}).status_code


async def ahuge(shell: str, url: str) -> int:
    policy = RetryPolicy(deadline=sys.maxsize)
    if shell == "async-client":
        async with AsyncClient(base_url=url, timeout=None, retry=policy) as client:
            return (await client.post("/charges", json={})).status_code
    transport = AsyncIdempotentTransport(retry=policy)
    async with httpx.AsyncClient(base_url=url, timeout=None, transport=transport) as h:
        return (await h.post("/charges", json={})).status_code


@pytest.mark.parametrize("shell", ["client", "transport"])
def test_a_deadline_past_any_socket_timeout_is_no_timeout(shell: str) -> None:
    with ScriptedServer(lambda _: answer(201)) as running:
        assert huge(shell, running.url) == 201
    assert len(running.seen) == 1


@pytest.mark.parametrize("shell", ["async-client", "async-transport"])
async def test_a_deadline_past_any_timeout_is_no_timeout_async(shell: str) -> None:
    with ScriptedServer(lambda _: answer(201)) as running:
        assert await ahuge(shell, running.url) == 201
    assert len(running.seen) == 1


async def chunks() -> AsyncIterator[bytes]:
    yield b"chunk-1,"
    yield b"chunk-2"


@pytest.mark.parametrize("key", [None, "upload-7"], ids=["no-key", "own-key"])
async def test_an_async_stream_is_sent_once_as_it_is(
    key: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """It cannot be sent twice: no key is added and it is not retried, with a warning."""
    caplog.set_level(logging.WARNING, logger="idemkey.client")
    # A length of its own keeps the scripted server, which reads no chunked framing, in step.
    headers = {"Content-Length": "15"} | ({} if key is None else {"Idempotency-Key": key})
    with ScriptedServer(lambda _: answer(503)) as running:
        transport = AsyncIdempotentTransport(retry=RETRY)
        async with httpx.AsyncClient(base_url=running.url, transport=transport) as http:
            url = f"{running.url}/uploads?token=secret"
            response = await http.post(url, content=chunks(), headers=headers)
    assert response.status_code == 503  # not retried
    [seen] = running.seen
    assert seen.body == b"chunk-1,chunk-2"
    assert seen.headers.get("idempotency-key") == key  # as the caller sent it, or none
    [line] = [r.getMessage() for r in caplog.records if r.name == "idemkey.client"]
    assert line.startswith(f"POST {running.url}/uploads: the body is an async stream")
    assert "secret" not in line
