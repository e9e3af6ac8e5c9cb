"""Step retries and timeouts (``call.step(..., retry=StepRetry(...))``), on the real server and
on fakeredis.

What a user relies on: without ``retry=`` nothing changes (one attempt, no count stored); with
it a failing step is attempted again in place, up to ``attempts`` in all, the count kept in
the record so a takeover continues it; exceptions outside ``retry_on``, in ``never`` or in
``cache_exceptions`` are not retried; a release or a completion drops the count; a timed-out
attempt under aguard is cancelled and retried; a bad StepRetry is a ConfigurationError.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import types
from typing import Any

import pytest
import redis
import redis.asyncio

from idemkey import (
    AsyncRedisStore,
    ConfigurationError,
    JobDeadlineError,
    Policy,
    RedisStore,
    StepAttemptsExhaustedError,
    StepRetry,
    aguard,
    guard,
    step_deadline,
)
from idemkey._core import Record, record_for
from idemkey.guard import GUARD_METHOD
from idemkey.guard import _retry as guard_retry
from idemkey.guard import _state as guard_state
from idemkey.guard import _sync_attempt as sync_attempt
from idemkey.guard import _sync_steps as sync_steps
from tests._lease import lapse

QUICK = StepRetry(attempts=3, backoff=0, jitter=0)


class Flaky(Exception):
    pass


class Declined(Exception):
    pass


def guard_record(prefix: str, key: str) -> Record:
    return record_for(prefix, "", GUARD_METHOD, "", key)


@pytest.fixture
def store(sync_client: redis.Redis, prefix: str) -> RedisStore:
    return RedisStore(sync_client, Policy(prefix=prefix))


def failing(times: int, error: type[Exception] = Flaky) -> tuple[list[int], Any]:
    """A step function that fails ``times`` times, then returns how often it ran."""
    runs: list[int] = []

    def fn() -> int:
        runs.append(len(runs) + 1)
        if len(runs) <= times:
            raise error(f"attempt {len(runs)}")
        return len(runs)

    return runs, fn


def test_without_retry_a_failing_step_runs_once_and_counts_nothing(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    runs, fn = failing(1)
    with pytest.raises(Flaky), guard(store, "k") as call:
        call.step("charge", fn)
    assert runs == [1]
    fields = sync_client.hgetall(guard_record(prefix, "k").key)
    assert not any(name.startswith((b"a:", b"na")) for name in fields)


def test_a_failing_step_is_retried_in_place_until_it_succeeds(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    runs, fn = failing(2)
    with guard(store, "k") as call:
        assert call.step("charge", fn, retry=QUICK) == 3
        assert sync_client.hget(guard_record(prefix, "k").key, "a:charge") == b"3"
        call.save("done")
    assert runs == [1, 2, 3]
    # Completed: the counts went with the steps.
    assert sorted(sync_client.hgetall(guard_record(prefix, "k").key)) == [b"fp", b"resp"]


def test_the_last_attempt_raises_and_a_retry_of_the_call_counts_afresh(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    runs, fn = failing(4)
    with pytest.raises(Flaky, match="attempt 3"), guard(store, "k") as call:
        call.step("charge", fn, retry=QUICK)
    assert runs == [1, 2, 3]
    fields = sync_client.hgetall(guard_record(prefix, "k").key)
    assert b"a:charge" not in fields
    assert b"na" not in fields  # released: the count is dropped with the claim
    with guard(store, "k") as call:
        assert call.step("charge", fn, retry=QUICK) == 5  # attempts 4 (fails) and 5
        call.save("done")


@pytest.mark.parametrize(
    ("retry", "error"),
    [
        (StepRetry(attempts=3, backoff=0, never=(Declined,)), Declined),
        (StepRetry(attempts=3, backoff=0, retry_on=(Flaky,)), Declined),
    ],
)
def test_an_exception_not_retried_raises_at_once(
    store: RedisStore, retry: StepRetry, error: type[Exception]
) -> None:
    runs, fn = failing(5, error)
    with pytest.raises(error), guard(store, "k") as call:
        call.step("charge", fn, retry=retry)
    assert runs == [1]


def test_a_remembered_failure_is_not_retried(store: RedisStore) -> None:
    runs, fn = failing(5, Declined)
    for _ in range(2):
        with pytest.raises(Declined), guard(store, "k") as call:
            call.step("charge", fn, retry=QUICK, cache_exceptions=(Declined,))
    assert runs == [1]


def test_a_takeover_continues_the_count(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    record = guard_record(prefix, "k")
    runs, fn = failing(10)
    crashed = guard(store, "k")
    call = crashed.__enter__()  # an executor that will never leave its block
    with pytest.raises(Flaky):
        call.step("charge", fn, retry=StepRetry(attempts=2, backoff=0))
    # It died here (no release): its heartbeat stops, its lease lapses.
    store._unwatch(record, crashed.claim.owner)  # type: ignore[union-attr]
    assert lapse(sync_client, record) == 1
    with guard(store, "k") as taker:
        assert taker.takeover
        with pytest.raises(StepAttemptsExhaustedError) as spent:
            taker.step("charge", fn, retry=StepRetry(attempts=2, backoff=0))
        assert spent.value.attempts == 2
        assert runs == [1, 2]  # not run a third time: both attempts were used
        assert sync_client.hget(record.key, "a:charge") == b"3"
        # A step with attempts to spare continues from the record's count.
        assert taker.step("ship", fn, retry=StepRetry(attempts=20, backoff=0)) == 11
        assert sync_client.hget(record.key, "a:ship") == b"9"


def test_the_backoff_grows_and_stays_within_its_bounds() -> None:
    retry = StepRetry(backoff=0.1, multiplier=2, max_backoff=0.5, jitter=0)
    assert [retry.delay(n) for n in (1, 2, 3, 4, 50)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    jittered = StepRetry(backoff=1, jitter=0.5)
    object.__setattr__(jittered, "_random", random.Random(1))  # a seeded draw
    delays = [jittered.delay(1) for _ in range(200)]
    assert 0.5 <= min(delays) < 0.6
    assert 1.4 < max(delays) <= 1.5


def test_a_huge_backoff_growth_stays_at_its_cap() -> None:
    """A power past the float range is the cap, not an OverflowError (it raised on 2ba1d64)."""
    retry = StepRetry(attempts=100, multiplier=1e5, max_backoff=30, jitter=0)
    assert retry.delay(70) == retry.delay(100) == 30.0


def test_a_replaced_retry_draws_its_own_jitter() -> None:
    """dataclasses.replace makes a retry with a generator of its own (2ba1d64 shared one)."""
    first = StepRetry(backoff=1, jitter=0.5)
    second = dataclasses.replace(first, attempts=5)
    assert second._random is not first._random
    assert second.attempts == 5
    assert second.jitter == 0.5


@pytest.mark.parametrize(
    "options",
    [{"backoff": True}, {"max_backoff": True}, {"timeout": True}, {"backoff": float("nan")}],
)
def test_durations_are_checked_as_every_option_is(options: dict[str, object]) -> None:
    """Through _options.seconds, as guard(deadline=) is: a bool is no duration (2ba1d64 took
    backoff=True as one second, and refused deadline=True)."""
    with pytest.raises(ConfigurationError, match="seconds"):
        StepRetry(**options)  # type: ignore[arg-type]


def test_a_bool_deadline_is_refused_like_a_bool_backoff(store: RedisStore) -> None:
    with pytest.raises(ConfigurationError, match="deadline="), guard(store, "k", deadline=True):
        pass  # pragma: no cover


def test_the_waits_between_attempts_are_slept(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(sync_steps, "sleep", slept.append)
    _, fn = failing(2)
    with guard(store, "k") as call:
        call.step("charge", fn, retry=StepRetry(attempts=3, backoff=0.25, jitter=0))
    assert slept == [0.25, 0.5]


@pytest.mark.parametrize(
    "bad",
    [
        {"attempts": 0},
        {"attempts": 2.0},
        {"backoff": -1},
        {"multiplier": 0.5},
        {"jitter": 2},
        {"timeout": 0},
        {"retry_on": ("Flaky",)},
        {"never": 3},
        {"bogus": 1},
        {"atempts": 2},
    ],
)
def test_a_bad_step_retry_is_a_configuration_error(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        StepRetry(**bad)


def test_an_unknown_step_retry_option_is_named() -> None:
    with pytest.raises(ConfigurationError, match=r"StepRetry\(atempts=...\): not an option; did"):
        StepRetry(atempts=2)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="at most 8 positional"):
        StepRetry(3, 0.1, 2.0, 10.0, 0.1, (Exception,), (), None, 1)  # type: ignore[call-arg]


def test_retry_takes_only_a_step_retry(store: RedisStore) -> None:
    with pytest.raises(ConfigurationError), guard(store, "k") as call:
        call.step("charge", print, retry=3)


def test_a_sync_step_reads_its_cooperative_deadline(store: RedisStore) -> None:
    seen: list[float | None] = []
    with guard(store, "k") as call:
        call.step("charge", lambda: seen.append(step_deadline()), retry=StepRetry(timeout=5))
        call.step("ship", lambda: seen.append(step_deadline()))
    assert seen[0] is not None
    assert 4 < seen[0] <= 5
    assert seen[1] is None
    assert step_deadline() is None


async def test_an_async_attempt_that_runs_out_of_time_is_cancelled_and_retried(
    async_client: redis.asyncio.Redis, prefix: str
) -> None:
    store = AsyncRedisStore(async_client, Policy(prefix=prefix))
    started: list[int] = []
    finished: list[int] = []

    async def slow_first() -> str:
        started.append(len(started) + 1)
        if len(started) == 1:
            await asyncio.sleep(30)  # cancelled long before
            finished.append(1)
        return "charged"

    retry = StepRetry(attempts=2, backoff=0, timeout=0.2)
    async with aguard(store, "k") as call:
        assert await call.step("charge", slow_first, retry=retry) == "charged"
        call.save("done")
    assert started == [1, 2]
    assert finished == []


async def test_an_async_step_out_of_attempts_raises_timeout_error(
    async_client: redis.asyncio.Redis, prefix: str
) -> None:
    store = AsyncRedisStore(async_client, Policy(prefix=prefix))

    async def hangs() -> None:
        await asyncio.sleep(30)

    with pytest.raises(TimeoutError):
        async with aguard(store, "k") as call:
            await call.step("charge", hangs, retry=StepRetry(attempts=1, timeout=0.1))


def test_no_step_starts_after_the_guard_deadline_and_a_retry_resumes(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []
    now = [1000.0]
    clock = types.SimpleNamespace(monotonic=lambda: now[0])
    for module in (guard_state, sync_steps, guard_retry, sync_attempt):  # the guard's clock only
        monkeypatch.setattr(module, "time", clock)
    with pytest.raises(JobDeadlineError) as late, guard(store, "k", deadline=5) as call:  # noqa: PT012
        call.step("reserve", ran.append, "reserve")
        assert call.step("peek", step_deadline) == 5
        now[0] += 6  # the job went on too long
        call.step("charge", ran.append, "charge")
    assert late.value.seconds == 5
    assert isinstance(late.value, TimeoutError)
    with guard(store, "k", deadline=5) as call:
        assert call.resumed_steps == ("reserve", "peek")
        call.step("charge", ran.append, "charge")
        call.save("done")
    assert ran == ["reserve", "charge"]


def test_a_retry_whose_wait_would_pass_the_deadline_stops_at_once(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(sync_steps, "sleep", slept.append)
    runs, fn = failing(5)
    retry = StepRetry(attempts=5, backoff=10, jitter=0)
    with pytest.raises(JobDeadlineError), guard(store, "k", deadline=2) as call:
        call.step("charge", fn, retry=retry)
    assert runs == [1]
    assert slept == []


@pytest.mark.parametrize("bad", [0, -1, float("inf"), "5", True])
def test_a_bad_deadline_is_a_configuration_error(store: RedisStore, bad: object) -> None:
    with pytest.raises(ConfigurationError):
        guard(store, "k", deadline=bad)  # type: ignore[arg-type]


async def test_an_async_step_running_at_the_deadline_is_cancelled(
    async_client: redis.asyncio.Redis, prefix: str
) -> None:
    store = AsyncRedisStore(async_client, Policy(prefix=prefix))
    finished: list[str] = []

    async def hangs() -> None:
        await asyncio.sleep(30)
        finished.append("hangs")

    with pytest.raises(JobDeadlineError):  # noqa: PT012
        async with aguard(store, "k", deadline=0.2) as call:
            await call.step("quick", lambda: "ok")
            await call.step("charge", hangs)
    assert finished == []
    async with aguard(store, "k") as call:
        assert call.resumed_steps == ("quick",)
