"""The key a transport adds is the key httpx reports: ``response.request.headers``.

A user who mounts the transport on a plain httpx client and logs
``response.request.headers["Idempotency-Key"]`` to correlate a call with the server's records
must read the key the server received, through a real server, sync and async.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from idemkey.client import AsyncIdempotentTransport, Client, IdempotentTransport
from idemkey.errors import InvalidKeyError

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


def test_an_empty_key_the_caller_set_is_refused_before_sending(server: SlowServer) -> None:
    """An empty header is an invalid key, as a blank one is; it was replaced by a random UUID."""
    for key in ("", " "):
        with (
            httpx.Client(base_url=server.url, transport=IdempotentTransport()) as http,
            pytest.raises(InvalidKeyError, match="empty"),
        ):
            http.post("/charges", json={}, headers={"Idempotency-Key": key})
        with Client(base_url=server.url) as client, pytest.raises(InvalidKeyError, match="empty"):
            client.post("/charges", json={}, headers={"Idempotency-Key": key})
    assert server.seen == []


async def test_the_async_transport_refuses_an_empty_key_before_sending(server: SlowServer) -> None:
    transport = AsyncIdempotentTransport()
    async with httpx.AsyncClient(base_url=server.url, transport=transport) as http:
        with pytest.raises(InvalidKeyError, match="empty"):
            await http.post("/charges", json={}, headers={"Idempotency-Key": ""})
    assert server.seen == []
