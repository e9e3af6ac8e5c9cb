"""Policy.render_problem with Stripe's error shape: the official Stripe SDK, pointed at a real
HTTP server guarded by idemkey, raises its typed ``stripe.IdempotencyError`` on key reuse.

The server is the WSGI middleware around a tiny charges endpoint, served by werkzeug on a real
port, on the session's real Redis. ``mismatch_status=400`` is Stripe's status for key reuse (the
SDK maps a 400 with ``type: idempotency_error`` to ``IdempotencyError``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs

import pytest
import redis

from idemkey import Policy, RedisStore
from idemkey.adapters.wsgi import IdempotencyMiddleware
from idemkey.http import Problem
from idemkey.routes import Routes

stripe = pytest.importorskip("stripe")


def stripe_errors(problem: Problem) -> tuple[str, bytes]:
    """idemkey's answers in Stripe's error shape."""
    error = {"type": "idempotency_error", "code": problem.code, "message": problem.detail}
    return "application/json", json.dumps({"error": error}).encode()


def charges_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    form = parse_qs(environ["wsgi.input"].read(length).decode())
    charges_app.runs += 1  # type: ignore[attr-defined]
    charge = {
        "id": f"ch_{charges_app.runs}",  # type: ignore[attr-defined]
        "object": "charge",
        "amount": int(form["amount"][0]),
        "currency": form["currency"][0],
    }
    body = json.dumps(charge).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]


@pytest.fixture
def server(redis_url: str, prefix: str) -> Iterator[str]:
    from werkzeug.serving import make_server

    charges_app.runs = 0  # type: ignore[attr-defined]
    client = redis.Redis.from_url(redis_url)
    policy = Policy(prefix=prefix, mismatch_status=400, render_problem=stripe_errors)
    app = IdempotencyMiddleware(
        charges_app, RedisStore(client, policy), routes=Routes("/v1/charges")
    )
    httpd = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        thread.join(10)
        client.close()


def test_the_stripe_sdk_raises_its_idempotency_error(server: str) -> None:
    client = stripe.StripeClient(
        "sk_test_idemkey", base_addresses={"api": server}, max_network_retries=0
    )
    key = {"idempotency_key": "order-17"}
    first = client.v1.charges.create(params={"amount": 100, "currency": "eur"}, options=key)
    again = client.v1.charges.create(params={"amount": 100, "currency": "eur"}, options=key)
    assert first.id == again.id == "ch_1"  # the retry got the stored charge
    assert charges_app.runs == 1  # type: ignore[attr-defined]
    with pytest.raises(stripe.IdempotencyError) as caught:
        client.v1.charges.create(params={"amount": 999, "currency": "eur"}, options=key)
    assert caught.value.http_status == 400
    assert caught.value.error.code == "key_reused"
    assert charges_app.runs == 1  # type: ignore[attr-defined]
