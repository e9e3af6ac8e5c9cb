"""The shared WSGI body capture (idemkey/adapters/_environ.py) in-process: what the app reads
afterwards, and the Flask extension's refusal when the body was consumed without its layer."""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any

import pytest
from flask import Flask, request

from idemkey import Policy, RedisStore
from idemkey.adapters._environ import BodyError, capture
from idemkey.adapters.flask import Idemkey
from tests.adapters.harness import sync_redis

if TYPE_CHECKING:
    from collections.abc import Iterator


def environ(body: bytes, *, length: str | None = None, chunked: bool = False) -> dict[str, Any]:
    env: dict[str, Any] = {"REQUEST_METHOD": "POST", "wsgi.input": io.BytesIO(body)}
    if length is not None:
        env["CONTENT_LENGTH"] = length
    if chunked:
        env["wsgi.input_terminated"] = True
    return env


def test_a_captured_body_is_put_back_for_the_app() -> None:
    env = environ(b"amount=10", length="9")
    assert capture(env, 100) == b"amount=10"
    assert env["wsgi.input"].read() == b"amount=10"
    assert env["CONTENT_LENGTH"] == "9"


def test_a_chunked_body_over_the_limit_stays_whole_for_the_app() -> None:
    env = environ(b"x" * 50, chunked=True)
    found = capture(env, 10)
    assert isinstance(found, BodyError)
    assert found.code == "request_too_large"
    assert env["wsgi.input"].read() == b"x" * 50  # an unguarded view still reads it all


def test_a_declared_length_over_the_limit_is_not_read() -> None:
    env = environ(b"x" * 50, length="50")
    found = capture(env, 10)
    assert isinstance(found, BodyError)
    assert found.code == "request_too_large"
    assert env["wsgi.input"].tell() == 0


def test_a_stream_that_fails_is_invalid_body() -> None:
    class Broken(io.RawIOBase):
        def read(self, size: int = -1) -> bytes:
            raise OSError("Invalid chunk header")

    env = environ(b"", chunked=True)
    env["wsgi.input"] = Broken()
    found = capture(env, 10)
    assert found == BodyError("invalid_body", "the body could not be read (OSError)")


@pytest.fixture
def store(redis_url: str, prefix: str) -> Iterator[RedisStore]:
    store = RedisStore(sync_redis(redis_url), Policy(prefix=prefix))
    try:
        yield store
    finally:
        store.close()
        store.client.close()


def test_flask_refuses_a_body_consumed_without_its_capture_layer(store: RedisStore) -> None:
    app = Flask("no_layer")
    idem = Idemkey(app, store=store)
    runs: list[bytes] = []

    @app.before_request
    def parse_form() -> None:
        request.form.get("csrf_token")

    @app.post("/charges")
    @idem.idempotent
    def charges() -> Any:
        runs.append(request.get_data())
        return {"ok": True}, 201

    app.wsgi_app = app.wsgi_app.app  # type: ignore[attr-defined,method-assign]  # layer removed
    client = app.test_client()
    headers = {"Idempotency-Key": "k1", "Content-Type": "application/x-www-form-urlencoded"}
    reply = client.post("/charges", data=b"amount=10", headers=headers)
    assert reply.status_code == 500
    assert json.loads(reply.data)["code"] == "body_unavailable"
    assert runs == []


def test_flask_reads_the_body_itself_when_nothing_consumed_it(store: RedisStore) -> None:
    app = Flask("no_layer_untouched")
    idem = Idemkey(app, store=store)

    @app.post("/charges")
    @idem.idempotent
    def charges() -> Any:
        return {"body": request.get_data().decode()}, 201

    app.wsgi_app = app.wsgi_app.app  # type: ignore[attr-defined,method-assign]  # layer removed
    client = app.test_client()
    headers = {"Idempotency-Key": "k2", "Content-Type": "application/x-www-form-urlencoded"}
    first = client.post("/charges", data=b"amount=10", headers=headers)
    assert first.status_code == 201
    assert first.json == {"body": "amount=10"}
    other = client.post("/charges", data=b"amount=11", headers=headers)
    assert other.status_code == 422
