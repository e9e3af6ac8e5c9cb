"""The Celery app of tests/contrib/test_celery.py, for the test process and the real worker.

The worker imports :mod:`tests.contrib._celery_worker`, which calls :func:`make_app` with the
broker URL, key prefix and idemkey store URL the test put in its environment. Every side
effect of a task is counted in the broker's Redis, so the test sees how often each piece of
work really ran (even while the idemkey Redis, when it is another server, is down).
"""

from __future__ import annotations

import os
from datetime import date, datetime, time, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID

import redis
from celery import Celery
from celery.exceptions import Ignore

from idemkey import Policy, RedisStore, StepRetry
from idemkey.contrib.celery import IdempotentTask

LEASE = 1.0  # seconds: a killed worker's record is taken over soon after
STEPS = ("reserve", "charge", "ship")
WAIT = 30  # seconds a blocked task waits for the test's go signal


#: What tests.typed_result returns besides its order and runs: each type Celery's JSON (kombu's
#: registry) carries as itself, where plain JSON would give a str (or a list for the tuple).
TYPED: dict[str, Any] = {
    "at": datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc),
    "naive": datetime(2024, 5, 1, 12, 0),
    "day": date(2024, 6, 1),
    "time": time(9, 30),
    "total": Decimal("12.10"),
    "id": UUID(int=7),
    "text": b"abc",
    "raw": b"\x00\xff",
    "nested": [{"due": date(2024, 7, 1)}, ("pair", Decimal("0.5"))],
}


class CardDeclined(Exception):
    """A deterministic failure the tasks declare in ``idempotency_cache_exceptions``."""


def make_app(
    url: str, prefix: str, store_url: str | None = None, result_serializer: str = "json"
) -> Celery:
    """The app on broker ``url``; the idempotency records live at ``store_url`` (default
    ``url``)."""
    app = Celery("idemkey_tests", broker=url, backend=url, set_as_current=False)
    app.conf.update(
        task_default_queue=prefix,
        broker_connection_retry_on_startup=True,
        # A message a killed worker took but never acknowledged comes back after 2 s; the
        # worker looks for such messages every second.
        broker_transport_options={
            "visibility_timeout": 2,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        },
        worker_prefetch_multiplier=1,
        result_expires=600,
        result_extended=True,  # the stored result names its retry count
        result_serializer=result_serializer,
        accept_content=["json", result_serializer],
        result_accept_content=["json", result_serializer],
    )

    def make_store() -> RedisStore:
        redis.Redis.from_url(url).incr(f"{prefix}:stores")  # each call, in the broker's Redis
        records = redis.Redis.from_url(store_url or url)
        return RedisStore(records, Policy(prefix=prefix, lease=LEASE))

    def client() -> redis.Redis:
        return redis.Redis.from_url(url)

    @app.task(
        base=IdempotentTask,
        shared=False,
        bind=True,
        name="tests.slow_total",
        idempotency_store=make_store,
        idempotency_retry_max=0.3,
    )
    def slow_total(self: IdempotentTask, order_id: str, amount: int) -> dict[str, Any]:
        """Counts its runs, then waits for the test's go before it returns."""
        redis_client = client()
        redis_client.incr(f"{prefix}:runs")
        redis_client.blpop([f"{prefix}:go"], timeout=WAIT)
        return {"order": order_id, "total": amount * 2, "pid": os.getpid()}

    @app.task(
        base=IdempotentTask,
        shared=False,
        bind=True,
        name="tests.slow_default",
        idempotency_store=make_store,
        idempotency_policy=Policy(prefix=prefix),  # the default lease, 30 s
    )
    def slow_default(self: IdempotentTask, order_id: str, amount: int) -> dict[str, Any]:
        """slow_total with the default lease and idempotency_retry_max."""
        redis_client = client()
        redis_client.incr(f"{prefix}:runs")
        redis_client.blpop([f"{prefix}:go"], timeout=WAIT)
        return {"order": order_id, "total": amount * 2}

    # acks_late and reject_on_worker_lost are IdempotentTask's defaults: not set here.
    @app.task(
        base=IdempotentTask,
        shared=False,
        bind=True,
        name="tests.place_order",
        idempotency_store=make_store,
        idempotency_key=lambda order_id: f"order:{order_id}",
    )
    def place_order(self: IdempotentTask, order_id: str) -> list[Any]:
        """Three recovery points; while ``{prefix}:block`` exists it stops after the step
        named there (once: it deletes it), tells the test (``{prefix}:after`` names the step,
        ``{prefix}:pid`` the process) and waits, to be killed."""
        redis_client = client()
        call = self.idempotent_call
        results = []
        for name in STEPS:
            results.append(call.step(name, side_effect, redis_client, prefix, name, call.fence))
            if redis_client.get(f"{prefix}:block") == name.encode():
                redis_client.delete(f"{prefix}:block")
                redis_client.set(f"{prefix}:pid", os.getpid())
                redis_client.set(f"{prefix}:after", name)
                redis_client.blpop([f"{prefix}:go"], timeout=WAIT)
        return results

    @app.task(
        base=IdempotentTask,
        shared=False,
        bind=True,
        name="tests.retried_order",
        idempotency_store=make_store,
        idempotency_key=lambda order_id: f"retried:{order_id}",
    )
    def retried_order(self: IdempotentTask, order_id: str) -> list[Any]:
        """Three recovery points, the second retried in place (StepRetry, 4 attempts): its
        first attempt fails, its second tells the test (``{prefix}:after`` = "attempt-2",
        ``{prefix}:pid``) and waits, to be killed; later attempts succeed. Every attempt is
        counted in ``{prefix}:tries:charge``, each successful one in ``side:charge``."""
        redis_client = client()
        call = self.idempotent_call

        def charge() -> dict[str, Any]:
            tries = redis_client.incr(f"{prefix}:tries:charge")
            if tries == 1:
                raise ConnectionError("the PSP timed out")
            if tries == 2:
                redis_client.set(f"{prefix}:pid", os.getpid())
                redis_client.set(f"{prefix}:after", "attempt-2")
                redis_client.blpop([f"{prefix}:go"], timeout=WAIT)
            attempt = int(redis_client.hget(call_record_key(call), "a:charge") or 0)
            return {**side_effect(redis_client, prefix, "charge", call.fence), "attempt": attempt}

        retry = StepRetry(attempts=4, backoff=0.05, jitter=0)
        return [
            call.step("reserve", side_effect, redis_client, prefix, "reserve", call.fence),
            call.step("charge", charge, retry=retry),
            call.step("ship", side_effect, redis_client, prefix, "ship", call.fence),
        ]

    def charge(order_id: str, card: str) -> dict[str, Any]:
        """What both charge tasks run: counts its runs; card "declined" fails for good,
        "flaky" fails on its first run."""
        runs = client().incr(f"{prefix}:runs:{order_id}")
        if card == "declined":
            raise CardDeclined(f"card declined for {order_id}")
        if card == "no-funds":  # two args: a duplicate must raise it with both
            raise CardDeclined("insufficient_funds", 51)
        if card == "flaky" and runs == 1:
            raise ConnectionError("the PSP timed out")
        return {"order": order_id, "runs": runs}

    @app.task(
        base=IdempotentTask,
        shared=False,
        bind=True,
        name="tests.charge_card",
        idempotency_store=make_store,
        idempotency_cache_exceptions=(CardDeclined,),
    )
    def charge_card(self: IdempotentTask, order_id: str, card: str) -> dict[str, Any]:
        """Counts its runs; card "declined" fails for good, "flaky" fails on its first run."""
        return charge(order_id, card)

    @app.task(
        base=IdempotentTask,
        shared=False,
        bind=True,
        name="tests.charge_card_autoretry",
        idempotency_store=make_store,
        idempotency_cache_exceptions=(CardDeclined,),
        autoretry_for=(Exception,),
        max_retries=3,
        default_retry_delay=0.1,
    )
    def charge_card_autoretry(self: IdempotentTask, order_id: str, card: str) -> dict[str, Any]:
        """charge_card under Celery's autoretry: Celery sends a transient failure again, never
        a remembered one (IdempotentTask adds it to dont_autoretry_for)."""
        return charge(order_id, card)

    def retried_once(task: IdempotentTask, order_id: str) -> dict[str, Any]:
        """What the retried tasks below run: a step, then their body, counted in
        ``{prefix}:runs:{order_id}`` (the step in ``{prefix}:side:reserve``)."""
        redis_client = client()
        call = task.idempotent_call
        call.step("reserve", side_effect, redis_client, prefix, "reserve", call.fence)
        return {"order": order_id, "runs": redis_client.incr(f"{prefix}:runs:{order_id}")}

    @app.task(
        base=IdempotentTask,
        shared=False,
        bind=True,
        name="tests.retry_self",
        idempotency_store=make_store,
        idempotency_cache_exceptions=(Exception,),
    )
    def retry_self(self: IdempotentTask, order_id: str) -> dict[str, Any]:
        """Remembers every Exception, and asks Celery for a retry (``self.retry()``) on its
        first run, after its step."""
        done = retried_once(self, order_id)
        if done["runs"] == 1:
            raise self.retry(countdown=0.1)
        return done

    @app.task(
        base=IdempotentTask,
        shared=False,
        bind=True,
        name="tests.retry_auto",
        idempotency_store=make_store,
        idempotency_cache_exceptions=(Exception,),
        autoretry_for=(ConnectionError,),
        max_retries=3,
        default_retry_delay=0.1,
    )
    def retry_auto(self: IdempotentTask, order_id: str) -> dict[str, Any]:
        """Remembers every Exception but the ConnectionError Celery's autoretry sends again,
        which it raises on its first run, after its step."""
        done = retried_once(self, order_id)
        if done["runs"] == 1:
            raise ConnectionError("the PSP timed out")
        return done

    @app.task(
        base=IdempotentTask,
        shared=False,
        bind=True,
        name="tests.ignore_once",
        idempotency_store=make_store,
        idempotency_cache_exceptions=(Exception,),
    )
    def ignore_once(self: IdempotentTask, order_id: str) -> dict[str, Any]:
        """Remembers every Exception, and raises Celery's Ignore on its first run."""
        done = retried_once(self, order_id)
        if done["runs"] == 1:
            raise Ignore()
        return done

    @app.task(
        base=IdempotentTask,
        shared=False,
        bind=True,
        name="tests.note_once",
        idempotency_store=make_store,
    )
    def note_once(self: IdempotentTask, order_id: str) -> dict[str, Any]:
        """Counts its runs (in the broker's Redis): no steps, no waiting."""
        runs = client().incr(f"{prefix}:runs")
        return {"order": order_id, "runs": runs}

    @app.task(
        base=IdempotentTask,
        shared=False,
        bind=True,
        name="tests.note_bounded",
        idempotency_store=make_store,
        idempotency_store_retries=2,
        idempotency_store_retry_delay=0.1,
    )
    def note_bounded(self: IdempotentTask, order_id: str) -> dict[str, Any]:
        """note_once that gives up on an unreachable idemkey Redis after 2 retries."""
        runs = client().incr(f"{prefix}:runs")
        return {"order": order_id, "runs": runs}

    @app.task(
        base=IdempotentTask,
        shared=False,
        bind=True,
        name="tests.typed_result",
        idempotency_store=make_store,
    )
    def typed_result(self: IdempotentTask, order_id: str) -> dict[str, Any]:
        """Counts its runs; returns the types Celery's JSON carries beyond JSON's own."""
        return {"order": order_id, "runs": client().incr(f"{prefix}:runs"), **TYPED}

    @app.task(
        base=IdempotentTask,
        shared=False,
        bind=True,
        name="tests.not_storable",
        idempotency_store=make_store,
    )
    def not_storable(self: IdempotentTask, order_id: str) -> dict[str, Any]:
        """Counts its runs; returns what msgspec cannot encode (ResultNotStorableError)."""
        client().incr(f"{prefix}:runs:{order_id}")
        return {"order": order_id, "handle": object()}

    @app.task(
        base=IdempotentTask,
        shared=False,
        bind=True,
        name="tests.note_pair",
        idempotency_store=make_store,
    )
    def note_pair(self: IdempotentTask, order_id: str) -> tuple[str, int]:
        """Counts its runs; returns a tuple (msgpack and JSON hand the caller a list)."""
        return (order_id, client().incr(f"{prefix}:runs"))

    class Reporting(IdempotentTask):
        """Tells the test what ``request.idempotent_replayed`` said, after each run."""

        def after_return(self, *args: Any, **kwargs: Any) -> None:
            said = getattr(self.request, "idempotent_replayed", None)
            client().rpush(f"{prefix}:replayed", repr(said))

    @app.task(
        base=Reporting,
        shared=False,
        bind=True,
        name="tests.note_outcome",
        idempotency_store=make_store,
        idempotency_outcome=True,
    )
    def note_outcome(self: IdempotentTask, order_id: str) -> dict[str, Any]:
        """note_once whose result says whether it was a replay."""
        runs = client().incr(f"{prefix}:runs")
        return {"order": order_id, "runs": runs}

    return app


def call_record_key(call: Any) -> str:
    return str(call.record.key)


def side_effect(client: redis.Redis, prefix: str, name: str, fence: int | None) -> dict[str, Any]:
    client.incr(f"{prefix}:side:{name}")
    return {"step": name, "pid": os.getpid(), "fence": fence}
