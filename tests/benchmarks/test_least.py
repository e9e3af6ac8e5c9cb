"""``python -m benchmarks.least`` runs its four rows against a real Redis, and its least
replay is a replay: the record idemkey stored answers it (it stops with SystemExit if not)."""

from __future__ import annotations

import math

from benchmarks.least import measure


def test_least_replays_the_record_idemkey_stored(redis_url: str) -> None:
    p50 = measure(redis_url, rounds=20, seed=1)
    assert set(p50) == {"floor", "plain", "idemkey", "least"}
    assert all(math.isfinite(value) and value > 0 for value in p50.values())


def test_the_stages_each_run_their_piece_before_the_least_replay(redis_url: str) -> None:
    p50 = measure(redis_url, rounds=20, seed=1, with_stages=True)
    pieces = {"request_of", "scope", "record_for", "fingerprint", "begin"}
    assert set(p50) == {"floor", "plain", "idemkey", "least"} | {f"+{name}" for name in pieces}
    assert all(math.isfinite(value) and value > 0 for value in p50.values())
