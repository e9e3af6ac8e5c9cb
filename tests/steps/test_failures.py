"""Remembered failures (``cache_exceptions=``) under guard, aguard, @idempotent and call.step,
on the real server and on fakeredis.

What a user relies on: a declared deterministic failure is raised again, same class, same
message, same declared fields, on every retry without the work running again; any other
exception still releases the key so a retry runs; the record holds data (MessagePack), never
a pickle; a class the retry does not declare (renamed, moved) comes back as a typed idemkey error
naming it, never a traceback from inside idemkey.
"""

from __future__ import annotations

import pickle
import types
from typing import Any

import msgspec
import pytest
import redis
import redis.asyncio

from idemkey import (
    AsyncRedisStore,
    ConfigurationError,
    Policy,
    RedisStore,
    StoredFailureError,
    aguard,
    guard,
    idempotent,
)
from idemkey._core import record_for
from idemkey.guard import GUARD_METHOD


class CardDeclined(Exception):
    """What a PSP raises for a card that will be declined every time."""

    def __init__(self, code: str, amount: int) -> None:
        super().__init__(f"card declined: {code}")
        self.code = code
        self.amount = amount
        self.secret = object()  # not declared: never stored


class Transient(Exception):
    pass


DECLARED = {CardDeclined: ("code", "amount")}


@pytest.fixture
def store(sync_client: redis.Redis, prefix: str) -> RedisStore:
    return RedisStore(sync_client, Policy(prefix=prefix))


def charge_once(store: RedisStore, ran: list[str], error: Exception | None) -> Any:
    with guard(store, "charge:1", payload="c1", cache_exceptions=DECLARED) as call:
        if call.replayed:
            return call.result
        ran.append("charge")
        if error is not None:
            raise error
        call.save("charged")
        return call.result


def test_a_declared_failure_is_raised_again_without_running(store: RedisStore) -> None:
    ran: list[str] = []
    with pytest.raises(CardDeclined) as first:
        charge_once(store, ran, CardDeclined("insufficient_funds", 500))
    for _ in range(2):
        with pytest.raises(CardDeclined) as again:
            charge_once(store, ran, None)  # would succeed, were it run
        assert str(again.value) == str(first.value) == "card declined: insufficient_funds"
        assert (again.value.code, again.value.amount) == ("insufficient_funds", 500)
        assert not hasattr(again.value, "secret")
    assert ran == ["charge"]


def test_another_exception_releases_the_key_and_the_retry_runs(store: RedisStore) -> None:
    ran: list[str] = []
    with pytest.raises(Transient):
        charge_once(store, ran, Transient("timeout talking to the PSP"))
    assert charge_once(store, ran, None) == "charged"
    assert charge_once(store, ran, None) == "charged"
    assert ran == ["charge", "charge"]


def test_the_record_holds_data_never_a_pickle(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    with pytest.raises(CardDeclined):
        charge_once(store, [], CardDeclined("stolen", 7))
    record = record_for(prefix, "", GUARD_METHOD, "", "charge:1")
    stored = sync_client.hget(record.key, "resp")
    assert stored is not None
    assert stored[0] == 3
    assert msgspec.msgpack.decode(stored[1:]) == [
        f"{__name__}:CardDeclined",
        "card declined: stolen",
        {"code": "stolen", "amount": 7},
    ]
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads(stored)


def test_a_class_renamed_since_is_a_typed_error(store: RedisStore) -> None:
    module = types.ModuleType("idemkey_test_gone")
    exec("class Declined(Exception):\n    pass\n", module.__dict__)
    declined = module.Declined
    with pytest.raises(declined), guard(store, "k", cache_exceptions=(declined,)):
        raise declined("no")
    # The next release moved it: the stored module:qualname is not one the guard declares.
    renamed = types.ModuleType("idemkey_test_new")
    exec("class Declined(Exception):\n    pass\n", renamed.__dict__)
    with (
        pytest.raises(StoredFailureError) as gone,
        guard(store, "k", cache_exceptions=(renamed.Declined,)),
    ):
        pytest.fail("the block ran again")
    assert gone.value.type_path == "idemkey_test_gone:Declined"
    assert gone.value.stored_message == "no"
    assert "idemkey_test_gone:Declined" in str(gone.value)
    assert "idemkey_test_new:Declined" in gone.value.reason


def test_a_saved_result_wins_over_a_later_declared_exception(store: RedisStore) -> None:
    with pytest.raises(CardDeclined), guard(store, "k", cache_exceptions=DECLARED) as call:  # noqa: PT012
        call.save("done")
        raise CardDeclined("late", 1)
    with guard(store, "k", cache_exceptions=DECLARED) as call:
        assert call.replayed
        assert call.result == "done"


@pytest.mark.parametrize(
    "bad",
    [
        (ValueError, 3),
        {KeyboardInterrupt: ()},
        {ValueError: "code"},
        (ConfigurationError,),
        "ValueError",
    ],
)
def test_a_bad_declaration_is_a_configuration_error(store: RedisStore, bad: object) -> None:
    with pytest.raises(ConfigurationError):
        guard(store, "k", cache_exceptions=bad)


def test_a_class_defined_in_a_function_is_refused(store: RedisStore) -> None:
    class Local(Exception):
        pass

    with pytest.raises(ConfigurationError, match="module level"):
        guard(store, "k", cache_exceptions=(Local,))


def test_idempotent_replays_a_declared_failure(store: RedisStore) -> None:
    ran: list[int] = []

    @idempotent(store, key=lambda order: f"o:{order}", cache_exceptions=DECLARED, name="charge")
    def charge(order: int) -> str:
        ran.append(order)
        if order == 1:
            raise CardDeclined("do_not_honor", order)
        if len(ran) < 3:
            raise Transient("flaky")
        return "ok"

    for _ in range(3):
        with pytest.raises(CardDeclined, match="do_not_honor"):
            charge(1)
    with pytest.raises(Transient):
        charge(2)
    assert charge(2) == "ok"
    assert ran == [1, 2, 2]


def test_a_step_remembers_its_failure_across_releases(store: RedisStore) -> None:
    ran: list[str] = []

    def charge() -> None:
        ran.append("charge")
        raise CardDeclined("expired_card", 9)

    for _ in range(3):
        with pytest.raises(CardDeclined, match="expired_card"), guard(store, "s") as call:  # noqa: PT012
            call.step("reserve", ran.append, "reserve")
            call.step("charge", charge, cache_exceptions=DECLARED)
            pytest.fail("the block went on past a failed step")
    # The guard itself does not remember it: each retry resumes, and the step raises again.
    assert ran == ["reserve", "charge"]


def declined_after(store: RedisStore, key: str, steps: tuple[str, ...] = ()) -> None:
    """The steps ``steps``, then a charge whose step remembers the card declined; the guard
    declares another failure, so the record is released."""

    def charge() -> None:
        raise CardDeclined("expired_card", 9)

    with guard(store, key, cache_exceptions=(Transient,)) as call:
        for name in steps:
            call.step(name, lambda: 1)
        call.step("charge", charge, cache_exceptions=DECLARED)


def test_a_remembered_step_failure_is_no_finished_step_to_reconcile(store: RedisStore) -> None:
    """A declined card remembered by its step did no work: releasing the record after it is
    no uncertain outcome (2ba1d64 kept a ``released_with_steps`` entry on every retry), and a
    real step before it is still listed, alone."""
    for key, steps in (("declined", ()), ("reserved", ("reserve",))):
        for _ in range(3):
            with pytest.raises(CardDeclined):
                declined_after(store, key, steps)
    store._keeper.drain(10)
    kept = store.uncertain()
    assert [(entry.kind, entry.steps) for entry in kept] == [
        ("released_with_steps", ("reserve",))
    ] * 3
    assert {entry.digest for entry in kept} == {
        record_for(store.policy.prefix, "", GUARD_METHOD, "", "reserved").digest
    }


async def test_aguard_replays_a_declared_failure(
    async_client: redis.asyncio.Redis, prefix: str
) -> None:
    store = AsyncRedisStore(async_client, Policy(prefix=prefix))
    ran: list[str] = []

    async def charge() -> None:
        ran.append("charge")
        raise CardDeclined("lost_card", 3)

    for _ in range(2):
        with pytest.raises(CardDeclined, match="lost_card"):
            async with aguard(store, "a", cache_exceptions=DECLARED) as call:
                await call.step("charge", charge, cache_exceptions=DECLARED)
    with pytest.raises(CardDeclined) as again:
        async with aguard(store, "a", cache_exceptions=DECLARED):
            pytest.fail("the block ran again")
    assert again.value.code == "lost_card"
    assert ran == ["charge"]


def test_inspect_shows_a_remembered_failure(
    real_client: redis.Redis, redis_url: str, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from idemkey.cli import main

    store = RedisStore(real_client, Policy(prefix=prefix))
    with pytest.raises(CardDeclined):
        charge_once(store, [], CardDeclined("stolen", 7))
    argv = ["inspect", "charge:1", "--guard", "--redis-url", redis_url, "--prefix", prefix]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "a remembered failure (cache_exceptions)" in out
    assert f"{__name__}:CardDeclined: card declined: stolen" in out
    store.close()


async def test_an_async_idempotent_function_replays_a_declared_failure(
    async_client: redis.asyncio.Redis, prefix: str
) -> None:
    store = AsyncRedisStore(async_client, Policy(prefix=prefix))
    ran: list[int] = []

    @idempotent(store, key=lambda order: f"o:{order}", cache_exceptions=DECLARED, name="charge")
    async def charge(order: int) -> str:
        ran.append(order)
        raise CardDeclined("pickup_card", order)

    for _ in range(2):
        with pytest.raises(CardDeclined) as declined:
            await charge(4)
        assert (str(declined.value), declined.value.amount) == ("card declined: pickup_card", 4)
    assert ran == [4]
