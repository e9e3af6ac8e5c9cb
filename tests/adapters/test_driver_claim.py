"""The drivers send the claim script themselves (issue 39): the same answers as ``store.claim``.

A policy that neither waits nor keeps tombstones, on a store without effects whose ``claim`` is
the library's own, is claimed by the driver without the ``store.claim`` frame; everything else
goes through ``store.claim``. These run each answer a claim can get (won, replayed, in flight,
reused with another body) through the WSGI and ASGI middlewares twice, once on each path, on
the real Redis, and hold the two alike: the answers, the won claim's heartbeat, the record.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
import redis
import redis.asyncio

from idemkey import AsyncRedisStore, Policy, RedisStore
from idemkey._core import fingerprint, record_for
from idemkey.adapters.asgi import IdempotencyMiddleware as AsgiMiddleware
from idemkey.adapters.wsgi import IdempotencyMiddleware as WsgiMiddleware
from idemkey.http import REPLAYED_HEADER
from idemkey.http._scope import NO_CREDENTIALS
from tests.adapters.harness_wsgi import environ_for

if TYPE_CHECKING:
    from collections.abc import Iterable

    from _typeshed.wsgi import StartResponse, WSGIEnvironment

pytestmark = pytest.mark.redis

Answer = tuple[int, bool, bytes]  # status, replayed, body
#: The fingerprint of the scenario's POST /charges with the body b"a" (no content type).
SENT = fingerprint("POST", "/charges", "", "", b"a")


class WrappedStore(RedisStore):
    """A store whose ``claim`` is a subclass's: the driver must call it, not step around it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.claims = 0

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        self.claims += 1
        return super().claim(*args, **kwargs)


class AsyncWrappedStore(AsyncRedisStore):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.claims = 0

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        self.claims += 1
        return await super().claim(*args, **kwargs)


def _refuse_claim(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the driver called store.claim for a policy it claims for itself")


def _wsgi_scenario(store: RedisStore) -> tuple[list[Answer], list[int]]:
    """Won, replayed, reused, in flight: the answers, and the leases held while the app ran."""
    held: list[int] = []

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        environ["wsgi.input"].read()
        held.append(len(store._leases))  # the won claim is renewed by the heartbeat
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b'{"id": "ch_1"}']

    guarded = WsgiMiddleware(app, store)

    def post(key: str, body: bytes) -> Answer:
        answer: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]], exc: Any = None) -> Any:
            answer.update(status=int(status[:3]), headers=dict(headers))

        environ = environ_for("POST", "/charges", [("Idempotency-Key", key)], body)
        chunks = guarded(environ, start_response)
        sent = b"".join(chunks)
        getattr(chunks, "close", lambda: None)()
        return answer["status"], answer["headers"].get(REPLAYED_HEADER) == "true", sent

    policy = store.policy
    busy = record_for(policy.prefix, NO_CREDENTIALS, "POST", "/charges", "busy")
    elsewhere = RedisStore(store.client, policy)  # another process holds "busy"
    elsewhere.claim(busy, SENT, heartbeat=False)
    answers = [post("k", b"a"), post("k", b"a"), post("k", b"b"), post("busy", b"a")]
    return answers, held


def _summary(answers: list[Answer]) -> list[tuple[int, bool, str]]:
    return [(status, again, json.loads(body).get("id", "")) for status, again, body in answers]


EXPECTED = [(201, False, "ch_1"), (201, True, "ch_1"), (422, False, ""), (409, False, "")]


def test_the_wsgi_driver_claims_itself_and_answers_as_store_claim_does(
    real_client: redis.Redis, prefix: str
) -> None:
    plain = RedisStore(real_client, Policy(prefix=f"{prefix}own"))
    plain.claim = _refuse_claim  # type: ignore[method-assign]  # the instance's, not the type's
    wrapped = WrappedStore(real_client, Policy(prefix=f"{prefix}wrapped"))
    try:
        own, own_held = _wsgi_scenario(plain)
        theirs, their_held = _wsgi_scenario(wrapped)
    finally:
        plain.close()
        wrapped.close()
    assert _summary(own) == _summary(theirs) == EXPECTED
    assert own_held == their_held == [1]
    assert wrapped.claims == 4  # the subclass's claim ran for every request


@pytest.mark.parametrize("options", [{"wait": 1.0}, {"expired_grace": 60.0}])
def test_a_policy_that_waits_or_keeps_tombstones_is_claimed_by_the_store(
    real_client: redis.Redis, prefix: str, options: dict[str, float]
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix, **options))
    calls: list[str] = []
    claim = store.claim

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append("claim")
        return claim(*args, **kwargs)

    store.claim = counted  # type: ignore[method-assign]
    try:
        answers, _ = _wsgi_scenario(store)
    finally:
        store.close()
    assert _summary(answers)[:3] == EXPECTED[:3]
    assert len(calls) == 4


async def _asgi_scenario(store: AsyncRedisStore) -> tuple[list[Answer], list[int]]:
    held: list[int] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        held.append(len(store._leases))
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"id": "ch_1"}'})

    guarded = AsgiMiddleware(app, store)

    async def post(key: str, body: bytes) -> Answer:
        messages: list[dict[str, Any]] = []
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/charges",
            "query_string": b"",
            "headers": [(b"idempotency-key", key.encode()), (b"content-length", b"1")],
        }

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            messages.append(message)

        await guarded(scope, receive, send)
        start = messages[0]
        headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
        sent = b"".join(m.get("body", b"") for m in messages[1:])
        return start["status"], headers.get(REPLAYED_HEADER.lower()) == "true", sent

    busy = record_for(store.policy.prefix, NO_CREDENTIALS, "POST", "/charges", "busy")
    await AsyncRedisStore(store.client, store.policy).claim(busy, SENT, heartbeat=False)
    answers = [await post("k", b"a"), await post("k", b"a")]
    answers += [await post("k", b"b"), await post("busy", b"a")]
    return answers, held


async def test_the_asgi_driver_claims_itself_and_answers_as_store_claim_does(
    real_async_client: redis.asyncio.Redis, prefix: str
) -> None:
    plain = AsyncRedisStore(real_async_client, Policy(prefix=f"{prefix}own"))
    plain.claim = _refuse_claim  # type: ignore[method-assign]
    wrapped = AsyncWrappedStore(real_async_client, Policy(prefix=f"{prefix}wrapped"))
    try:
        own, own_held = await _asgi_scenario(plain)
        theirs, their_held = await _asgi_scenario(wrapped)
    finally:
        await plain.aclose()
        await wrapped.aclose()
    assert _summary(own) == _summary(theirs) == EXPECTED
    assert own_held == their_held == [1]
    assert wrapped.claims == 4
