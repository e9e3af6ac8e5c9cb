"""The Flask extension reads and checks the request body as the WSGI middleware does (one
driver): a body shorter than its Content-Length is a 400 problem and the view never runs, also
when the server marks the stream as terminated (gunicorn sets ``wsgi.input_terminated``, and
werkzeug then trusts a short stream); the view still reads the whole body afterwards.
"""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any

import pytest
from flask import Flask, request

from idemkey import Policy, RedisStore
from idemkey.adapters.flask import Idemkey
from tests.adapters.harness import store_on
from tests.adapters.harness_wsgi import environ_for

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis), "fakeredis"])
def store(request: pytest.FixtureRequest, prefix: str) -> Iterator[RedisStore]:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    with store_on(url, Policy(prefix=prefix, max_request_bytes=64)) as store:
        yield store


def app_for(store: RedisStore) -> tuple[Flask, list[bytes]]:
    idem = Idemkey(store=store)
    app = Flask("body")
    seen: list[bytes] = []

    @app.post("/charges")
    @idem.idempotent
    def charges() -> Any:
        seen.append(request.get_data())
        return {"amount": request.form.get("amount")}, 201

    idem.init_app(app)
    return app, seen


def call(app: Flask, environ: dict[str, Any]) -> tuple[str, bytes]:
    started: list[str] = []

    def start_response(status: str, headers: Any, exc_info: Any = None) -> Any:
        started.append(status)
        return lambda data: None

    body = b"".join(app.wsgi_app(environ, start_response))
    return started[0], body


@pytest.mark.parametrize("terminated", [False, True], ids=["plain", "input-terminated"])
def test_a_body_shorter_than_its_content_length_never_reaches_the_view(
    store: RedisStore, terminated: bool
) -> None:
    app, seen = app_for(store)
    headers = [("Idempotency-Key", "k1"), ("Content-Type", "application/x-www-form-urlencoded")]
    environ = environ_for("POST", "/charges", headers, b"amount=10")
    environ["CONTENT_LENGTH"] = "12"  # the client sent 9 of 12 bytes, then closed
    environ["wsgi.input"] = io.BytesIO(b"amount=10")
    if terminated:
        environ["wsgi.input_terminated"] = True

    status, body = call(app, environ)

    assert status.startswith("400")
    assert json.loads(body)["code"] == "incomplete_body"
    assert seen == []


def test_the_view_reads_the_whole_body_after_idemkey_read_it(store: RedisStore) -> None:
    app, seen = app_for(store)
    headers = [("Idempotency-Key", "k2"), ("Content-Type", "application/x-www-form-urlencoded")]
    environ = environ_for("POST", "/charges", headers, b"amount=1000")
    environ["wsgi.input_terminated"] = True  # as gunicorn: werkzeug reads the raw stream

    status, body = call(app, environ)

    assert status.startswith("201")
    assert json.loads(body) == {"amount": "1000"}
    assert seen == [b"amount=1000"]
