"""The key a transport adds is the key httpx reports: ``response.request.headers``.

A user who mounts the transport on a plain httpx client and logs
``response.request.headers["Idempotency-Key"]`` to correlate a call with the server's records
must read the key the server received, through a real server, sync and async.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from idemkey.client import AsyncIdempotentTransport, IdempotentTransport

from ._slow_server import SlowServer


@pytest.fixture
def server() -> Iterator[SlowServer]:
    with SlowServer("fast") as running:
        yield running


def test_the_transports_key_is_on_the_reported_request(server: SlowServer) -> None:
    with httpx.Client(base_url=server.url, transport=IdempotentTransport()) as http:
        response = http.post("/charges", json={"amount": 1000})
    assert response.request.headers.get("Idempotency-Key") == server.seen[0]["idempotency-key"]


async def test_the_async_transports_key_is_on_the_reported_request(server: SlowServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, transport=AsyncIdempotentTransport()) as http:
        response = await http.post("/charges", json={"amount": 1000})
    assert response.request.headers.get("Idempotency-Key") == server.seen[0]["idempotency-key"]


def test_a_key_the_caller_set_is_the_one_reported(server: SlowServer) -> None:
    with httpx.Client(base_url=server.url, transport=IdempotentTransport()) as http:
        response = http.post("/charges", json={}, headers={"Idempotency-Key": "order-42"})
    assert response.request.headers["Idempotency-Key"] == "order-42"
    assert server.seen[0]["idempotency-key"] == "order-42"
