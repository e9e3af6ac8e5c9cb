"""docs/queues.md, run as printed (:mod:`tests._pages`) against a real Redis.

The Celery block is saved as ``tasks.py`` and served by a real ``celery -A tasks worker`` (solo
pool), with a ``shop.py`` of fake services beside it that count their side effects in Redis;
the test sends the task as a producer does. The RQ, arq and dramatiq blocks are called as
those libraries call a job function (RQ's and dramatiq's are plain functions; arq's ``Retry``
is stood in for when arq is not installed), with the fakes of tests/steps/test_docs.py.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from idemkey import RequestInFlightError, aguard, guard
from tests._pages import blocks, fake_modules, point_at, run_page
from tests._servers import RedisServer, wait_until
from tests.steps.test_docs import ORDER, ArqRetry, Crash, Services, shop

pytestmark = pytest.mark.redis
PAGE = "docs/queues.md"
CELERY, RQ, ARQ, DRAMATIQ = range(4)
WORKER = (
    *(sys.executable, "-m", "celery", "-A", "tasks", "worker", "--pool=solo"),
    *("--without-mingle", "--without-gossip", "--without-heartbeat"),
)

SHOP = """
import os

import redis

counts = redis.Redis.from_url(os.environ["SHOP_COUNTS_URL"])


class inventory:
    @staticmethod
    def reserve(order_id, items):
        counts.incr("reserve")
        return {"hold_id": "hold-" + order_id}


class psp:
    @staticmethod
    def charge(amount, idempotency_key, fence=None):
        if counts.set("charge:" + idempotency_key, 1, nx=True):  # a PSP dedups its key
            counts.incr("charge")
        return {"charge_id": "ch_1"}


class shipping:
    @staticmethod
    def enqueue(order_id, hold_id):
        counts.incr("ship")
"""


@pytest.fixture
def url(private_redis_server: RedisServer) -> str:
    return private_redis_server.url


def namespaces(url: str, services: Services) -> list[dict[str, Any]]:
    """Every block but Celery's (served by a worker below), run as printed."""
    fakes = shop(services)
    if importlib.util.find_spec("arq") is None:
        fakes["arq"] = {"Retry": ArqRetry}
    with fake_modules(fakes):
        pages = run_page("docs/queues.md", url, served={CELERY})  # the worker runs Celery's
    return [pages[i] for i in (RQ, ARQ, DRAMATIQ)]


def test_the_page_holds_these_four_blocks_in_this_order() -> None:
    code = blocks(PAGE)
    assert len(code) == 4
    assert "IdempotentTask" in code[CELERY]
    assert "rq_place_order" in code[RQ]
    assert "arq_place_order" in code[ARQ]
    assert "dramatiq_place_order" in code[DRAMATIQ]


@pytest.fixture
def celery_worker(url: str, tmp_path: Path) -> Iterator[Path]:
    pytest.importorskip("celery")
    (tmp_path / "tasks.py").write_text(point_at(blocks(PAGE)[CELERY], url))
    (tmp_path / "shop.py").write_text(SHOP)
    log = tmp_path / "worker.log"
    env = {**os.environ, "SHOP_COUNTS_URL": url.replace("/0", "/3")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    worker = subprocess.Popen(
        [*WORKER, "--loglevel=INFO", f"--logfile={log}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )

    def ready() -> bool:
        if worker.poll() is not None:
            pytest.fail(f"the worker exited: {log.read_text()[-2000:] if log.exists() else ''}")
        return log.exists() and " ready." in log.read_text()

    try:
        wait_until(ready, timeout=30, message="the celery worker to be ready")
        yield log
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=10)


def test_the_celery_task_runs_once_through_a_real_worker(url: str, celery_worker: Path) -> None:
    from celery import Celery

    producer = Celery("producer", broker=url, backend=url, set_as_current=False)
    try:
        results = [
            producer.send_task("tasks.place_order_task", args=[ORDER]).get(timeout=30)
            for _ in range(3)  # a re-publish, then a redelivery: the same message again
        ]
    finally:
        producer.close()
    assert results == [{"order": "o-1", "charge": "ch_1"}] * 3
    counts = redis.Redis.from_url(url.replace("/0", "/3"))
    try:
        assert [counts.get(name) for name in ("reserve", "charge", "ship")] == [b"1"] * 3
    finally:
        counts.close()


@pytest.mark.parametrize("job", [RQ, DRAMATIQ])
def test_the_rq_and_dramatiq_functions_run_each_step_once_across_retries(
    url: str, job: int
) -> None:
    services = Services()
    run = namespaces(url, services)[[RQ, ARQ, DRAMATIQ].index(job)]
    run = run["rq_place_order" if job == RQ else "dramatiq_place_order"]
    services.crash_before.add("charge")
    with pytest.raises(Crash):  # the attempt fails; the worker retries it
        run(ORDER)
    run(ORDER)
    run(ORDER)  # a redelivered duplicate
    assert services.effects == {"reserve": 1, "charge": 1}


def test_the_rq_function_answers_a_duplicate_in_flight_after_waiting(url: str) -> None:
    block = namespaces(url, Services())[0]
    block["job_policy"] = block["store"].policy.replace(wait=0.05)  # the sample waits 2 s
    with (
        guard(block["store"], "order:o-1", payload=ORDER),
        pytest.raises(RequestInFlightError),  # RQ's Retry runs it again later
    ):
        block["rq_place_order"](ORDER)


async def test_the_arq_coroutine_resumes_and_turns_in_flight_into_a_retry(url: str) -> None:
    services = Services()
    block = namespaces(url, services)[1]
    job, ctx = block["arq_place_order"], {"job_try": 1}
    await block["on_startup"](ctx)
    store = ctx["idemkey"]
    assert ctx.keys() == {"job_try", "idemkey"}
    assert block["WorkerSettings"].functions == [job]
    try:
        services.crash_before.add("charge")
        with pytest.raises(Crash):
            await job(ctx, ORDER)
        assert await job(ctx, ORDER) == {"order": "o-1", "charge": "ch_1"}
        assert services.effects == {"reserve": 1, "charge": 1}

        other = {**ORDER, "id": "o-2"}
        async with aguard(store, "order:o-2", payload=other):  # the first run, in flight
            with pytest.raises(block["Retry"]) as retry:
                await job(ctx, other)
        # Deferred by retry_after: 1 s, not the lease left (30 s by default).
        assert retry.value.defer == 1.0
        cause = retry.value.__cause__
        assert isinstance(cause, RequestInFlightError)
        assert cause.retry_after == 1.0 < 5 < cause.lease_remaining <= 30
        # Later tries wait longer, and arq's tries (every Retry counts toward max_tries, 5 by
        # default: about 5 s at 1 s apart) outlast the lease a crashed first run leaves.
        deferred = []
        for job_try in range(1, block["WorkerSettings"].max_tries):
            async with aguard(store, "order:o-2", payload=other):
                with pytest.raises(block["Retry"]) as retry:
                    await job({**ctx, "job_try": job_try}, other)
            deferred.append(retry.value.defer)
        assert deferred[:6] == [1.0, 2, 3, 4, 5, 5]
        assert sum(deferred) > store.policy.lease
    finally:
        await block["on_shutdown"](ctx)
