"""Exactly-once soak: several processes race on the same keys against a real Redis.

Every key is sent once by each of RACERS worker processes (``tests/soak/_worker.py``), with
random handler failures and random cancellations (during the claim, the handler or the
completion). Then, per key:

* the handler's effect happened at most once, and exactly once if the record completed;
* every replay any client got is byte-identical to the value the one successful run saved;
* nothing is stuck: once the workers are done, every lease has lapsed within lease + 1 s.

Keys come in rounds of IDEMKEY_SOAK_KEYS (default 10 000) for IDEMKEY_SOAK_SECONDS: by default
0, one round (40 000 requests), and 25 with ``IDEMKEY_DEEP=1`` (CI: two or three rounds on two
cores); ``IDEMKEY_SOAK_SECONDS=60`` or more is the long soak. IDEMKEY_SOAK_CANCEL_RATE (default
0.2) sets how many requests get cancelled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from idemkey._codec import decode_value
from idemkey._core import record_for
from idemkey.guard import GUARD_METHOD
from idemkey.store.status import lease_left_ms, server_ms
from tests._depth import DEEP
from tests._servers import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.long_form, pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]
RACERS = 4
KEYS = int(os.environ.get("IDEMKEY_SOAK_KEYS", "10000"))
SECONDS = float(os.environ.get("IDEMKEY_SOAK_SECONDS", "25" if DEEP else "0"))
LEASE = 2.0  # the workers' lease (tests/soak/_worker.py)


def live_leases(client: redis.Redis, prefix: str) -> int:
    """How many records under ``prefix`` a live claim holds: in progress, their lease deadline
    (the record's field "lease", on the server's clock) still ahead. A lapsed claim keeps its
    field until a takeover, so the field alone says nothing."""
    records = list(client.scan_iter(match=f"{prefix}:{{*}}", count=1000, _type="HASH"))
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("TIME")
    for key in records:
        pipe.hmget(key, "state", "lease")
    now, *fields = pipe.execute()
    return sum(
        state == b"in_progress" and lease_left_ms(deadline, None, server_ms(now)) > 0
        for state, deadline in fields
    )


def test_exactly_once_under_racing_failing_and_cancelled_clients(
    redis_url: str, real_client: redis.Redis, prefix: str, tmp_path: Path
) -> None:
    outs = [tmp_path / f"worker-{n}.json" for n in range(RACERS)]
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.soak._worker",
                redis_url,
                prefix,
                str(KEYS),
                str(n + 1),
                str(out),
                str(SECONDS),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n, out in enumerate(outs)
    ]
    started = time.monotonic()
    try:
        wait_until(
            lambda: (
                int(real_client.get(f"{prefix}:ready") or 0) == RACERS
                or any(worker.poll() is not None for worker in workers)
            ),
            60,
            "workers ready",
        )
        assert all(worker.poll() is None for worker in workers), "a worker died at start"
        real_client.rpush(f"{prefix}:go", *["go"] * RACERS)
        for worker in workers:
            _, err = worker.communicate(timeout=600)
            assert worker.returncode == 0, err[-3000:]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.communicate()
    finished = time.monotonic()

    totals: Counter[str] = Counter()
    replays: list[dict[str, str]] = []
    rounds = 0
    for out in outs:
        summary = json.loads(out.read_text())
        totals.update(summary["outcomes"])
        replays.append(summary["replays"])
        rounds = max(rounds, summary["rounds"])

    keys = [f"r{r}-job-{i}" for r in range(rounds) for i in range(KEYS)]
    pipe = real_client.pipeline(transaction=False)
    for key in keys:
        record = record_for(prefix, "", GUARD_METHOD, "", key)
        pipe.get(f"{prefix}:ok:{key}")
        pipe.get(f"{prefix}:val:{key}")
        pipe.hget(record.key, "resp")  # a completed record holds its response
    answers = pipe.execute()

    duplicates = 0
    completed = 0
    for i, key in enumerate(keys):
        ok, value, resp = answers[3 * i : 3 * i + 3]
        runs = int(ok or 0)
        duplicates += runs > 1
        if resp is not None:
            completed += 1
            assert runs == 1, f"{key}: completed, but its effect happened {runs} times"
            assert decode_value(resp) == value.decode()  # the stored value is the one run's
        else:
            assert runs == 0, f"{key}: its effect happened {runs} times, never stored"
        for seen in replays:
            if key in seen:
                assert value is not None
                assert seen[key] == value.decode(), f"{key}: a replay differs"

    # Nothing stuck: claims cut off by a cancellation lapse with their lease.
    wait_until(
        lambda: live_leases(real_client, prefix) == 0,
        LEASE + 1 + 5,  # lease + 1 s, plus slack for a busy machine
        "every lease to lapse",
    )
    print(
        f"\nsoak: {len(keys)} keys ({rounds} rounds of {KEYS}) x {RACERS} racers in "
        f"{finished - started:.1f} s; "
        f"{completed} completed, duplicates {duplicates}; outcomes {dict(totals)}"
    )
    assert duplicates == 0
    assert totals["replay_differs_within_process"] == 0
    assert completed > len(keys) * 0.9
