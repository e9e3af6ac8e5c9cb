"""``python -m benchmarks.least`` runs its four rows against a real Redis, and its least
replay is a replay: the record idemkey stored answers it (it stops with SystemExit if not)."""

from __future__ import annotations

import math
from typing import Any

import redis

from benchmarks.http_apps import plain_wsgi
from benchmarks.httpcases import wsgi_environ
from benchmarks.least import checks_for, measure
from idemkey import Policy, RedisStore
from idemkey.adapters.wsgi import IdempotencyMiddleware


def test_least_replays_the_record_idemkey_stored(redis_url: str) -> None:
    p50 = measure(redis_url, rounds=20, seed=1)
    assert set(p50) == {"floor", "plain", "idemkey", "least"}
    assert all(math.isfinite(value) and value > 0 for value in p50.values())


def test_the_stages_each_run_their_piece_before_the_least_replay(redis_url: str) -> None:
    p50 = measure(redis_url, rounds=20, seed=1, with_stages=True)
    pieces = {"request_of", "scope", "record_for", "fingerprint", "begin"}
    rows = {"floor", "plain", "idemkey", "least", "checks"}
    assert set(p50) == rows | {f"+{name}" for name in pieces}
    assert all(math.isfinite(value) and value > 0 for value in p50.values())


def test_the_checks_row_replays_what_the_middleware_stored(redis_url: str, prefix: str) -> None:
    """``checks`` is idemkey's replay without its layers: the same answer, marked replayed."""
    store = RedisStore(redis.Redis.from_url(redis_url), Policy(prefix=prefix))
    answers: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        answers.append((status, headers))

    try:
        first = b"".join(
            IdempotencyMiddleware(plain_wsgi, store)(wsgi_environ("/o", "k"), start_response)
        )
        again = b"".join(checks_for(store)(wsgi_environ("/o", "k"), start_response))
    finally:
        store.close()
    assert again == first
    (status, headers), (replay_status, replay_headers) = answers
    assert replay_status == status
    assert replay_headers == [*headers, ("Idempotent-Replayed", "true")]
