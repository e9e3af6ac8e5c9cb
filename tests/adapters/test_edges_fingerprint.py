"""Issue 10, item 6, through real servers and real clients: what makes two sends one request.

httpx picks a new multipart boundary per call, so a retried upload differs in its bytes and
must still replay; Content-Encoding is part of the request; ``Policy(fingerprint="json")``
and a callable compare what the API means, not the bytes.
"""

from __future__ import annotations

import gzip
import json
import uuid
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.adapters.edge_servers import ASGI_SERVED, WSGI, WSGI_SERVED, Server, servers

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.redis
__all__ = ["servers"]  # the fixture, imported

ALL_SERVERS = [*WSGI_SERVED, *ASGI_SERVED]


@pytest.fixture(params=ALL_SERVERS)
def server(request: pytest.FixtureRequest, servers: Callable[[str, str], Server]) -> Server:
    return servers(*request.param)


def new_key() -> str:
    return "k" + uuid.uuid4().hex[:16]


def upload(
    server: Server, key: str, content: bytes, filename: str = "receipt.txt"
) -> httpx.Response:
    """One multipart upload from a fresh httpx client: a new random boundary every call."""
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=15) as client:
        return client.post(
            "/charges",
            headers={"Idempotency-Key": key},
            data={"amount": "10", "currency": "eur"},
            files={"receipt": (filename, content, "text/plain")},
        )


def test_multipart_retry_with_a_new_boundary_replays(server: Server) -> None:
    key = new_key()
    first = upload(server, key, b"paid in full\n")
    assert first.status_code == 201, first.text
    retry = upload(server, key, b"paid in full\n")
    boundary = first.request.headers["content-type"]
    assert retry.request.headers["content-type"] != boundary  # the client changed the bytes
    assert retry.status_code == 201, retry.text
    assert retry.headers["idempotent-replayed"] == "true"
    assert retry.content == first.content
    assert server.runs(key) == 1


@pytest.mark.parametrize(
    ("content", "filename"), [(b"paid in part\n", "receipt.txt"), (b"paid in full\n", "other.txt")]
)
def test_multipart_with_another_part_is_another_request(
    server: Server, content: bytes, filename: str
) -> None:
    key = new_key()
    assert upload(server, key, b"paid in full\n").status_code == 201
    other = upload(server, key, content, filename)
    assert other.status_code == 422, other.text
    problem = other.json()
    assert problem["code"] == "key_reused"
    assert "resend the identical request for a retry" in problem["detail"]
    assert "use a new key only for a new operation" in problem["detail"]
    assert server.runs(key) == 1


def test_content_encoding_is_part_of_the_request(server: Server) -> None:
    key = new_key()
    body = gzip.compress(b'{"amount": 10}', mtime=0)
    headers = [("Idempotency-Key", key), ("Content-Type", "application/json")]
    first = server.post("/charges", body, [*headers, ("Content-Encoding", "gzip")])
    assert first.status == 201, first
    same = server.post("/charges", body, [*headers, ("Content-Encoding", "gzip")])
    assert same.header("Idempotent-Replayed") == "true"
    plain = server.post("/charges", body, headers)  # the same bytes, not declared gzip
    assert plain.status == 422, plain
    assert server.runs(key) == 1


@pytest.mark.parametrize("where", WSGI)
def test_json_fingerprint_ignores_key_order_and_whitespace(
    servers: Callable[[str, str], Server], where: str
) -> None:
    app = servers(where, "flask")
    key = new_key()
    headers = [("Idempotency-Key", key), ("Content-Type", "application/json")]
    first = app.post("/json", b'{"amount": 10, "currency": "eur"}', headers)
    assert first.status == 201, first
    same = app.post("/json", b'{\n  "currency":"eur",\n  "amount":10\n}', headers)
    assert same.status == 201, same
    assert same.header("Idempotent-Replayed") == "true"
    other = app.post("/json", b'{"currency": "eur", "amount": 11}', headers)
    assert other.status == 422, other
    # The same key on /charges (bytes) would have refused the reordered body; /json is its own
    # route, so this checks the mode, not a route difference:
    bytes_key = new_key()
    headers = [("Idempotency-Key", bytes_key), ("Content-Type", "application/json")]
    assert app.post("/charges", b'{"a": 1, "b": 2}', headers).status == 201
    assert app.post("/charges", b'{"b": 2, "a": 1}', headers).status == 422
    assert app.runs(key) == 1


def test_json_fingerprint_compares_a_non_json_body_as_bytes(
    servers: Callable[[str, str], Server],
) -> None:
    app = servers("gunicorn", "flask")
    key = new_key()
    headers = [("Idempotency-Key", key), ("Content-Type", "application/json")]
    assert app.post("/json", b"amount=10", headers).status == 201
    assert app.post("/json", b"amount=10", headers).header("Idempotent-Replayed") == "true"
    assert app.post("/json", b"amount=11", headers).status == 422
    assert app.post("/json", b"amount = 10", headers).status == 422
    assert app.runs(key) == 1


def test_callable_fingerprint_leaves_out_a_volatile_field(
    servers: Callable[[str, str], Server],
) -> None:
    app = servers("werkzeug", "flask")
    key = new_key()
    headers = [("Idempotency-Key", key), ("Content-Type", "application/json")]
    first = app.post("/nonce", json.dumps({"amount": 10, "nonce": "a1"}).encode(), headers)
    assert first.status == 201, first
    retry = app.post("/nonce", json.dumps({"amount": 10, "nonce": "b2"}).encode(), headers)
    assert retry.header("Idempotent-Replayed") == "true", retry
    assert retry.body == first.body
    other = app.post("/nonce", json.dumps({"amount": 11, "nonce": "a1"}).encode(), headers)
    assert other.status == 422, other
    assert app.runs(key) == 1
