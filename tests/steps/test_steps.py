"""call.step / call.step_key under guard and aguard, on the real server and on fakeredis.

What a user relies on: a finished step never runs again for its record (after a release, a
takeover, or twice in one call), its stored result comes back instead, an unstorable result
does not count as finished, a completed record replays without its steps, and the key of a
record with finished steps stays bound to its payload.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
import redis
import redis.asyncio

from idemkey import (
    AsyncRedisStore,
    ConfigurationError,
    KeyReuseError,
    Policy,
    RedisStore,
    ResultNotStorableError,
    StepNotStorableError,
    UsageError,
    aguard,
    current_call,
    guard,
)
from idemkey._core import Record, record_for, record_state
from idemkey.guard import GUARD_METHOD
from tests._lease import lapse
from tests._servers import async_wait_until


class Boom(Exception):
    pass


@dataclasses.dataclass
class Receipt:
    charge_id: str
    amount: int


def guard_record(prefix: str, key: str) -> Record:
    return record_for(prefix, "", GUARD_METHOD, "", key)


def fail_after(store: RedisStore, key: str, body: Any, payload: object = b"") -> Any:
    """Run ``body(call)`` in a guard block that then fails (so the key is released)."""
    result: Any = None
    with pytest.raises(Boom), guard(store, key, payload=payload) as call:  # noqa: PT012
        result = body(call)
        raise Boom
    return result


async def afail_after(store: AsyncRedisStore, key: str, body: Any, payload: object = b"") -> Any:
    result: Any = None
    with pytest.raises(Boom):  # noqa: PT012
        async with aguard(store, key, payload=payload) as call:
            result = await body(call)
            raise Boom
    return result


@pytest.fixture
def store(sync_client: redis.Redis, prefix: str) -> Any:
    store = RedisStore(sync_client, Policy(prefix=prefix, lease=10))
    yield store
    store.close()


@pytest.fixture
async def astore(async_client: redis.asyncio.Redis, prefix: str) -> Any:
    store = AsyncRedisStore(async_client, Policy(prefix=prefix, lease=10))
    yield store
    await store.aclose()


class Counter:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, name: str, value: Any = None) -> Any:
        self.calls.append(name)
        return {"step": name, "value": value}


# ---- sync ------------------------------------------------------------------------------------


def test_a_released_call_resumes_after_its_finished_steps(store: RedisStore) -> None:
    run = Counter()
    # The charge fails after "reserve": the block releases the key, the finished step stays.
    reserve = lambda call: call.step("reserve", run, "reserve", 1)  # noqa: E731
    reserved = fail_after(store, "order-1", reserve, "o1")
    assert reserved == {"step": "reserve", "value": 1}

    with guard(store, "order-1", payload="o1") as call:
        assert not call.replayed
        assert not call.takeover  # a release, not a crash
        assert call.resumed_steps == ("reserve",)
        assert call.step("reserve", run, "reserve", 1) == {"step": "reserve", "value": 1}
        assert call.step("charge", run, "charge", 2) == {"step": "charge", "value": 2}
        call.save("done")
    assert run.calls == ["reserve", "charge"]

    with guard(store, "order-1", payload="o1") as call:
        assert call.replayed
        assert call.result == "done"


def test_a_step_runs_once_per_name_within_one_call(store: RedisStore) -> None:
    run = Counter()
    with guard(store, "k") as call:
        first = call.step("a", run, "a", 1)
        again = call.step("a", run, "a", 2)  # same name: the stored result, not a second run
        call.save(None)
    assert run.calls == ["a"]
    assert first == again == {"step": "a", "value": 1}


def test_a_step_returns_the_stored_value_on_a_first_run_and_on_a_resume(
    store: RedisStore,
) -> None:
    first = fail_after(store, "k", lambda call: call.step("charge", Receipt, "ch_1", 500))
    with guard(store, "k") as call:
        resumed = call.step("charge", Receipt, "ch_2", 999)
    # Both as stored: a dataclass comes back as a dict, so the code after a step sees the same
    # value whether the step ran now or before a crash.
    assert first == resumed == {"charge_id": "ch_1", "amount": 500}


def test_an_unstorable_result_is_refused_and_the_step_runs_again(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    run: list[str] = []

    def unstorable() -> object:
        run.append("ran")
        return object()

    with (
        pytest.raises(StepNotStorableError, match=r"step 'bad' .* runs again on a retry") as err,
        guard(store, "k") as call,
    ):
        call.step("bad", unstorable)
    assert err.value.step == "bad"
    assert isinstance(err.value, ResultNotStorableError)  # what guard raises for its result
    assert sync_client.hget(guard_record(prefix, "k").key, "s:bad") is None
    with guard(store, "k") as call:
        assert call.resumed_steps == ()
        with pytest.raises(StepNotStorableError):
            call.step("bad", unstorable)
    assert run == ["ran", "ran"]


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("", "empty"),
        ("x" * 101, "at most 100"),
        ("a\nb", "printable"),
        ("\ud800", "printable"),
        (b"bytes", "must be a str"),
    ],
)
def test_bad_step_names_are_refused_before_anything_runs(
    store: RedisStore, name: Any, rule: str
) -> None:
    run = Counter()
    with guard(store, "k") as call:
        with pytest.raises(ConfigurationError, match=rule):
            call.step(name, run, "x")
        with pytest.raises(ConfigurationError, match=rule):
            call.step_key(name)
    assert run.calls == []


def test_a_step_that_raises_does_not_count_and_runs_again(store: RedisStore) -> None:
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise Boom
        return "ok"

    with pytest.raises(Boom), guard(store, "k") as call:
        call.step("flaky", flaky)
    with guard(store, "k") as call:
        assert call.step("flaky", flaky) == "ok"
        call.save(1)
    assert len(attempts) == 2


def test_a_key_with_finished_steps_stays_bound_to_its_payload(store: RedisStore) -> None:
    fail_after(store, "k", lambda call: call.step("charge", str, "charged A"), "order A")
    # Another order under the same key would resume A's charge: refused as a key reuse.
    with pytest.raises(KeyReuseError), guard(store, "k", payload="order B"):
        pass
    with guard(store, "k", payload="order A") as call:
        assert call.step("charge", str, "charged again") == "charged A"


def test_a_released_key_without_steps_is_free_for_another_payload(store: RedisStore) -> None:
    # Unchanged behaviour: no steps, so a release frees the key entirely.
    with pytest.raises(Boom), guard(store, "k", payload="order A"):
        raise Boom
    with guard(store, "k", payload="order B") as call:
        assert not call.replayed


def test_completion_drops_the_steps(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    with guard(store, "k") as call:
        call.step("a", str, "x")
        call.step("b", str, "y")
        call.save("done")
    fields = sync_client.hgetall(guard_record(prefix, "k").key)
    assert record_state(fields) == "complete"
    assert not [name for name in fields if name.startswith(b"s:") or name == b"ns"]


def test_steps_on_a_replayed_call_or_after_the_block_are_refused(store: RedisStore) -> None:
    with guard(store, "k") as call:
        call.save(1)
    with pytest.raises(RuntimeError, match="after the guard's block"):
        call.step("late", str, "x")
    with guard(store, "k") as replayed:
        assert replayed.replayed
        with pytest.raises(RuntimeError, match="replayed"):
            replayed.step("a", str, "x")
        with pytest.raises(RuntimeError, match="replayed"):
            replayed.step_key("a")


def test_an_async_function_is_refused_under_the_sync_guard(store: RedisStore) -> None:
    async def charge() -> str:
        return "x"

    with guard(store, "k") as call, pytest.raises(UsageError, match="use aguard"):
        call.step("charge", charge)


def test_step_key_is_stable_across_executors_and_distinct_per_step_and_record(
    store: RedisStore,
) -> None:
    first = fail_after(store, "order-1", lambda call: call.step_key("charge"))
    with guard(store, "order-1") as call:
        assert call.step_key("charge") == first
        assert call.step_key("ship") != first
    with guard(store, "order-2") as call:
        assert call.step_key("charge") != first
    assert first.startswith("ik_")
    assert len(first) == 35


# ---- async -----------------------------------------------------------------------------------


async def test_async_a_released_call_resumes_and_runs_each_step_once(
    astore: AsyncRedisStore,
) -> None:
    run = Counter()

    async def charge(amount: int) -> dict[str, Any]:
        run.calls.append("charge")
        return {"charged": amount}

    async def two_steps(call: Any) -> list[Any]:
        return [await call.step("reserve", run, "reserve"), await call.step("charge", charge, 5)]

    first = await afail_after(astore, "order-1", two_steps, "o1")
    assert first == [{"step": "reserve", "value": None}, {"charged": 5}]

    async with aguard(astore, "order-1", payload="o1") as call:
        assert call.resumed_steps == ("reserve", "charge")
        assert await call.step("reserve", run, "reserve") == {"step": "reserve", "value": None}
        assert await call.step("charge", charge, 5) == {"charged": 5}
        assert await call.step("ship", run, "ship") == {"step": "ship", "value": None}
        call.save("done")
    assert run.calls == ["reserve", "charge", "ship"]


async def test_async_an_unstorable_result_is_refused(
    astore: AsyncRedisStore, async_client: redis.asyncio.Redis, prefix: str
) -> None:
    async def unstorable() -> object:
        return object()

    with pytest.raises(StepNotStorableError):
        async with aguard(astore, "k") as call:
            await call.step("bad", unstorable)
    assert await async_client.hget(guard_record(prefix, "k").key, "s:bad") is None


async def test_async_a_stale_owner_cannot_checkpoint(
    astore: AsyncRedisStore, async_client: redis.asyncio.Redis, prefix: str
) -> None:
    from idemkey import LeaseLostError

    record = guard_record(prefix, "k")
    async with aguard(astore, "k") as stale:
        await stale.step("one", str, "1")
        assert await lapse(async_client, record) == 1  # the lease lapsed...
        async with aguard(astore, "k") as fresh:  # ...and another executor took over
            assert fresh.takeover
            assert fresh.resumed_steps == ("one",)
            with pytest.raises(LeaseLostError):
                await stale.step("two", str, "2")
            assert await fresh.step("two", str, "fresh") == "fresh"
            fresh.save("done")


class SlowCheckpointReplies(AsyncRedisStore):
    """Every checkpoint reaches Redis, then its caller waits (cancellably) for the reply until
    ``reply`` is set: a cancel that comes meanwhile cuts off a checkpoint already applied."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.applied = asyncio.Event()
        self.reply = asyncio.Event()

    async def checkpoint(self, *args: Any, **kwargs: Any) -> bytes | None:
        stored = await super().checkpoint(*args, **kwargs)
        self.applied.set()
        await self.reply.wait()  # the reply is on its way: the caller is cancelled here
        return stored


async def cancel_at_checkpoint(store: SlowCheckpointReplies, task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` once its step's checkpoint is applied and its reply not yet read."""
    await asyncio.wait_for(store.applied.wait(), 10)
    task.cancel()
    store.reply.set()


async def test_async_a_step_whose_checkpoint_reply_a_cancel_cuts_off_stays_finished(
    async_client: redis.asyncio.Redis, prefix: str
) -> None:
    """The step's function returned; its caller is cancelled while the checkpoint is on its way
    (sent again in a task of its own: it lands). The work is done, so the ``cancelled`` entry
    lists the step, as the record keeps it (before: no step listed, and the record held
    ``s:charge``)."""
    store = SlowCheckpointReplies(async_client, Policy(prefix=prefix, lease=10))
    record, run = guard_record(prefix, "order-1"), Counter()

    async def job() -> None:
        async with aguard(store, "order-1") as call:
            await call.step("charge", run, "charge")
            call.save("done")

    task = asyncio.ensure_future(job())
    try:
        await cancel_at_checkpoint(store, task)
        with pytest.raises(asyncio.CancelledError):
            await task
        (entry,) = await async_wait_until(store.uncertain, 10, "the cancelled entry")
        assert (entry.kind, entry.steps) == ("cancelled", ("charge",))
        assert await async_client.hget(record.key, "s:charge") is not None
        assert run.calls == ["charge"]
    finally:
        await store.aclose()


class Declined(Exception):
    pass


@pytest.mark.parametrize("outcome", ["result", "remembered failure"])
async def test_async_a_step_cut_off_at_its_checkpoint_is_not_run_again_in_the_same_call(
    async_client: redis.asyncio.Redis, prefix: str, outcome: str
) -> None:
    """A block that catches the CancelledError of a step cut off at its checkpoint and calls
    the step again gets its first outcome back (docs/steps.md: a name runs once per record).
    Before, the step function ran a second time."""
    store = SlowCheckpointReplies(async_client, Policy(prefix=prefix, lease=10))
    run = Counter()
    seen: list[Any] = []

    def charge(name: str) -> Any:
        result = run(name)
        if outcome == "remembered failure":  # a declined card: stored as the step's outcome
            raise Declined(name)
        return result

    async def job() -> None:
        async with aguard(store, "order-1") as call:
            for _ in range(2):  # the second call.step of the name comes after the cancel
                try:
                    seen.append(
                        await call.step("charge", charge, "charge", cache_exceptions=Declined)
                    )
                except (asyncio.CancelledError, Declined) as exc:
                    seen.append(type(exc))
            call.save("done")

    task = asyncio.ensure_future(job())
    try:
        await cancel_at_checkpoint(store, task)
        await task
        assert run.calls == ["charge"]
        again = {"step": "charge", "value": None} if outcome == "result" else Declined
        assert seen == [asyncio.CancelledError, again]
    finally:
        await store.aclose()


def test_a_resent_checkpoint_keeps_the_first_result(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    """checkpoint.lua sent twice (redis-py re-sends after a timeout; a retry after a lost
    reply): written once, and the second answer is the first result."""
    from idemkey._core import Claimed

    record = guard_record(prefix, "k")
    claim = store.claim(record, "fp", heartbeat=False)
    assert isinstance(claim, Claimed)
    assert store.checkpoint(record, claim.owner, "s:a", b"\x01first") == b"\x01first"
    assert store.checkpoint(record, claim.owner, "s:a", b"\x01second") == b"\x01first"
    assert sync_client.hget(record.key, "ns") == b"1"
    assert store.checkpoint(record, "someone else", "s:b", b"\x01x") is None
    assert sync_client.hget(record.key, "s:b") is None


def test_steps_run_unprotected_when_redis_fails_and_on_store_error_is_open() -> None:
    """on_store_error="open" runs the block without a claim: its steps run too, storing
    nothing (a retry runs them again), and step_key is still the record's."""
    from tests._servers import free_port, no_retry

    dead = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=no_retry())
    store = RedisStore(dead, Policy(on_store_error="open"))
    runs: list[str] = []
    try:
        with guard(store, "order-1") as call:
            assert call.step("reserve", Counter(), "reserve") == {"step": "reserve", "value": None}
            assert call.step("reserve", runs.append, "again") == {"step": "reserve", "value": None}
            assert call.step_key("charge").startswith("ik_")
            assert call.resumed_steps == ()
    finally:
        store.close()
        dead.close()
    assert runs == []  # a name still runs once per call


def test_a_step_after_the_block_exited_is_refused_even_if_none_ran_inside() -> None:
    # The step runner is built on first use: a block that ran no step leaves it unbuilt, and
    # the exit must still close it, or a late step would run outside the claim.
    from benchmarks.fakes import FakeClient, first_call_replies
    from idemkey.errors import UsageError

    store = RedisStore(FakeClient(first_call_replies()), Policy(prefix="late"))  # type: ignore[arg-type]
    try:
        with guard(store, "k") as call:
            call.save(1)
        with pytest.raises(UsageError, match="after the guard's block has exited"):
            call.step("late", lambda: 1)
    finally:
        store.close()


def test_reading_the_saved_result_leaves_the_call_current(store: RedisStore) -> None:
    """GuardState.saved() is a query; leaving the block is what ends the current call (on
    63d3937 reading it inside the block made current_call() raise)."""
    state = guard(store, "k")
    with state as call:
        call.save("done")
        assert state.saved() == state.saved() is not None
        assert current_call() is call
    with pytest.raises(LookupError):
        current_call()
    assert state.saved() is not None
