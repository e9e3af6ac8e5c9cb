"""Telling clients what happened (issue 24), through every HTTP adapter on real Redis.

Every problem carries ``retention`` (seconds a key is honoured) and ``retry`` (what to do
next); ``Policy.retention_header`` says the retention on keyed responses;
``Policy.mark_first_responses`` sends ``Idempotent-Replayed: false`` on first answers; a CORS
answer lists idemkey's headers in ``Access-Control-Expose-Headers``; ``Policy.expired_grace``
answers a retry after the record expired with 410 ``key_expired``, never a second run.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

import pytest
import redis

from tests._servers import wait_until
from tests.adapters.harness import MATRIX
from tests.adapters.test_suite import (
    JSON,
    assert_problem,
    charge,
    closed_port_url,
    in_thread,
    key,
    padded,
    replayed,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.adapters.harness import Harness, Reply

RETENTION = "Idempotency-Retention"
SUITE_TTL = 60  # tests/adapters/conftest.py SUITE_POLICY


def members(reply: Reply, status: int, code: str) -> tuple[int, str]:
    body = assert_problem(reply, status, code)
    return body["retention"], body["retry"]


@pytest.fixture
def client(redis_url: str, harness_kind: tuple[str, str]) -> Iterator[redis.Redis]:
    """The harness's server, to look at and expire its keys: real Redis only."""
    if harness_kind[1] != "redis":
        pytest.skip("only a real Redis harness shares its server with the test")
    conn = redis.Redis.from_url(redis_url)
    yield conn
    conn.close()


# ---- retention and retry on every problem ---------------------------------------------------


def test_every_problem_carries_retention_and_retry(harness: Harness) -> None:
    assert members(charge(harness, None), 400, "missing_key") == (SUITE_TTL, "new_key")
    several = harness.request("POST", "/charges", headers=[JSON, key("a"), key("b")], body=b"{}")
    assert members(several, 400, "invalid_key") == (SUITE_TTL, "new_key")
    big = harness.request("POST", "/charges", headers=[JSON, key("b")], body=padded(2049))
    assert members(big, 413, "request_too_large") == (SUITE_TTL, "never")
    assert charge(harness, "k", amount=5).status == 201
    assert members(charge(harness, "k", amount=6), 422, "key_reused") == (SUITE_TTL, "new_key")
    pool, first = in_thread(lambda: harness.request("POST", "/slow", headers=[key("s")]))
    with pool:
        wait_until(lambda: harness.executions["slow"] == 1, 10, "the first request to start")
        busy = harness.request("POST", "/slow", headers=[key("s")])
        assert members(busy, 409, "in_flight") == (SUITE_TTL, "same_key")
        harness.gate.set()
        assert first.result(15).status == 201
    assert harness.executions["charges"] == 1


def test_store_unavailable_says_retry_with_the_same_key(
    make_harness: Callable[..., Harness],
) -> None:
    harness = make_harness(redis_url=closed_port_url(), ttl=7200.0)
    assert members(charge(harness, "k"), 503, "store_unavailable") == (7200, "same_key")


# ---- x-should-retry for generated SDKs ----------------------------------------------------------


def test_mark_retryable_tells_generated_clients_to_retry_409_and_503_only(
    make_harness: Callable[..., Harness],
) -> None:
    harness = make_harness(mark_retryable=True)
    pool, first = in_thread(lambda: harness.request("POST", "/slow", headers=[key("x")]))
    with pool:
        wait_until(lambda: harness.executions["slow"] == 1, 10, "the first request to start")
        busy = harness.request("POST", "/slow", headers=[key("x")])
        assert_problem(busy, 409, "in_flight")
        assert busy.header_all("x-should-retry") == ["true"]
        assert (busy.header("Retry-After") or "").isdigit()
        harness.gate.set()
        assert first.result(15).status == 201
    assert charge(harness, "y", amount=1).header("x-should-retry") is None  # a first answer
    mismatch = charge(harness, "y", amount=2)
    assert_problem(mismatch, 422, "key_reused")
    assert mismatch.header("x-should-retry") is None  # not retryable: never marked
    assert_problem(charge(harness, None), 400, "missing_key")
    down = make_harness(redis_url=closed_port_url(), mark_retryable=True)
    unavailable = charge(down, "z")
    assert_problem(unavailable, 503, "store_unavailable")
    assert unavailable.header_all("x-should-retry") == ["true"]


def test_without_mark_retryable_no_problem_says_x_should_retry(
    make_harness: Callable[..., Harness],
) -> None:
    down = make_harness(redis_url=closed_port_url())
    assert charge(down, "z").header("x-should-retry") is None


# ---- the retention header -----------------------------------------------------------------------


def test_retention_header_on_first_answers_replays_and_problems(
    make_harness: Callable[..., Harness],
) -> None:
    harness = make_harness(retention_header=RETENTION, ttl=3600.0)
    first = charge(harness, "r")
    assert first.status == 201
    assert first.header_all(RETENTION) == ["3600"]
    again = charge(harness, "r")
    assert replayed(again)
    assert again.header_all(RETENTION) == ["3600"]  # once: never stored with the first answer
    assert again.body == first.body
    mismatch = charge(harness, "r", amount=9)
    assert members(mismatch, 422, "key_reused") == (3600, "new_key")
    assert mismatch.header(RETENTION) == "3600"
    assert harness.executions["charges"] == 1


def test_without_the_options_first_answers_carry_no_header_of_ours(harness: Harness) -> None:
    first = charge(harness, "plain")
    assert first.header(RETENTION) is None
    assert first.header("Idempotent-Replayed") is None
    assert first.header("Access-Control-Expose-Headers") is None


# ---- Idempotent-Replayed: false -----------------------------------------------------------------


def test_mark_first_responses_sends_replayed_false_once_then_true(
    make_harness: Callable[..., Harness],
) -> None:
    harness = make_harness(mark_first_responses=True)
    first = charge(harness, "m")
    assert first.status == 201
    assert first.header_all("Idempotent-Replayed") == ["false"]
    again = charge(harness, "m")
    assert again.header_all("Idempotent-Replayed") == ["true"]  # "false" was never stored
    assert again.body == first.body
    assert harness.executions["charges"] == 1


# ---- CORS ---------------------------------------------------------------------------------------


@pytest.fixture
def cors(monkeypatch: pytest.MonkeyPatch, harness_kind: tuple[str, str]) -> None:
    """POST /matrix/cors answers a CORS request (Access-Control-Allow-Origin)."""
    headers = [("Content-Type", "application/json"), ("Access-Control-Allow-Origin", "*")]
    monkeypatch.setitem(MATRIX, "cors", (201, headers, b'{"id":"ch_1"}'))


def send_cors(harness: Harness, idem: str) -> Reply:
    headers = [JSON, key(idem), ("Origin", "https://shop.example")]
    return harness.request("POST", "/matrix/cors", headers=headers, body=b"{}")


def exposed(reply: Reply) -> list[str]:
    values = reply.header_all("Access-Control-Expose-Headers")
    assert len(values) == 1, values
    return [name.strip() for name in values[0].split(",")]


@pytest.mark.usefixtures("cors")
def test_cors_answers_expose_the_headers_idemkey_sets(
    make_harness: Callable[..., Harness],
) -> None:
    harness = make_harness(mark_first_responses=True, retention_header=RETENTION)
    first = send_cors(harness, "c")
    assert first.status == 201
    assert exposed(first) == ["Idempotent-Replayed", RETENTION]
    again = send_cors(harness, "c")
    assert replayed(again)
    assert exposed(again) == ["Idempotent-Replayed", RETENTION]  # once, not stored and added
    assert harness.executions["matrix"] == 1


@pytest.mark.usefixtures("cors")
def test_a_cors_replay_exposes_its_marker_with_every_option_off(harness: Harness) -> None:
    first = send_cors(harness, "c0")
    assert first.header("Access-Control-Expose-Headers") is None  # nothing of ours to read
    assert exposed(send_cors(harness, "c0")) == ["Idempotent-Replayed"]


# ---- expired keys -------------------------------------------------------------------------------


def records(client: redis.Redis, prefix: str) -> tuple[list[bytes], list[bytes]]:
    """(record hashes, tombstones) under ``prefix``."""
    names = list(client.scan_iter(match=f"{prefix}:*"))
    hashes = [n for n in names if not n.endswith((b":gone", b":done"))]
    return hashes, [n for n in names if n.endswith(b":gone")]


def expire_now(client: redis.Redis, names: list[bytes]) -> None:
    """Bring the expiry of ``names`` forward (what the wait would do, without the wait)."""
    for name in names:
        client.pexpire(name, 1)
    wait_until(lambda: not client.exists(*names), 5, "the keys to expire")


def test_a_retry_after_the_record_expired_is_410_key_expired_and_never_runs(
    make_harness: Callable[..., Harness], client: redis.Redis, prefix: str
) -> None:
    events: list[Any] = []
    harness = make_harness(ttl=30.0, expired_grace=600.0, on_event=events.append)
    first = charge(harness, "e")
    assert first.status == 201
    assert replayed(charge(harness, "e"))
    (record,), (tombstone,) = records(client, prefix)
    assert 0 < client.pttl(record) <= 30_000
    assert 600_000 < client.pttl(tombstone) <= 630_000  # retention + grace
    expire_now(client, [record])
    gone = charge(harness, "e")
    assert members(gone, 410, "key_expired") == (30, "never")
    assert members(charge(harness, "e"), 410, "key_expired") == (30, "never")
    assert [e.kind for e in events].count("expired") == 2
    # Another request under the key is still refused as a reuse, not run.
    assert members(charge(harness, "e", amount=7), 422, "key_reused") == (30, "new_key")
    assert harness.executions["charges"] == 1
    # Past the grace the key is free again.
    expire_now(client, [tombstone])
    assert charge(harness, "e").status == 201
    assert harness.executions["charges"] == 2


@pytest.mark.parametrize("grace", [0.0, 600.0])
def test_only_a_completed_record_leaves_a_tombstone(
    make_harness: Callable[..., Harness], client: redis.Redis, prefix: str, grace: float
) -> None:
    harness = make_harness(expired_grace=grace)
    assert harness.request("POST", "/fail500", headers=[key("f")]).status == 500  # released
    assert records(client, prefix)[1] == []
    assert charge(harness, "ok").status == 201
    assert len(records(client, prefix)[1]) == (1 if grace else 0)  # off: no new key at all


def test_without_the_grace_an_expired_key_runs_again(
    make_harness: Callable[..., Harness], client: redis.Redis, prefix: str
) -> None:
    harness = make_harness(ttl=30.0)
    assert charge(harness, "x").status == 201
    expire_now(client, records(client, prefix)[0])
    again = charge(harness, "x")
    assert again.status == 201
    assert not replayed(again)
    assert harness.executions["charges"] == 2


def test_concurrent_retries_after_expiry_all_get_key_expired(
    make_harness: Callable[..., Harness], client: redis.Redis, prefix: str
) -> None:
    harness = make_harness(ttl=30.0, expired_grace=600.0)
    assert charge(harness, "hot").status == 201
    expire_now(client, records(client, prefix)[0])
    answers: list[Any] = []
    lock = threading.Lock()

    def send() -> None:
        reply = charge(harness, "hot")
        with lock:
            answers.append(reply.status)

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert answers == [410] * 8
    assert harness.executions["charges"] == 1


def test_key_expired_in_the_api_shape(
    make_harness: Callable[..., Harness], client: redis.Redis, prefix: str
) -> None:
    def render(problem: Any) -> tuple[str, bytes]:
        shape = {"code": problem.code, "retry": problem.retry, "retention": problem.retention}
        return "application/json", json.dumps({"error": shape}).encode()

    harness = make_harness(ttl=30.0, expired_grace=600.0, render_problem=render)
    assert charge(harness, "api").status == 201
    expire_now(client, records(client, prefix)[0])
    reply = charge(harness, "api")
    assert reply.status == 410
    error = {"code": "key_expired", "retry": "never", "retention": 30}
    assert json.loads(reply.body) == {"error": error}
    assert harness.executions["charges"] == 1
