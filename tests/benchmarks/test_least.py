"""``python -m benchmarks.least`` runs its four rows against a real Redis, and its least
replay is a replay: the record idemkey stored answers it (it stops with SystemExit if not)."""

from __future__ import annotations

import math

from benchmarks.least import measure


def test_least_replays_the_record_idemkey_stored(redis_url: str) -> None:
    p50 = measure(redis_url, rounds=20, seed=1)
    assert set(p50) == {"floor", "plain", "idemkey", "least"}
    assert all(math.isfinite(value) and value > 0 for value in p50.values())
