"""IdempotentTask with a real Celery worker (prefork), continued from test_celery.py.

``idemkey cancel`` on a running task: the cancelled run stops at its next checkpoint and fails
with RunCancelledError, never sent again (a retry would claim the record the operator gave
up); a later send resumes after the finished steps, or starts afresh after ``--abandon``, as
docs/steps.md says. Under ``result_serializer="msgpack"`` a tuple result is kept."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import redis

pytest.importorskip("celery")

from celery import Celery

from idemkey import Policy, RedisStore
from idemkey._core import record_for
from idemkey.contrib.celery import RunCancelledError
from tests._servers import wait_until
from tests.contrib._celery_app import STEPS, make_app
from tests.contrib._celery_process import start_worker as start_celery_worker
from tests.contrib._celery_process import stop_worker
from tests.contrib.test_celery import StartWorker, app, client, start_worker, url

__all__ = ["app", "client", "start_worker", "url"]  # the fixtures of test_celery.py

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("abandon", [False, True], ids=["keep-steps", "abandon"])
def test_a_cancelled_task_stops_for_good_and_a_later_send_resumes_or_starts_afresh(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker, abandon: bool
) -> None:
    task = app.tasks["tests.place_order"]
    client.set(f"{prefix}:block", "reserve")  # the first run waits after step 1 of 3
    start_worker()
    result = task.delay("o-c")
    wait_until(lambda: client.get(f"{prefix}:after") == b"reserve", timeout=30, message="step 1")

    store = RedisStore(client, Policy(prefix=prefix))
    record = record_for(prefix, "celery:tests.place_order", "GUARD", "", "order:o-c")
    assert store.cancel(record, abandon=abandon) is not None  # what `idemkey cancel` does
    client.rpush(f"{prefix}:go", 1)  # the cancelled run goes on to its next checkpoint

    with pytest.raises(RunCancelledError, match="cancelled"):
        result.get(timeout=30)
    assert result.state == "FAILURE"

    def sides() -> list[int]:
        return [int(client.get(f"{prefix}:side:{name}") or 0) for name in STEPS]

    # The cancelled run's charge ran before its checkpoint was refused; nothing ran after:
    # no retry claimed the record and finished the job.
    assert sides()[0] == 1
    assert sides()[2] == 0
    charged = sides()[1]
    assert charged <= 1
    status = store.record("order:o-c", scope="celery:tests.place_order")
    assert status is not None
    assert status.state == "released"

    steps = task.delay("o-c").get(timeout=30)  # the operator sends it again
    assert [step["step"] for step in steps] == list(STEPS)
    assert sides() == [2 if abandon else 1, charged + 1, 1]


def test_under_msgpack_a_task_returning_a_tuple_is_kept_and_replayed_as_a_list(
    url: str, prefix: str, client: redis.Redis, tmp_path: Path
) -> None:
    # msgpack hands the caller a tuple as a list: storing it as Celery's JSON (a list too)
    # replays what the first caller got, so it is kept (it failed with ResultNotStorableError).
    app = make_app(url, prefix, result_serializer="msgpack")
    worker = start_celery_worker(
        "tests.contrib._celery_worker", url, prefix, tmp_path / "worker.log",
        hostname=f"msgpack-{prefix}@localhost", env={"IDEMKEY_CELERY_RESULT_SERIALIZER": "msgpack"},
    )  # fmt: skip
    try:
        task = app.tasks["tests.note_pair"]
        assert task.delay("o-t").get(timeout=30) == ["o-t", 1]
        assert task.delay("o-t").get(timeout=30) == ["o-t", 1]
        assert client.get(f"{prefix}:runs") == b"1"
    finally:
        stop_worker(worker)
        app.close()


def test_a_run_that_lost_its_lease_to_a_takeover_waits_for_and_returns_the_takers_result(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker, tmp_path: Path
) -> None:
    # The first run is paused (SIGSTOP) past its lease; a duplicate takes the record over and
    # waits after its charge step. Resumed, the first run's checkpoint is refused: its retries
    # only read the record (never claim it) while the taker runs, then replay its result.
    task = app.tasks["tests.place_order"]
    client.set(f"{prefix}:block", "reserve")
    start_worker(concurrency=2)
    first = task.delay("o-s")
    wait_until(lambda: client.get(f"{prefix}:after") == b"reserve", timeout=30, message="step 1")
    victim = int(client.get(f"{prefix}:pid") or 0)
    os.kill(victim, signal.SIGSTOP)
    try:
        client.set(f"{prefix}:block", "charge")
        taker = task.delay("o-s")
        wait_until(lambda: client.get(f"{prefix}:after") == b"charge", timeout=30, message="take")
    finally:
        os.kill(victim, signal.SIGCONT)
    client.rpush(f"{prefix}:go", 1)  # the first run (blocked first) goes on, and loses
    log = tmp_path / "worker-0.log"
    wait_until(
        lambda: log.read_text().count("s: LeaseLostError(") >= 2,
        timeout=30,
        message="replay-only retries while the taker runs",
    )
    client.rpush(f"{prefix}:go", 1)  # the taker finishes
    taken = taker.get(timeout=30)
    assert first.get(timeout=30) == taken
    assert first.state == "SUCCESS"
    assert int(client.get(f"{prefix}:side:ship") or 0) == 1
