"""idemkey.contrib.celery with a real Celery worker process and a real Redis broker.

Each test starts a private redis-server (broker, result backend and idempotency records) and
``celery worker`` processes, and stops them after. What users rely on: duplicates of one
task call run it once and all get its result (a duplicate in flight is a Celery retry, not a
failure); a worker SIGKILLed mid-task with ``acks_late`` has its message redelivered, the
next worker takes the record over after the lease and resumes after the finished steps.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

pytest.importorskip("celery")

from celery import Celery

from idemkey.contrib.celery import IdempotentTask
from tests._servers import wait_until
from tests.contrib._celery_app import STEPS, make_app

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.redis

StartWorker = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def url(private_redis_server: object) -> str:
    return private_redis_server.url  # type: ignore[attr-defined,no-any-return]


@pytest.fixture
def client(url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(url)
    yield client
    client.close()


@pytest.fixture
def app(url: str, prefix: str) -> Iterator[Celery]:
    app = make_app(url, prefix)
    yield app
    # A test's AsyncResults sit in reference cycles with the result backend; collected later,
    # their __del__ unsubscribes from a Redis this test has stopped (Celery 5.3 then warns from
    # __del__: an unraisable error in whichever test runs next). Collect them while it answers.
    # Celery 5.3 also leaves open the sockets of the threads that sent tasks (Celery's leak, not
    # idemkey's: newer Celery closes them in close()); they are dropped here without a warning.
    app.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.fixture
def start_worker(url: str, prefix: str, tmp_path: Path) -> Iterator[StartWorker]:
    workers: list[subprocess.Popen[bytes]] = []

    def start(pool: str, concurrency: int = 1) -> subprocess.Popen[bytes]:
        log = tmp_path / f"worker-{len(workers)}.log"
        env = {**os.environ, "IDEMKEY_CELERY_URL": url, "IDEMKEY_CELERY_PREFIX": prefix}
        argv = [sys.executable, "-m", "celery", "-A", "tests.contrib._celery_worker", "worker"]
        options = ["--without-mingle", "--without-gossip", "--without-heartbeat"]
        worker = subprocess.Popen(
            [
                *argv,
                f"--pool={pool}",
                f"--concurrency={concurrency}",
                f"--hostname=w{len(workers)}-{prefix}@localhost",
                "--loglevel=INFO",
                f"--logfile={log}",
                *options,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        workers.append(worker)

        def ready() -> bool:
            if worker.poll() is not None:
                text = log.read_text() if log.exists() else ""
                pytest.fail(f"the celery worker exited ({worker.returncode}): {text[-2000:]}")
            return log.exists() and " ready." in log.read_text()

        wait_until(ready, timeout=30, message="the celery worker to be ready")
        return worker

    yield start
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=10)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(timeout=10)


def test_the_same_task_sent_three_times_at_once_runs_once_and_all_get_its_result(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    task = app.tasks["tests.slow_total"]
    start_worker("threads", concurrency=3)

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: task.delay("o-1", amount=21), range(3)))
    assert len({result.id for result in results}) == 3  # three messages, three delivery ids

    wait_until(lambda: client.get(f"{prefix}:runs") == b"1", timeout=20, message="first run")
    # The two duplicates found the call in flight: Celery retries, not failures.
    wait_until(
        lambda: sum(result.state == "RETRY" for result in results) == 2,
        timeout=20,
        message="the duplicates to be retried",
    )
    client.rpush(f"{prefix}:go", 1)  # let the one run finish

    values = [result.get(timeout=30) for result in results]
    assert values[0] == values[1] == values[2]
    assert values[0]["total"] == 42
    assert client.get(f"{prefix}:runs") == b"1"
    # Waiting out the first run did not spend the duplicates' retries (max_retries).
    assert [result.retries for result in results] == [0, 0, 0]
    # Same call, positional or keyword: the stored result, no new run.
    assert task.delay("o-1", 21).get(timeout=30) == values[0]
    assert client.get(f"{prefix}:runs") == b"1"


def test_a_worker_killed_mid_task_is_redelivered_and_the_next_resumes_after_finished_steps(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    task = app.tasks["tests.place_order"]
    client.set(f"{prefix}:block", "charge")  # the first worker stops after step 2 of 3
    first = start_worker("solo")

    result = task.delay("o-9")
    wait_until(lambda: client.get(f"{prefix}:after") == b"charge", timeout=30, message="2 steps")
    os.kill(first.pid, signal.SIGKILL)  # mid-task: the message was never acknowledged
    first.wait(timeout=10)
    client.delete(f"{prefix}:block")

    start_worker("solo")  # gets the message back once its visibility timeout passes
    steps = result.get(timeout=40)

    sides = {name: int(client.get(f"{prefix}:side:{name}") or 0) for name in STEPS}
    assert sides == dict.fromkeys(STEPS, 1)
    # reserve and charge are the killed worker's (fence 1), ship the takeover's (fence 2).
    assert [step["fence"] for step in steps] == [1, 1, 2]
    assert {step["pid"] for step in steps[:2]} == {first.pid}
    assert steps[2]["pid"] != first.pid


def test_the_default_key_is_the_task_name_and_bound_arguments_not_the_delivery() -> None:
    app = make_app("redis://127.0.0.1:1/0", "unused")
    task: IdempotentTask = app.tasks["tests.slow_total"]
    key, payload = task._identify(("o-1", 21), {})
    assert task._identify(("o-1",), {"amount": 21}) == (key, payload)
    assert task._identify(("o-1", 22), {})[0] != key
    custom: IdempotentTask = app.tasks["tests.place_order"]
    assert custom._identify(("o-9",), {})[0] == "order:o-9"
