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
    # msgspec checks a Struct's constraints when it decodes one, not when it is built.
    bad = StoredResponse(201, (*first.headers, *headers), first.body, reason=reason)
    client.hset(record, "resp", encode_response(bad))
    written = client.hgetall(record)

    reply = post(harness, key)

    assert_problem(reply, 503, "record_unreadable")
    assert not reply.header_all("Set-Cookie")
    assert all("forged" not in name + value for name, value in reply.headers)
    assert harness.executions["matrix"] == 1
    assert client.hgetall(record) == written
