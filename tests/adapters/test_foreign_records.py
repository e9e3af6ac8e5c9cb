"""A stored response is input: a record written by anything but idemkey never splits a replay.

Each test answers a first call, then rewrites the record's response as a foreign writer could
and replays through every adapter. The replay is the ``503 record_unreadable`` problem, nothing
of the forged head goes out, the handler does not run again and the record is left as it was.
idemkey itself never stores such a head: a line a replay would refuse, which some servers send
(werkzeug's a CR LF, uvicorn's httptools a name with a space), is left out of the record, and
the rest is stored (the last tests here).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest
import redis
import redis.asyncio

from idemkey import AsyncRedisStore, Policy, RedisStore
from idemkey._codec import StoredResponse, decode_response, encode_response
from idemkey.adapters import asgi, wsgi
from tests.adapters.conftest import HARNESSES
from tests.adapters.harness import store_on
from tests.adapters.test_asgi import call, start
from tests.adapters.test_suite import assert_problem
from tests.adapters.test_wsgi import Server

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from tests.adapters.harness import Harness, Reply

on_every_adapter = pytest.mark.parametrize(
    "harness_kind",
    [pytest.param((name, "redis"), id=name, marks=pytest.mark.redis) for name in HARNESSES],
    indirect=True,
)

#: (header lines, reason phrase) a replay must not send.
FORGED = {
    "crlf-in-value": ([("X-A", "1\r\nSet-Cookie: session=forged")], ""),
    "lf-in-value": ([("X-A", "1\nSet-Cookie: session=forged")], ""),
    "colon-in-name": ([("Set-Cookie: session=forged; X-A", "1")], ""),
    "crlf-in-name": ([("X-A: 1\r\nSet-Cookie", "session=forged")], ""),
    "nul-in-value": ([("X-A", "1\x00Set-Cookie: session=forged")], ""),
    "past-latin-1": ([("X-A", "\u20ac Set-Cookie")], ""),
    "empty-name": ([("", "Set-Cookie: session=forged")], ""),
    "crlf-in-reason": ([], "Created\r\nSet-Cookie: session=forged"),
    # h11 sends these (uvicorn, hypercorn, werkzeug's and waitress's servers too); gunicorn
    # answers 500 for each, so a replay there would fail on every retry.
    "soh-in-value": ([("X-A", "1\x01forged")], ""),
    "del-in-value": ([("X-A", "1\x7fforged")], ""),
    "esc-in-value": ([("X-A", "\x1b[31mforged")], ""),
    "soh-in-reason": ([], "Created\x01forged"),
}


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_url)
    yield conn
    conn.close()


def post(harness: Harness, key: str) -> Reply:
    headers = [("Idempotency-Key", key), ("Content-Type", "application/json")]
    return harness.request("POST", "/matrix/json", headers=headers, body=b"{}")


@on_every_adapter
@pytest.mark.parametrize("forged", list(FORGED), ids=list(FORGED))
def test_a_forged_head_is_a_503_problem_and_nothing_of_it_is_sent(
    make_harness: Callable[..., Harness], base_policy: Policy, client: redis.Redis, forged: str
) -> None:
    harness = make_harness()
    key = uuid.uuid4().hex
    before = set(client.scan_iter(match=f"{base_policy.prefix}:*"))
    assert post(harness, key).status == 201
    (record,) = set(client.scan_iter(match=f"{base_policy.prefix}:*")) - before
    stored = client.hget(record, "resp")
    assert stored is not None
    first = decode_response(stored)
    headers, reason = FORGED[forged]
    # encode_response stores what it is given: the check is on the way out, as a record is read.
    bad = StoredResponse(201, (*first.headers, *headers), first.body, reason=reason)
    client.hset(record, "resp", encode_response(bad))
    written = client.hgetall(record)

    reply = post(harness, key)

    assert_problem(reply, 503, "record_unreadable")
    assert not reply.header_all("Set-Cookie")
    assert all("forged" not in name + value for name, value in reply.headers)
    assert harness.executions["matrix"] == 1
    assert client.hgetall(record) == written


@on_every_adapter
@pytest.mark.parametrize("on_store_error", ["closed", "open"])
def test_a_forged_step_name_is_a_503_problem_and_never_a_run(
    make_harness: Callable[..., Harness],
    base_policy: Policy,
    client: redis.Redis,
    on_store_error: str,
) -> None:
    # A released record (the app answered 500, not stored) with a step field whose name is
    # not UTF-8: the claim script claims it, its reply cannot be read, the claim is given
    # back. Redis answered, so this is no store failure: "open" does not run the app beside
    # the record.
    harness = make_harness(on_store_error=on_store_error)
    key = uuid.uuid4().hex
    before = set(client.scan_iter(match=f"{base_policy.prefix}:*"))
    headers = [("Idempotency-Key", key), ("Content-Type", "application/json")]
    assert harness.request("POST", "/fail500", headers=headers, body=b"{}").status == 500
    (record,) = set(client.scan_iter(match=f"{base_policy.prefix}:*")) - before
    client.hset(record, mapping={"ns": "1", b"s:\xff": b"\x01\x01"})  # "ns": steps to read

    for _ in range(2):
        reply = harness.request("POST", "/fail500", headers=headers, body=b"{}")
        body = assert_problem(reply, 503, "record_unreadable")
        assert "not UTF-8" in body["detail"]
    assert harness.executions["fail500"] == 1
    assert client.hget(record, "owner") is None  # each claim given back


@on_every_adapter
@pytest.mark.parametrize("on_store_error", ["closed", "open"])
def test_a_key_of_another_type_at_the_record_name_is_a_503_unreadable_and_never_a_run(
    make_harness: Callable[..., Harness],
    base_policy: Policy,
    client: redis.Redis,
    on_store_error: str,
) -> None:
    # A string (a stranger's SET, damage) where the record's hash should be: Redis refuses the
    # claim's HMGET (WRONGTYPE), which was taken for "Redis failed": 503 store_unavailable,
    # "retry with the same key", for as long as the key lived, or under "open" a run on every
    # retry. Redis answered: it is a record idemkey cannot read, as the forged step name above.
    harness = make_harness(on_store_error=on_store_error)
    key = uuid.uuid4().hex
    before = set(client.scan_iter(match=f"{base_policy.prefix}:*"))
    headers = [("Idempotency-Key", key), ("Content-Type", "application/json")]
    assert harness.request("POST", "/fail500", headers=headers, body=b"{}").status == 500
    (record,) = set(client.scan_iter(match=f"{base_policy.prefix}:*")) - before
    client.delete(record)
    client.set(record, "not a hash")

    for _ in range(2):
        reply = harness.request("POST", "/fail500", headers=headers, body=b"{}")
        body = assert_problem(reply, 503, "record_unreadable")
        assert "not an idemkey record: a string" in body["detail"]
    assert harness.executions["fail500"] == 1
    assert client.get(record) == b"not a hash"  # left as it was: forget is the remedy


@pytest.fixture
def wsgi_store(redis_url: str, prefix: str) -> Iterator[RedisStore]:
    with store_on(redis_url, Policy(prefix=prefix)) as store:
        yield store


@pytest.mark.redis
def test_a_wsgi_head_a_replay_would_refuse_is_stored_without_those_lines(
    wsgi_store: RedisStore,
) -> None:
    # What werkzeug's server sends as it is: a CR LF (a split header), an int (as "%s": "3"),
    # bytes ("b'...'"), a name with a space, a control byte (gunicorn answers 500 for it). The
    # record completes (releasing would run the handler again), without the lines a replay
    # would refuse; an int is kept as its digits.
    runs: list[int] = []
    lines = [
        ("Content-Type", "application/json"),
        ("X-Trace", "a\r\nX-Injected: 1"),
        ("X-Count", 3),
        (b"X-Bytes-Name", "v"),
        ("X-Bytes-Value", b"v"),
        ("X Space", "v"),
        ("X-Nul", "a\x00b"),
        ("X-Euro", "\u20ac"),
        ("X-Flag", True),
        ("X-Control", "a\x01b"),  # werkzeug's and waitress's servers send it, gunicorn 500
        ("X-Delete", "a\x7fb"),
        ("Location", "/things/1"),
    ]

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        runs.append(1)
        start_response("201 Created\r\nX-Reason: 1", list(lines))  # type: ignore[arg-type]
        return [b'{"id": 1}']

    middleware = wsgi.IdempotencyMiddleware(app, wsgi_store)
    assert Server().call(middleware) == b'{"id": 1}'
    replay = Server()
    assert replay.call(middleware) == b'{"id": 1}'
    assert replay.status == "201 Created"  # the standard phrase for one that would split
    assert replay.headers == [
        ("Content-Type", "application/json"),
        ("X-Count", "3"),
        ("Location", "/things/1"),
        ("Idempotent-Replayed", "true"),
    ]
    assert runs == [1]


async def test_an_asgi_head_a_replay_would_refuse_is_stored_without_those_lines(
    asgi_store: AsyncRedisStore,
) -> None:
    runs: list[int] = []

    async def app(scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        await receive()
        runs.append(1)
        head = start(201)
        head["headers"] += [
            (b"x-trace", b"a\r\nx-injected: 1"),
            (b"x space", b"v"),
            (b"x-nul", b"a\x00b"),
            (b"x:colon", b"v"),
            (b"x-control", b"a\x01b"),  # h11 sends it (uvicorn, hypercorn), gunicorn 500
            (b"x-delete", b"a\x7fb"),
            (b"location", b"/things/1"),
        ]
        await send(head)
        await send({"type": "http.response.body", "body": b'{"id": 1}'})

    middleware = asgi.IdempotencyMiddleware(app, asgi_store)
    await call(middleware)
    replay = await call(middleware)
    assert (replay.status, replay.body) == (201, b'{"id": 1}')
    (head,) = [m for m in replay.sent if m["type"] == "http.response.start"]
    assert head["headers"] == [
        (b"content-type", b"application/json"),
        (b"location", b"/things/1"),
        (b"Idempotent-Replayed", b"true"),
    ]
    assert runs == [1]


@pytest.mark.redis
def test_a_wsgi_reason_phrase_gunicorn_refuses_is_stored_as_the_standard_one(
    wsgi_store: RedisStore,
) -> None:
    # werkzeug's server and waitress send a reason phrase with a control byte as it is;
    # gunicorn refuses the status line (500): stored, it would fail every replay there.
    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        start_response("201 Charged\x01OK", [("Content-Type", "application/json")])
        return [b'{"id": 1}']

    middleware = wsgi.IdempotencyMiddleware(app, wsgi_store)
    first = Server()
    assert first.call(middleware) == b'{"id": 1}'
    assert first.status == "201 Charged\x01OK"  # the first answer is the app's, as it is
    replay = Server()
    assert replay.call(middleware) == b'{"id": 1}'
    assert replay.status == "201 Created"
    assert ("Idempotent-Replayed", "true") in replay.headers
