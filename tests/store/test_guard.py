"""guard() / aguard() / idempotent(): docs/design.md#guards, for both stores, on both backends."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import fakeredis
import msgspec
import pytest
import redis
from redis.crc import key_slot

from idemkey import (
    AsyncRedisStore,
    ConfigurationError,
    Event,
    InvalidKeyError,
    KeyReuseError,
    LeaseLostError,
    NoResultError,
    Outcome,
    Policy,
    RedisStore,
    RequestInFlightError,
    StoreError,
    UsageError,
    guard,
    idempotent,
)
from idemkey.records import Claimed, encode_value, payload_fingerprint
from tests._servers import async_wait_until, free_port, no_retry
from tests.store._both import (
    AsyncStore,
    BatchedAsyncStore,
    Both,
    GlideAsyncStore,
    PlainAsyncStore,
    PlainSyncStore,
    SyncStore,
    ValkeyPyAsyncStore,
    ValkeyPySyncStore,
)


class Receipt(msgspec.Struct):
    charge_id: str
    amount: int


@dataclasses.dataclass
class DataReceipt:
    charge_id: str
    amount: int


class Boom(Exception):
    pass


async def fail_inside(store: Both, key: str, *, save: object = None, **kwargs: Any) -> None:
    """Enter the guard, ``save()`` when given a value, then raise Boom(fence) in the block."""
    async with store.guard(key, **kwargs) as call:
        if save is not None:
            call.save(save)
        raise Boom(call.fence)


def policy(store: Both, **changes: Any) -> Policy:
    return store.store.policy.replace(**changes)


class GuardBehaviour:
    async def test_the_first_call_runs_and_a_repeat_replays(self, store: Both) -> None:
        async with store.guard("charge:1", payload=b"inv") as call:
            assert not call.replayed
            assert call.fence is not None
            assert abs(call.fence / 1e6 - await store.server_time()) < 60  # clock µs
            assert call.takeover is False
            call.save({"charge": "ch_1", "amount": 4200})
        async with store.guard("charge:1", payload=b"inv") as again:
            assert again.replayed
            assert again.result == {"charge": "ch_1", "amount": 4200}
            with pytest.raises(RuntimeError, match="replayed"):
                again.save("other")

    async def test_save_after_the_block_is_refused_and_changes_nothing(self, store: Both) -> None:
        """The record was settled as the block exited (released, completed): a later value
        would be lost. Before, save() took it silently and call.result reported it."""
        async with store.guard("released") as released:
            pass
        async with store.guard("completed") as completed:
            completed.save("first")
        for call in (released, completed):
            with pytest.raises(UsageError, match=r"call\.save\(\) after the guard's block has"):
                call.save("late")
        with pytest.raises(NoResultError):
            _ = released.result
        assert completed.result == "first"
        async with store.guard("released") as again:
            assert not again.replayed  # released: nothing was stored for it
        async with store.guard("completed") as again:
            assert again.result == "first"

    async def test_an_exception_releases_and_a_retry_runs_again(self, store: Both) -> None:
        with pytest.raises(Boom) as boom:
            await fail_inside(store, "charge:1")
        assert await store.lock_holder(store.guard_record("charge:1")) is None
        async with store.guard("charge:1") as retry:
            assert not retry.replayed
            assert retry.fence > boom.value.args[0]  # release keeps the fence growing
            retry.save("done")

    async def test_leaving_without_save_releases(self, store: Both) -> None:
        async with store.guard("charge:1") as call:
            assert not call.replayed
        async with store.guard("charge:1", payload=b"other payload is fine now") as retry:
            assert not retry.replayed
            assert retry.fence > call.fence

    async def test_save_then_an_exception_completes_and_reraises(self, store: Both) -> None:
        with pytest.raises(Boom):  # the work is done: it must not run twice
            await fail_inside(store, "charge:1", save="charged")
        async with store.guard("charge:1") as again:
            assert again.replayed
            assert again.result == "charged"

    async def test_another_payload_is_key_reuse_and_the_record_is_untouched(
        self, store: Both
    ) -> None:
        async with store.guard("charge:1", payload={"amount": 10}) as call:
            call.save("charged 10")
        record = store.guard_record("charge:1")
        before = await store.snapshot(record)
        with pytest.raises(KeyReuseError):
            async with store.guard("charge:1", payload={"amount": 20}):
                pytest.fail("the body must not run")
        assert await store.snapshot(record) == before
        async with store.guard("charge:1", payload={"amount": 10}) as again:
            assert again.result == "charged 10"

    async def test_a_call_in_flight_raises_with_retry_after(self, store: Both) -> None:
        async with store.guard("charge:1", policy=policy(store, lease=10)):
            with pytest.raises(RequestInFlightError) as exc:
                async with store.guard("charge:1"):
                    pytest.fail("the body must not run")
            assert 0 < exc.value.retry_after <= 10
        async with store.guard("charge:1") as after:  # released by the first: runs again
            assert not after.replayed

    async def test_a_waiting_duplicate_gets_the_replay(self, store: Both) -> None:
        async def duplicate() -> tuple[bool, object]:
            async with store.guard("charge:1", policy=policy(store, wait=10)) as call:
                return call.replayed, call.result

        async def duplicate_waits() -> bool:
            # A waiter marks the record (claim.lua) when it finds the first call in flight.
            return b"w" in await store.hash(store.guard_record("charge:1"))

        async with store.guard("charge:1") as first:
            waiting = store.background(duplicate)
            await async_wait_until(duplicate_waits, timeout=10, message="the duplicate to wait")
            first.save("charged")
        assert await waiting == (True, "charged")

    async def test_result_type_decodes_structs_and_dataclasses(self, store: Both) -> None:
        for key, value, kind in [
            ("struct", Receipt("ch_1", 4200), Receipt),
            ("dataclass", DataReceipt("ch_2", 100), DataReceipt),
        ]:
            async with store.guard(key, result_type=kind) as call:
                call.save(value)
                assert call.result == value
            async with store.guard(key, result_type=kind) as again:
                assert again.replayed
                assert again.result == value
                assert type(again.result) is kind

    async def test_scope_separates_tenants(self, store: Both) -> None:
        async with store.guard("charge:1", scope="tenant-a") as call:
            call.save("a")
        async with store.guard("charge:1", scope="tenant-b", payload=b"x") as other:
            assert not other.replayed
            other.save("b")
        async with store.guard("charge:1", scope="tenant-a") as again:
            assert again.result == "a"

    async def test_the_empty_key_is_refused(self, store: Both) -> None:
        with pytest.raises(InvalidKeyError):
            async with store.guard(""):
                pytest.fail("the body must not run")
        assert await store.keys() == []

    @pytest.mark.parametrize("key", ["}x", "{a}", "k" * 255, "caf\u00e9 \u2603", "{}:lock"])
    async def test_hostile_keys_stay_out_of_redis_key_names(self, store: Both, key: str) -> None:
        async with store.guard(key) as call:
            record = store.guard_record(key)
            assert await store.keys() == [record.key.encode()]  # the lease is a field of it
            call.save("ok")
        (name,) = await store.keys()
        assert name == f"{store.prefix}:{{{record.digest}}}".encode()
        # Its hints (the done stream, the tombstone) share the slot: one hash tag.
        assert key_slot(record.key.encode()) == key_slot(f"{record.key}:done".encode())
        assert key.encode() not in name.removeprefix(f"{store.prefix}:".encode())

    async def test_ttls_follow_the_policy(self, store: Both) -> None:
        limits = policy(store, lease=20, ttl=3_600)
        record = store.guard_record("charge:1")
        async with store.guard("charge:1", policy=limits) as call:
            assert 10_000 < await store.lease_left(record) <= 20_000
            assert 1_800_000 < await store.pttl(record.key) <= 3_600_000
            call.save("ok")
        assert 1_800_000 < await store.pttl(record.key) <= 3_600_000
        assert await store.lease_left(record) == -2

    async def test_a_takeover_gets_a_bumped_fence(self, store: Both) -> None:
        record = store.guard_record("charge:1")
        crashed = await store.claim(record, payload_fingerprint(b""), heartbeat=False)
        assert isinstance(crashed, Claimed)
        await store.expire_lock(record)
        async with store.guard("charge:1") as call:
            assert call.takeover is True
            assert call.fence > crashed.fence
            call.save("ok")
        assert await store.complete(record, crashed.owner, b"late") is False
        async with store.guard("charge:1") as again:
            assert again.result == "ok"

    async def test_a_guard_that_lost_its_lease_raises_and_stores_nothing(self, store: Both) -> None:
        events: list[Event] = []
        watched = policy(store, on_event=events.append)
        record = store.guard_record("job")

        fences: list[int | None] = []

        async def work_while_taken_over() -> None:
            async with store.guard("job", policy=watched) as call:
                fences.append(call.fence)
                # Our lease lapses (a long GC pause, say) and another executor takes over.
                await store.expire_lock(record)
                other = await store.claim(record, payload_fingerprint(b""), heartbeat=False)
                assert isinstance(other, Claimed)
                assert other.fence > fences[0]
                await store.complete(record, other.owner, encode_value("theirs"))
                call.save("mine")

        with pytest.raises(LeaseLostError) as exc:
            await work_while_taken_over()
        assert exc.value.fence == fences[0]
        assert [event.kind for event in events] == ["claimed", "lease_lost"]
        async with store.guard("job") as again:
            assert again.result == "theirs"

    async def test_events_name_the_record_by_digest_only(self, store: Both) -> None:
        events: list[Event] = []
        watched = policy(store, on_event=events.append)
        key = "secret-key-material"
        record = store.guard_record(key)

        async with store.guard(key, payload=b"1", policy=watched) as call:  # claimed
            with pytest.raises(RequestInFlightError):  # in_flight
                async with store.guard(key, payload=b"1", policy=watched):
                    pass
            with pytest.raises(KeyReuseError):  # mismatch
                async with store.guard(key, payload=b"2", policy=watched):
                    pass
        # released
        with pytest.raises(Boom):
            async with store.guard(key, payload=b"1", policy=watched):  # claimed
                raise Boom  # released
        await store.claim(record, payload_fingerprint(b"1"), heartbeat=False)
        await store.expire_lock(record)
        async with store.guard(key, payload=b"1", policy=watched) as call:  # takeover
            call.save("done")  # completed
        async with store.guard(key, payload=b"1", policy=watched):  # replayed
            pass

        kinds = [event.kind for event in events]
        assert kinds == [
            "claimed",
            "in_flight",
            "mismatch",
            "released",
            "claimed",
            "released",
            "takeover",
            "completed",
            "replayed",
        ]
        assert {event.record for event in events} == {record.digest}
        # Each claim above the one before (the key's third claim is the raw one above, the
        # takeover's fence above it too), and the completion with its claim's fence.
        fences = [e.fence for e in events if e.kind in ("claimed", "takeover", "completed")]
        assert fences == [*sorted(set(fences[:3])), fences[2]]
        for event in events:
            assert key not in repr(event)
            assert event.method == "GUARD"

    async def test_a_failing_event_hook_does_not_fail_the_call(self, store: Both) -> None:
        def hook(event: Event) -> None:
            raise RuntimeError("observer bug")

        async with store.guard("charge:1", policy=policy(store, on_event=hook)) as call:
            call.save("ok")
        async with store.guard("charge:1") as again:
            assert again.result == "ok"

    async def test_idempotent_returns_the_stored_result_on_repeat(self, store: Both) -> None:
        runs: list[int] = []

        def charge(invoice: int, amount: int) -> dict[str, int]:
            runs.append(invoice)
            return {"invoice": invoice, "amount": amount}

        run = store.idempotent(charge, key=lambda invoice, amount: f"charge:{invoice}", name="c")
        assert await run(1, 100) == {"invoice": 1, "amount": 100}
        assert await run(1, 100) == {"invoice": 1, "amount": 100}
        assert await run(2, 100) == {"invoice": 2, "amount": 100}
        assert runs == [1, 2]
        with pytest.raises(KeyReuseError):
            await run(1, 999)  # same key, other arguments
        assert runs == [1, 2]

    async def test_idempotent_with_outcome_says_whether_it_was_a_replay(self, store: Both) -> None:
        runs: list[int] = []

        def charge(invoice: int) -> dict[str, int]:
            runs.append(invoice)
            return {"invoice": invoice}

        run = store.idempotent(charge, key=lambda invoice: f"o:{invoice}", outcome=True, name="c")
        assert await run(1) == Outcome({"invoice": 1}, replayed=False)
        assert await run(1) == Outcome({"invoice": 1}, replayed=True)
        assert runs == [1]

    async def test_idempotent_binds_arguments_to_the_signature(self, store: Both) -> None:
        runs: list[int] = []

        def charge(invoice: int, amount: int, currency: str = "eur") -> int:
            runs.append(invoice)
            return amount

        run = store.idempotent(charge, key=lambda invoice, *a, **k: f"charge:{invoice}", name="c")
        assert await run(1, 100) == 100
        # The same call spelt differently: keyword arguments, the default made explicit.
        assert await run(1, amount=100) == 100
        assert await run(invoice=1, amount=100, currency="eur") == 100
        assert runs == [1]
        with pytest.raises(KeyReuseError):
            await run(1, 100, "usd")

    async def test_bytes_like_payloads_are_the_same_payload(self, store: Both) -> None:
        async with store.guard("blob", payload=b"abc") as call:
            call.save(1)
        for same in (bytearray(b"abc"), memoryview(b"abc")):
            async with store.guard("blob", payload=same) as call:
                assert call.replayed

    async def test_events_carry_the_redis_time_of_their_call(self, store: Both) -> None:
        events: list[Event] = []
        watched = policy(store, on_event=events.append)
        async with store.guard("timed", policy=watched) as call:
            call.save(1)
        async with store.guard("timed", policy=watched):
            pass
        assert [e.kind for e in events] == ["claimed", "completed", "replayed"]
        for event in events:
            assert event.redis_seconds is not None
            assert 0 < event.redis_seconds < 10

    async def test_idempotent_with_a_payload_and_result_type(self, store: Both) -> None:
        runs: list[str] = []

        def charge(invoice_id: str, note: str) -> Receipt:
            runs.append(invoice_id)
            return Receipt(invoice_id, 4200)

        run = store.idempotent(
            charge,
            key=lambda invoice_id, note: invoice_id,
            payload=lambda invoice_id, note: invoice_id,  # the note does not identify the work
            result_type=Receipt,
            name="charge",
        )
        assert await run("inv_1", note="first") == Receipt("inv_1", 4200)
        assert await run("inv_1", note="retry") == Receipt("inv_1", 4200)
        assert runs == ["inv_1"]

    async def test_idempotent_releases_when_the_function_raises(self, store: Both) -> None:
        attempts: list[int] = []

        def flaky(n: int) -> str:
            attempts.append(n)
            if len(attempts) == 1:
                raise Boom
            return "ok"

        run = store.idempotent(flaky, key=lambda n: f"job:{n}", name="flaky")
        with pytest.raises(Boom):
            await run(1)
        assert await run(1) == "ok"
        assert await run(1) == "ok"
        assert attempts == [1, 1]


class TestGuard(SyncStore, GuardBehaviour):
    pass


class TestAsyncGuard(AsyncStore, GuardBehaviour):
    pass


def test_idempotent_refuses_a_store_of_the_wrong_kind() -> None:
    client, aclient = fakeredis.FakeRedis(), fakeredis.FakeAsyncRedis()
    store, astore = RedisStore(client), AsyncRedisStore(aclient)

    async def async_job() -> None: ...

    def sync_job() -> None: ...

    with pytest.raises(ConfigurationError, match="AsyncRedisStore"):
        idempotent(store, key=lambda: "k", name="job")(async_job)
    with pytest.raises(ConfigurationError, match="RedisStore"):
        idempotent(astore, key=lambda: "k", name="job")(sync_job)


def send_mails(user: str) -> Iterator[str]:
    yield f"mail to {user}"


async def asend_mails(user: str) -> AsyncIterator[str]:
    yield f"mail to {user}"


@pytest.mark.parametrize(
    ("kind", "func"), [("generator", send_mails), ("async generator", asend_mails)]
)
def test_idempotent_refuses_a_generator_function(kind: str, func: Callable[..., Any]) -> None:
    """Calling one only makes a generator: its body runs later, as it is iterated, outside the
    guard. Before, the generator object was saved as the result, could not be encoded, and
    the key was completed as "result not kept" although the body never ran."""
    client = fakeredis.FakeRedis()
    for store in (RedisStore(client), AsyncRedisStore(fakeredis.FakeAsyncRedis())):
        with pytest.raises(ConfigurationError, match=f"cannot guard an? {kind} function"):
            idempotent(store, key=lambda user: user)(func)
    assert client.keys() == []


@pytest.mark.parametrize("result_type", [5, "int", object()])
def test_a_result_type_no_result_decodes_as_is_refused_before_the_work_runs(
    result_type: Any,
) -> None:
    """Checked at the first replay only, the work ran and was stored, then every retry
    raised; now refused before the claim, both guards alike."""
    client = fakeredis.FakeRedis()
    ran: list[int] = []
    with (
        pytest.raises(ConfigurationError, match="result_type="),
        guard(RedisStore(client), "k", result_type=result_type),
    ):
        ran.append(1)  # pragma: no cover
    assert ran == []
    assert client.keys() == []


def test_call_result_before_save_is_an_attribute_error() -> None:
    with guard(RedisStore(fakeredis.FakeRedis()), "k") as call:
        with pytest.raises(AttributeError, match="nothing was saved"):
            _ = call.result
        call.save([1, 2])
        assert call.result == [1, 2]


def test_a_failed_claim_is_reported_as_store_error() -> None:
    events: list[Event] = []
    dead = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=no_retry())
    store = RedisStore(dead, Policy(on_event=events.append))
    try:
        with pytest.raises(StoreError), guard(store, "charge:1"):
            pytest.fail("the block ran without a claim")
    finally:
        store.close()
        dead.close()
    assert [event.kind for event in events] == ["store_error"]
    assert "charge:1" not in repr(events)


# The same contract through valkey-py (the redis-py fork), on the real server only.
class TestValkeyPyGuard(ValkeyPySyncStore, GuardBehaviour):
    pass


class TestValkeyPyAsyncGuard(ValkeyPyAsyncStore, GuardBehaviour):
    pass


class TestPlainPathGuard(PlainSyncStore, GuardBehaviour):
    """The same contract on the plain path (execute_command), see test_lean.py."""


class TestPlainPathAsyncGuard(PlainAsyncStore, GuardBehaviour):
    pass


# The same contract through valkey-glide (AsyncRedisStore's facade, idemkey/store/_glide.py).
class TestGlideAsyncGuard(GlideAsyncStore, GuardBehaviour):
    pass


class TestBatchedAsyncGuard(BatchedAsyncStore, GuardBehaviour):
    pass
