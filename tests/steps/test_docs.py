"""The code of README.md's "Multi-step jobs" and of docs/steps.md, run against a real Redis.

Every fenced block after a ``<!-- run -->`` line is executed as written, with the services
it calls (inventory, PSP, shipping) replaced by fakes that count their side effects and can
crash on demand. A crash between two steps, then a retry, must leave every side effect done
exactly once; a crash inside the charge, after the PSP charged, is deduplicated by the PSP
through ``call.step_key``.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from idemkey import AsyncRedisStore, Policy, RedisStore, guard
from idemkey.contrib.celery import IdempotentTask

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"<!-- run -->\n```python\n(.*?)```", re.DOTALL)
# Run once only: a Celery task made by @app.task is shared with every app made afterwards, and
# two callables under one name would make Celery warn in the Celery tests.
_CELERY_BLOCK = re.compile(r"<!-- run: celery -->\n```python\n(.*?)```", re.DOTALL)
ORDER = {"id": "o-1", "items": ["book"], "amount": 1200}


class Crash(Exception):
    """The process dies here (in-process: the guard releases, the retry resumes)."""


class Services:
    """Fake inventory, PSP and shipping: side effects counted, crashes on demand."""

    def __init__(self) -> None:
        self.effects: Counter[str] = Counter()
        self.crash_before: set[str] = set()
        self.crash_after_charge = False
        self.charges: dict[str, dict[str, Any]] = {}  # the PSP's own idempotency records

    def _enter(self, name: str) -> None:
        if name in self.crash_before:
            self.crash_before.discard(name)
            raise Crash(name)

    def reserve(self, order_id: str, items: list[str]) -> dict[str, str]:
        self._enter("reserve")
        self.effects["reserve"] += 1
        return {"hold_id": f"hold-{order_id}"}

    def charge(self, amount: int, idempotency_key: str, fence: int | None = None) -> Any:
        self._enter("charge")
        if idempotency_key not in self.charges:  # a PSP answers a known key with the same charge
            self.effects["charge"] += 1
            self.charges[idempotency_key] = {"charge_id": f"ch_{len(self.charges) + 1}"}
        if self.crash_after_charge:
            self.crash_after_charge = False
            raise Crash("after the PSP charged, before the checkpoint")
        return self.charges[idempotency_key]

    def enqueue(self, order_id: str, hold_id: str) -> None:
        self._enter("ship")
        self.effects["ship"] += 1

    async def areserve(self, order_id: str, items: list[str]) -> dict[str, str]:
        return self.reserve(order_id, items)

    async def acharge(self, amount: int, idempotency_key: str) -> Any:
        return self.charge(amount, idempotency_key)


class ArqRetry(Exception):
    """Stands in for ``arq.Retry`` (arq is not a dependency)."""

    def __init__(self, defer: float) -> None:
        super().__init__(defer)
        self.defer = defer


def namespace(services: Services, store: Any) -> dict[str, Any]:
    class Inventory:
        reserve = staticmethod(services.reserve)

    class PSP:
        charge = staticmethod(services.charge)

    class Shipping:
        enqueue = staticmethod(services.enqueue)

    class AInventory:
        reserve = staticmethod(services.areserve)

    class APSP:
        charge = staticmethod(services.acharge)

    return {
        "__name__": "docs_steps",
        "guard": guard,
        "store": store,
        "inventory": Inventory,
        "psp": PSP,
        "shipping": Shipping,
        "ainventory": AInventory,
        "apsp": APSP,
        "Retry": ArqRetry,
    }


def run_blocks(
    path: str, names: dict[str, Any], pattern: re.Pattern[str] = _BLOCK
) -> dict[str, Any]:
    """What the blocks of ``path`` define. Each block runs in its own copy of ``names``, so one
    block's ``store`` never reaches another's."""
    blocks = pattern.findall((ROOT / path).read_text())
    assert blocks, f"no <!-- run --> block in {path}"
    defined: dict[str, Any] = {}
    for block in blocks:
        scope = dict(names)
        exec(compile(block, path, "exec"), scope)
        defined.update({name: value for name, value in scope.items() if name not in names})
    return defined


@pytest.fixture
def store(real_client: redis.Redis, prefix: str) -> Any:
    store = RedisStore(real_client, Policy(prefix=prefix, lease=10))
    yield store
    store.close()


@pytest.mark.parametrize("path", ["README.md", "docs/steps.md"])
@pytest.mark.parametrize("crash_before", ["reserve", "charge", "ship"])
def test_the_order_flow_survives_a_crash_before_any_step(
    store: RedisStore, path: str, crash_before: str
) -> None:
    services = Services()
    place_order = run_blocks(path, namespace(services, store))["place_order"]
    services.crash_before.add(crash_before)
    with pytest.raises(Crash):
        place_order(store, ORDER)
    result = place_order(store, ORDER)
    assert result == {"order": "o-1", "charge": "ch_1"}
    assert services.effects == {"reserve": 1, "charge": 1, "ship": 1}
    assert place_order(store, ORDER) == result  # a duplicate: the stored result
    assert services.effects == {"reserve": 1, "charge": 1, "ship": 1}


@pytest.mark.parametrize("path", ["README.md", "docs/steps.md"])
def test_a_crash_inside_the_charge_is_deduplicated_by_the_step_key(
    store: RedisStore, path: str
) -> None:
    services = Services()
    place_order = run_blocks(path, namespace(services, store))["place_order"]
    services.crash_after_charge = True  # charged, but the checkpoint never written
    with pytest.raises(Crash):
        place_order(store, ORDER)
    assert place_order(store, ORDER) == {"order": "o-1", "charge": "ch_1"}
    assert services.effects == {"reserve": 1, "charge": 1, "ship": 1}


@pytest.mark.parametrize("job", ["rq_place_order", "dramatiq_place_order"])
def test_the_rq_and_dramatiq_functions_run_each_step_once_across_retries(
    store: RedisStore, job: str
) -> None:
    services = Services()
    run = run_blocks("docs/steps.md", namespace(services, store))[job]
    services.crash_before.add("charge")
    with pytest.raises(Crash):  # the attempt fails; the worker retries it
        run(ORDER)
    run(ORDER)
    run(ORDER)  # a redelivered duplicate
    assert services.effects == {"reserve": 1, "charge": 1}


def test_the_rq_function_answers_a_duplicate_in_flight_after_waiting(
    store: RedisStore,
) -> None:
    from idemkey import RequestInFlightError

    services = Services()
    run = run_blocks("docs/steps.md", namespace(services, store))["rq_place_order"]
    fast = store.policy.replace(wait=0.05)
    with guard(store, "order:o-1", payload=ORDER):
        run.__globals__["job_policy"] = fast  # this block's own globals
        with pytest.raises(RequestInFlightError):  # RQ's Retry runs it again later
            run(ORDER)


async def test_the_arq_coroutine_resumes_and_turns_in_flight_into_a_retry(
    real_async_client: redis.asyncio.Redis, prefix: str
) -> None:
    from idemkey import RequestInFlightError, aguard

    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix, lease=10))
    services = Services()
    job = run_blocks("docs/steps.md", namespace(services, store))["arq_place_order"]
    ctx = {"idemkey": store, "job_try": 1}
    try:
        services.crash_before.add("charge")
        with pytest.raises(Crash):
            await job(ctx, ORDER)
        assert await job(ctx, ORDER) == {"order": "o-1", "charge": "ch_1"}
        assert services.effects == {"reserve": 1, "charge": 1}

        other = {**ORDER, "id": "o-2"}
        async with aguard(store, "order:o-2", payload=other):  # the first run, in flight
            with pytest.raises(ArqRetry) as retry:
                await job(ctx, other)
        # Deferred by retry_after as docs/steps.md defines it: 1 s, not the 10 s lease left.
        assert retry.value.defer == 1.0
        cause = retry.value.__cause__
        assert isinstance(cause, RequestInFlightError)
        assert cause.retry_after == 1.0 < 5 < cause.lease_remaining <= 10
    finally:
        await store.aclose()


def test_the_celery_block_defines_an_idempotent_task(store: RedisStore) -> None:
    names = run_blocks("docs/steps.md", namespace(Services(), store), _CELERY_BLOCK)
    task = names["place_order_task"]
    assert isinstance(task, IdempotentTask)
    assert task.acks_late  # IdempotentTask's defaults, not set in the sample
    assert task.reject_on_worker_lost
    key, _ = task._identify(({"id": "o-1"},), {})
    assert key.startswith("args:")
