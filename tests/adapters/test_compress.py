"""Policy(compress=...) through every HTTP adapter, on the session's real Redis.

A 10 KiB JSON page of orders (``benchmarks.compression.orders_json``) is stored compressed,
replays byte for byte with the same header lines, and takes less Redis memory. Records written
with compression replay under a policy without it and the other way round (the policy may
change during retention), and a damaged compressed record is idemkey's 503 problem, not a 500.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest
import redis

from benchmarks.compression import orders_json
from idemkey._codec import COMPRESSED_FORMAT, FORMAT_VERSION
from tests.adapters.harness import MATRIX, decision_only
from tests.adapters.test_response_matrix import REPLAYED, lowered, stored_lines
from tests.adapters.test_suite import assert_problem

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from idemkey import Policy
    from tests.adapters.harness import Harness, Reply

BODY = orders_json()
ORDERS_HEADERS = [("Content-Type", "application/json"), ("X-Page", "1")]
LIMITS = {"max_response_bytes": 64 * 1024}


@pytest.fixture
def orders(monkeypatch: pytest.MonkeyPatch, harness_kind: tuple[str, str]) -> None:
    """POST /matrix/orders answers the 10 KiB page; real Redis only (harnesses share it)."""
    if harness_kind[1] == "fakeredis":
        pytest.skip("the harnesses of one test share a server only on real Redis")
    monkeypatch.setitem(MATRIX, "orders", (201, ORDERS_HEADERS, BODY))


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_url)
    yield conn
    conn.close()


def send(harness: Harness, key: str) -> Reply:
    headers = [("Idempotency-Key", key), ("Content-Type", "application/json")]
    return harness.request("POST", "/matrix/orders", headers=headers, body=b"{}")


def record_of(client: redis.Redis, policy: Policy, before: set[bytes]) -> bytes:
    """The one record key written since ``before`` was listed."""
    listed = set(client.scan_iter(match=f"{policy.prefix}:*", count=1000))
    (key,) = listed - before  # one key: the lease is a field of the record
    return key


def keys(client: redis.Redis, policy: Policy) -> set[bytes]:
    return set(client.scan_iter(match=f"{policy.prefix}:*", count=1000))


def assert_same_answer(first: Reply, replay: Reply) -> None:
    assert first.status == 201
    assert first.body == BODY
    assert replay.status == 201
    assert replay.body == first.body
    assert lowered(replay.headers) == [*stored_lines(first), lowered([REPLAYED])[0]]


@pytest.mark.usefixtures("orders")
def test_a_compressed_10_kib_json_replays_byte_identical_in_less_memory(
    make_harness: Callable[..., Harness], base_policy: Policy, client: redis.Redis
) -> None:
    memory = {}
    for compress in (True, None):
        harness = make_harness(compress=compress, **LIMITS)
        key, before = uuid.uuid4().hex, keys(client, base_policy)
        first = send(harness, key)
        record = record_of(client, base_policy, before)
        replay = send(harness, key)
        assert_same_answer(first, replay)
        assert harness.executions["matrix"] == 1
        stored = client.hget(record, "resp")
        assert stored is not None
        assert stored[0] == (COMPRESSED_FORMAT if compress else FORMAT_VERSION)
        memory[compress] = client.memory_usage(record, samples=0)
    assert memory[True] < memory[None] / 2, memory


@decision_only  # the codec decides; the first test carries the bytes through every adapter
@pytest.mark.usefixtures("orders")
@pytest.mark.parametrize(("write", "read"), [(True, None), (None, True)])
def test_a_record_replays_after_the_policy_changes_compression(
    make_harness: Callable[..., Harness], write: object, read: object
) -> None:
    writer = make_harness(compress=write, **LIMITS)
    reader = make_harness(compress=read, **LIMITS)
    key = uuid.uuid4().hex
    first = send(writer, key)
    replay = send(reader, key)
    assert_same_answer(first, replay)
    assert reader.executions["matrix"] == 0


@decision_only
@pytest.mark.usefixtures("orders")
def test_a_damaged_compressed_record_is_a_503_problem_and_the_handler_does_not_run_again(
    make_harness: Callable[..., Harness], base_policy: Policy, client: redis.Redis
) -> None:
    harness = make_harness(compress=True, **LIMITS)
    key, before = uuid.uuid4().hex, keys(client, base_policy)
    assert send(harness, key).status == 201
    record = record_of(client, base_policy, before)
    stored = client.hget(record, "resp")
    assert stored is not None
    assert stored[0] == COMPRESSED_FORMAT
    client.hset(record, "resp", stored[:-8])  # cut short: the deflate stream never ends
    reply = send(harness, key)
    body = assert_problem(reply, 503, "record_unreadable")
    assert "compressed" in body["detail"]
    assert harness.executions["matrix"] == 1
