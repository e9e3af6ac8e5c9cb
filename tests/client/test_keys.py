"""The key a caller gives is sent in a form the server reads as that key, and is ``operation.key``.

idemkey's server reads an ``Idempotency-Key`` bare (``order-42``) or as an RFC 8941 string
(``"order-42"``, the only form with ``strict_header=True``). The client used to accept the
quoted form and send it unquoted: ``"a b"`` went out as ``a b`` (400 ``invalid_key``), ``" a"``
as `` a`` (an httpx LocalProtocolError, or another key), and a strict server refused even
``"order-42"``. Now the caller's form goes on the wire, and a quoted key whose content is not a
bare key too (so that ``operation.key`` can be passed back) is an ``InvalidKeyError`` before
anything is sent.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

import httpx
import pytest
from werkzeug.serving import make_server

from idemkey import Policy
from idemkey.adapters.wsgi import IdempotencyMiddleware
from idemkey.client import Client, IdempotentTransport, RefusedError
from idemkey.errors import InvalidKeyError
from idemkey.testing import fake_store

from ._slow_server import SlowServer

#: Keys the server would read as another key (or refuse), or operation.key could not resend.
REFUSED = ['"a b"', '" a"', '"a "', '" "', '"\\"x"']


@pytest.fixture
def server() -> Iterator[SlowServer]:
    with SlowServer("fast") as running:
        yield running


@pytest.mark.parametrize("key", REFUSED)
def test_a_quoted_key_the_bare_form_cannot_carry_is_refused_before_sending(
    server: SlowServer, key: str
) -> None:
    with Client(base_url=server.url, timeout=2.0) as client:
        with pytest.raises(InvalidKeyError):
            client.prepare("POST", "/charges", json={}, idempotency_key=key)
        with pytest.raises(InvalidKeyError):
            client.post("/charges", json={}, headers={"Idempotency-Key": key})
    with (
        httpx.Client(base_url=server.url, transport=IdempotentTransport()) as http,
        pytest.raises(InvalidKeyError),
    ):
        http.post("/charges", json={}, headers={"Idempotency-Key": key})
    assert server.seen == []


@pytest.mark.parametrize(
    ("given", "sent", "key"),
    [('"order-42"', '"order-42"', "order-42"), ('  "a\\"b"\t', '"a\\"b"', 'a"b'),
     (" order-42 ", "order-42", "order-42")],
)  # fmt: skip
def test_the_key_goes_out_in_the_form_given(
    server: SlowServer, given: str, sent: str, key: str
) -> None:
    with Client(base_url=server.url, timeout=2.0) as client:
        operation = client.prepare("POST", "/charges", json={}, idempotency_key=given)
        reply = client.send(operation)
    with httpx.Client(base_url=server.url, transport=IdempotentTransport()) as http:
        response = http.post("/charges", json={}, headers={"Idempotency-Key": given})
    assert (operation.key, reply.key) == (key, key)
    assert response.request.headers["Idempotency-Key"] == sent  # what the server received
    assert [seen["idempotency-key"] for seen in server.seen] == [sent, sent]


@pytest.fixture
def strict() -> Iterator[str]:
    """idemkey's WSGI middleware on werkzeug with ``strict_header=True``: quoted keys only."""
    runs = 0

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        nonlocal runs
        runs += 1
        body = b'{"run": %d}' % runs
        start_response("201 Created", [("Content-Type", "application/json")])
        return [body]

    store = fake_store(Policy(strict_header=True, scope=lambda request: "tests"))
    running = make_server("127.0.0.1", 0, IdempotencyMiddleware(app, store), threaded=True)
    thread = threading.Thread(target=running.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{running.server_port}"
    finally:
        running.shutdown()
        thread.join(5)
        running.server_close()


def test_a_quoted_key_reaches_a_strict_server_as_the_key_reported(strict: str) -> None:
    with Client(base_url=strict, timeout=2.0) as client:
        first = client.post("/charges", json={"amount": 1}, idempotency_key='"a\\"b"')
        again = client.post("/charges", json={"amount": 1}, idempotency_key='"a\\"b"')
        with pytest.raises(RefusedError) as refused:  # strict: the bare form is refused
            client.post("/charges", json={"amount": 1}, idempotency_key=first.key)
    assert (first.status_code, first.key, first.replayed) == (201, 'a"b', False)
    assert (again.json(), again.replayed) == (first.json(), True)  # the server's key is 'a"b'
    assert refused.value.code == "invalid_key"
