"""The Prometheus hook, with the real prometheus_client, fed by real guard() and HTTP calls."""

from __future__ import annotations

import asyncio
import inspect
import logging
import warnings
from collections.abc import Coroutine
from typing import Any

import pytest
import redis
import redis.asyncio
from prometheus_client import CollectorRegistry, generate_latest

from idemkey import (
    AsyncRedisStore,
    ConfigurationError,
    Event,
    KeyReuseError,
    Policy,
    RedisStore,
    aguard,
    guard,
)
from idemkey.cli.demo_app import account_scope, create_app
from idemkey.contrib import chain
from idemkey.contrib.prometheus import prometheus_hook
from tests._servers import async_wait_until


def _count(registry: CollectorRegistry, kind: str, method: str = "GUARD", route: str = "") -> float:
    labels = {"kind": kind, "method": method, "route": route}
    return registry.get_sample_value("idemkey_events_total", labels) or 0.0


def test_counts_guard_events(real_client: redis.Redis, prefix: str) -> None:
    registry = CollectorRegistry()
    store = RedisStore(real_client, Policy(prefix=prefix, on_event=prometheus_hook(registry)))
    try:
        for _ in range(3):
            with guard(store, "invoice-1", payload=b"a") as call:
                if not call.replayed:
                    call.save("ch_1")
        with pytest.raises(KeyReuseError), guard(store, "invoice-1", payload=b"b"):
            pass
    finally:
        store.close()
    assert _count(registry, "claimed") == 1
    assert _count(registry, "completed") == 1
    assert _count(registry, "replayed") == 2
    assert _count(registry, "mismatch") == 1
    assert _count(registry, "released") == 0


def test_counts_http_events_by_route(real_client: redis.Redis, prefix: str) -> None:
    registry = CollectorRegistry()
    policy = Policy(prefix=prefix, scope=account_scope, on_event=prometheus_hook(registry))
    app = create_app(RedisStore(real_client, policy))
    client = app.test_client()
    body = {"amount": 100, "currency": "eur"}
    # A key and an account nobody would pick as a metric or label name, to look for them after.
    headers = {"Idempotency-Key": "order-7f3a9c", "Account": "acct_secret_42"}
    for _ in range(2):
        assert client.post("/charges", json=body, headers=headers).status_code == 201
    assert client.post("/charges", json=body).status_code == 400  # no key: no record, no event
    assert _count(registry, "claimed", "POST", "/charges") == 1
    assert _count(registry, "completed", "POST", "/charges") == 1
    assert _count(registry, "replayed", "POST", "/charges") == 1
    exposition = generate_latest(registry).decode()
    assert 'idemkey_events_total{kind="replayed",method="POST",route="/charges"} 1.0' in exposition
    # Raw keys and scopes never become labels (unbounded, possibly secret): every sample is
    # labelled by kind, method and route (histogram buckets add le), and neither the key nor
    # the account appears anywhere in the exposition.
    samples = [s for metric in registry.collect() for s in metric.samples]
    assert samples
    assert all(set(s.labels) <= {"kind", "method", "route", "le"} for s in samples), samples
    assert "order-7f3a9c" not in exposition
    assert "acct_secret_42" not in exposition


def test_redis_time_histogram() -> None:
    registry = CollectorRegistry()
    hook = prometheus_hook(registry, namespace="payments")
    hook(Event("completed", "ab" * 16, "/charges", "POST", redis_seconds=0.0004))
    hook(Event("completed", "ab" * 16, "/charges", "POST", redis_seconds=0.003))
    hook(Event("claimed", "ab" * 16, "/charges", "POST"))  # no Redis time: counted, not timed
    assert registry.get_sample_value("payments_redis_seconds_count", {"kind": "completed"}) == 2
    le_1ms = {"kind": "completed", "le": "0.001"}
    assert registry.get_sample_value("payments_redis_seconds_bucket", le_1ms) == 1
    assert registry.get_sample_value("payments_redis_seconds_count", {"kind": "claimed"}) is None
    labels = {"kind": "claimed", "method": "POST", "route": "/charges"}
    assert registry.get_sample_value("payments_events_total", labels) == 1


def test_one_hook_per_registry() -> None:
    registry = CollectorRegistry()
    prometheus_hook(registry)
    with pytest.raises(ValueError, match="Duplicated"):
        prometheus_hook(registry)


def test_chain_calls_every_hook_even_after_one_fails() -> None:
    seen: list[str] = []

    def failing(event: Event) -> None:
        raise RuntimeError("boom")

    hook = chain(failing, None, lambda event: seen.append(event.kind))
    with pytest.raises(RuntimeError, match="boom"):
        hook(Event("claimed", "00" * 16))
    assert seen == ["claimed"]


def test_chain_refuses_an_async_hook_as_policy_does() -> None:
    """Policy(on_event=...) refuses an async hook; wrapped in chain() it was taken, and its
    coroutine was never awaited: every event lost, with only a RuntimeWarning to tell."""

    async def to_collector(event: Event) -> None:  # pragma: no cover
        pass

    class AsyncHook:
        async def __call__(self, event: Event) -> None:  # pragma: no cover
            pass

    for hook in (to_collector, AsyncHook()):
        with pytest.raises(ConfigurationError, match=r"chain\(\) argument 2: .*not async"):
            chain(print, hook)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"chain\(\) argument 1: expected a callable"):
        chain("print")  # type: ignore[arg-type]


async def test_a_hook_returning_a_coroutine_is_closed_and_logged_once(
    real_async_client: redis.asyncio.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``lambda e: queue.put(e)`` (an asyncio.Queue) passes the Policy's check but returns a
    coroutine nobody awaits, directly or through chain(): each is closed (no "never awaited"
    RuntimeWarning per event) and one WARNING per hook says so; a hook that schedules a task
    is left be."""
    queue: asyncio.Queue[Event] = asyncio.Queue()
    kept: list[Coroutine[Any, Any, None]] = []

    def put_and_keep(event: Event) -> Coroutine[Any, Any, None]:
        kept.append(queue.put(event))
        return kept[-1]

    scheduled: list[str] = []

    async def collect(event: Event) -> None:
        scheduled.append(event.kind)

    hooks: dict[str, Any] = {
        "direct": lambda event: queue.put(event),  # dropped at once: unclosed, Python warns
        "chained": chain(put_and_keep),  # type: ignore[arg-type]  # the mistake mypy flags
        "scheduling": lambda event: asyncio.get_running_loop().create_task(collect(event)),
    }
    caplog.set_level(logging.WARNING, logger="idemkey")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name, hook in hooks.items():
            store = AsyncRedisStore(
                real_async_client, Policy(prefix=f"{prefix}{name}", on_event=hook)
            )
            try:
                for _ in range(2):
                    async with aguard(store, "k") as call:
                        if not call.replayed:
                            call.save(1)
            finally:
                await store.aclose()
    assert [str(w.message) for w in caught] == []
    assert len(kept) == 3  # claimed, completed, replayed
    assert {inspect.getcoroutinestate(coroutine) for coroutine in kept} == {"CORO_CLOSED"}
    assert queue.empty()
    told = [r.getMessage() for r in caplog.records if "never awaited" in r.getMessage()]
    assert len(told) == 2, told  # one per hook, not one per event
    assert all("Queue.put" in line and "put_nowait" in line for line in told), told
    await async_wait_until(lambda: len(scheduled) == 3, 10, "the scheduled tasks' events")
