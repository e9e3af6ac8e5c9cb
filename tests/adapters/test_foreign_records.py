"""A stored response is input: a record written by anything but idemkey never splits a replay.

Each test answers a first call, then rewrites the record's response as a foreign writer could
(idemkey never stores these: every server refuses to send them) and replays through every
adapter. The replay is the ``503 record_unreadable`` problem, nothing of the forged head goes
out, the handler does not run again and the record is left as it was.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest
import redis

from idemkey._codec import StoredResponse, decode_response, encode_response
from tests.adapters.conftest import HARNESSES
from tests.adapters.test_suite import assert_problem

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from idemkey import Policy
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
