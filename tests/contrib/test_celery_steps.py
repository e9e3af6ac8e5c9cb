"""IdempotentTask's retry and time settings against Celery's own, in-process (no worker): a
remembered failure joins ``dont_autoretry_for``, the soft time limit becomes the guard's
deadline, ``step_retry`` carries the task's Celery retry settings into a StepRetry."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery import Celery

from idemkey import ConfigurationError, Policy, RedisStore, StepRetry, step_deadline
from idemkey.contrib.celery import IdempotentTask, step_retry


class Declined(Exception):
    pass


@pytest.fixture
def app() -> Celery:
    return Celery("steps", set_as_current=False)


@pytest.fixture
def store(real_client: redis.Redis, prefix: str) -> RedisStore:
    return RedisStore(real_client, Policy(prefix=prefix))


def test_remembered_failures_join_dont_autoretry_for(app: Celery, store: RedisStore) -> None:
    @app.task(
        base=IdempotentTask,
        shared=False,
        idempotency_store=store,
        idempotency_cache_exceptions={Declined: ()},
        autoretry_for=(Exception,),
    )
    def charge() -> None: ...

    @app.task(base=IdempotentTask, shared=False, idempotency_store=store)
    def plain() -> None: ...

    assert charge.dont_autoretry_for == (Declined,)
    assert tuple(getattr(plain, "dont_autoretry_for", ())) == ()


def test_the_soft_time_limit_is_the_guards_deadline(app: Celery, store: RedisStore) -> None:
    @app.task(base=IdempotentTask, shared=False, bind=True, idempotency_store=store,
              soft_time_limit=30)  # fmt: skip
    def limited(self: Any, n: int) -> float | None:
        return self.idempotent_call.step("peek", step_deadline)  # type: ignore[no-any-return]

    @app.task(base=IdempotentTask, shared=False, bind=True, idempotency_store=store,
              soft_time_limit=30, idempotency_deadline=5)  # fmt: skip
    def own(self: Any, n: int) -> float | None:
        return self.idempotent_call.step("peek", step_deadline)  # type: ignore[no-any-return]

    @app.task(base=IdempotentTask, shared=False, bind=True, idempotency_store=store)
    def unbounded(self: Any, n: int) -> float | None:
        return self.idempotent_call.step("peek", step_deadline)  # type: ignore[no-any-return]

    assert 29 < limited.apply((1,)).get() <= 30
    assert 4 < own.apply((1,)).get() <= 5
    assert unbounded.apply((1,)).get() is None


def test_step_retry_carries_the_celery_retry_settings(app: Celery, store: RedisStore) -> None:
    @app.task(base=IdempotentTask, shared=False, idempotency_store=store,
              autoretry_for=(ConnectionError,), dont_autoretry_for=(Declined,), max_retries=4,
              retry_backoff=2, retry_backoff_max=60, retry_jitter=False)  # fmt: skip
    def backed_off() -> None: ...

    @app.task(base=IdempotentTask, shared=False, idempotency_store=store,
              default_retry_delay=7)  # fmt: skip
    def defaults() -> None: ...

    retry = step_retry(backed_off)
    assert (retry.attempts, retry.backoff, retry.multiplier, retry.max_backoff) == (5, 2, 2, 60)
    assert (retry.jitter, retry.retry_on, retry.never) == (0, (ConnectionError,), (Declined,))
    assert [retry.delay(n) for n in (1, 2, 3, 6)] == [2, 4, 8, 60]
    plain = step_retry(defaults, timeout=3)
    assert (plain.attempts, plain.backoff, plain.multiplier, plain.timeout) == (4, 7, 1, 3)
    assert plain.retry_on == (Exception,)
    assert isinstance(plain, StepRetry)

    backed_off.max_retries = None
    with pytest.raises(ConfigurationError):
        step_retry(backed_off)
