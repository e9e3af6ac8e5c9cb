"""Cancel (``store.cancel``, ``idemkey cancel``): an operator gives up a record's run on purpose.

What a user relies on: the cancelled owner can no longer checkpoint, renew or complete (its
guard raises LeaseLostError, nothing of it is stored); the fence grows; kept steps are resumed
by the next executor, abandoned ones run again and the key is free of its payload; a record
with nothing to cancel is left as it was; the command line says what it did and refuses a
completed record.
"""

from __future__ import annotations

import json

import pytest
import redis
import redis.asyncio

from idemkey import (
    AsyncRedisStore,
    KeyReuseError,
    LeaseLostError,
    Policy,
    RedisStore,
    aguard,
    guard,
)
from idemkey._core import Record, record_for
from idemkey.cli import main
from idemkey.guard import GUARD_METHOD
from idemkey.store import Cancelled
from tests._lease import lease_left


class Boom(Exception):
    pass


def guard_record(prefix: str, key: str) -> Record:
    return record_for(prefix, "", GUARD_METHOD, "", key)


@pytest.fixture
def store(sync_client: redis.Redis, prefix: str) -> RedisStore:
    return RedisStore(sync_client, Policy(prefix=prefix, lease=30))


def test_a_cancelled_owner_cannot_checkpoint_or_complete_and_the_next_run_resumes(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    record = guard_record(prefix, "job")
    ran: list[str] = []
    with pytest.raises(LeaseLostError) as lost, guard(store, "job", payload="p") as stale:  # noqa: PT012
        stale.step("reserve", ran.append, "reserve")
        cancelled = store.cancel(record)  # the operator raises the fence
        assert cancelled == Cancelled("in_progress", (stale.fence or 0) + 1)
        stale.step("charge", ran.append, "charge")  # runs, but its checkpoint is refused
    assert lost.value.fence == stale.fence
    assert sync_client.hget(record.key, "s:charge") is None
    assert lease_left(sync_client, record) == -2  # the cancel ended the claim's lease...
    assert not sync_client.hexists(record.key, "lease")  # ...and removed it from the record

    with guard(store, "job", payload="p") as call:
        assert not call.takeover
        assert cancelled is not None
        assert call.fence > cancelled.fence  # the stale owner's fence is refused downstream
        assert call.resumed_steps == ("reserve",)
        call.step("reserve", ran.append, "again")  # finished: returned, not run
        call.step("charge", ran.append, "charge")
        call.save("done")
    assert ran == ["reserve", "charge", "charge"]


def test_a_stale_owner_that_saved_cannot_complete_after_a_cancel(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    record = guard_record(prefix, "job")
    with pytest.raises(LeaseLostError), guard(store, "job") as stale:  # noqa: PT012
        stale.save("late result")
        store.cancel(record)
    assert sync_client.hget(record.key, "resp") is None
    with guard(store, "job") as call:
        assert not call.replayed


def test_abandon_drops_the_steps_and_frees_the_key_from_its_payload(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    record = guard_record(prefix, "job")
    ran: list[str] = []
    with pytest.raises(Boom), guard(store, "job", payload="A") as call:  # noqa: PT012
        call.step("reserve", ran.append, "A")
        raise Boom  # released, with a finished step: bound to payload A
    with pytest.raises(KeyReuseError), guard(store, "job", payload="B"):
        pass
    assert store.cancel(record, abandon=True) == Cancelled("released", (call.fence or 0) + 1)
    fields = sync_client.hgetall(record.key)
    # The fence (and the first one, f0), the releasing owner (ro), and the claim's origin
    # ("i": when and where from) that store.records() shows.
    assert sorted(fields) == [b"f0", b"fence", b"i", b"ro"]
    with guard(store, "job", payload="B") as call:
        assert call.resumed_steps == ()
        call.step("reserve", ran.append, "B")
        call.save(None)
    assert ran == ["A", "B"]


def test_nothing_to_cancel_changes_nothing(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    record = guard_record(prefix, "job")
    assert store.cancel(record) is None  # no record
    with pytest.raises(Boom), guard(store, "job") as released:
        raise Boom  # released without steps
    before = sync_client.hgetall(record.key)
    assert store.cancel(record) is None
    with guard(store, "job") as call:
        call.save(1)
    done = sync_client.hgetall(record.key)
    assert store.cancel(record, abandon=True) is None  # complete: untouched
    assert sync_client.hgetall(record.key) == done
    assert before.keys() == {b"fence", b"f0", b"i", b"ro"}
    assert before[b"fence"] == str(released.fence).encode()


def test_a_cancel_drops_the_attempt_counts(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    from idemkey import StepRetry

    record = guard_record(prefix, "job")
    with pytest.raises(LeaseLostError), guard(store, "job") as call:  # noqa: PT012
        with pytest.raises(Boom):
            call.step("charge", _boom, retry=StepRetry(attempts=2, backoff=0))
        assert sync_client.hget(record.key, "a:charge") == b"2"
        store.cancel(record)
        assert sync_client.hget(record.key, "a:charge") is None
        call.save(1)


def _boom() -> None:
    raise Boom


async def test_an_async_owner_cancelled_gets_lease_lost(
    async_client: redis.asyncio.Redis, prefix: str
) -> None:
    store = AsyncRedisStore(async_client, Policy(prefix=prefix))
    record = guard_record(prefix, "job")
    with pytest.raises(LeaseLostError):  # noqa: PT012
        async with aguard(store, "job") as call:
            await call.step("one", lambda: 1)
            assert await store.cancel(record) == Cancelled("in_progress", (call.fence or 0) + 1)
            await call.step("two", lambda: 2)


def test_the_command_cancels_and_the_next_run_resumes(
    real_client: redis.Redis, redis_url: str, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix, lease=30))
    record = guard_record(prefix, "order-7")
    at = ["--redis-url", redis_url, "--prefix", prefix]
    try:
        with pytest.raises(LeaseLostError), guard(store, "order-7") as stale:  # noqa: PT012
            stale.step("reserve", lambda: "held")
            assert main(["cancel", "order-7", "--guard", "--yes", *at]) == 0
            out = capsys.readouterr().out
            fence = (stale.fence or 0) + 1
            assert f"cancelled in_progress record {record.key} (fence now {fence};" in out
            stale.save("never stored")
        with guard(store, "order-7") as call:
            assert call.resumed_steps == ("reserve",)
            call.save("done")
        # Complete: refused, with the reason, and nothing changed.
        assert main(["cancel", "order-7", "--guard", "--yes", "--json", *at]) == 1
        error = json.loads(capsys.readouterr().err)
        assert "complete: nothing to cancel" in error["error"]
        assert real_client.hget(record.key, "resp") is not None
    finally:
        store.close()


def test_the_command_abandons_with_json(
    real_client: redis.Redis, redis_url: str, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix, lease=30))
    record = guard_record(prefix, "order-8")
    at = ["--redis-url", redis_url, "--prefix", prefix]
    try:
        with pytest.raises(Boom), guard(store, "order-8") as call:  # noqa: PT012
            call.step("reserve", lambda: "held")
            raise Boom
        assert call.fence is not None
        argv = ["cancel", "--digest", record.digest, "--abandon", "--yes", "--json", *at]
        assert main(argv) == 0
        assert json.loads(capsys.readouterr().out) == {
            "record": record.key,
            "was": "released",
            "steps": "dropped",
            "fence": call.fence + 1,
        }
        assert main(argv) == 1  # a second time: nothing left to cancel
        assert "nothing to cancel" in json.loads(capsys.readouterr().err)["error"]
    finally:
        store.close()


def test_the_command_refuses_a_fence_that_is_no_integer_and_changes_nothing(
    real_client: redis.Redis, redis_url: str, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stored bytes are input: cancel.lua checks the fence before its first write. Before, it
    removed the live claim's owner and lease, then failed on HINCRBY: the command said Redis
    failed, and the owner's completion was refused."""
    store = RedisStore(real_client, Policy(prefix=prefix, lease=30))
    record = guard_record(prefix, "job-9")
    at = ["--redis-url", redis_url, "--prefix", prefix]
    try:
        with guard(store, "job-9") as call:
            real_client.hset(record.key, "fence", "not-a-number")
            before = real_client.hgetall(record.key)
            assert main(["cancel", "job-9", "--guard", "--yes", *at]) == 3
            assert real_client.hgetall(record.key) == before  # still the owner's live claim
            err = capsys.readouterr().err
            assert err.startswith("idemkey cancel: StoreError: ")
            assert "fence is not an integer" in err
            assert "nothing cancelled, the record is unchanged" in err
            call.save("done")  # its owner completes it
        assert real_client.hget(record.key, "resp") is not None
    finally:
        store.close()
