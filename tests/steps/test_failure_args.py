"""A remembered failure is raised again with the first one's ``args``, not only its message.

``CardDeclined("insufficient_funds", 51)``: the first caller gets ``args ==
("insufficient_funds", 51)``, and so does every retry (before, a retry got ``str(exc)`` as the
one arg, ``("('insufficient_funds', 51)",)``). Args are stored only when they are plain data
that comes back as it was (str, int, float, bool, None, bytes, lists and str-keyed dicts of
them); others, and records written before args were stored, give ``(message,)`` as before.
Stored args are data: they are set on an instance of a declared class, never passed to code.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import msgspec
import pytest
import redis

from idemkey import Policy, RedisStore, StoredFailureError, guard
from idemkey._core import record_for
from idemkey.guard import GUARD_METHOD


class CardDeclined(Exception):
    """Raised with its data as args, as many libraries' exceptions are."""


class PspDown(OSError):
    """An OSError: its str() comes from errno and strerror, which __init__ sets from args."""


DECLARED: dict[type[Exception], tuple[str, ...]] = {CardDeclined: (), PspDown: ()}


@pytest.fixture
def store(sync_client: redis.Redis, prefix: str) -> RedisStore:
    return RedisStore(sync_client, Policy(prefix=prefix))


def first_and_retry(store: RedisStore, error: Exception) -> tuple[BaseException, BaseException]:
    """The exception the first run raised, and the one its retry raises without running."""
    ran: list[int] = []
    raised: list[BaseException] = []
    for _ in range(2):
        try:
            with guard(store, "charge:1", cache_exceptions=DECLARED) as call:
                assert not call.replayed
                ran.append(1)
                raise error
        except (CardDeclined, PspDown) as exc:
            raised.append(exc)
    assert ran == [1]
    return raised[0], raised[1]


def stored_entry(sync_client: redis.Redis, prefix: str) -> list[Any]:
    stored = sync_client.hget(record_for(prefix, "", GUARD_METHOD, "", "charge:1").key, "resp")
    assert stored is not None
    assert stored[0] == 3
    entry: list[Any] = msgspec.msgpack.decode(stored[1:])
    return entry


@pytest.mark.parametrize(
    "args",
    [
        ("insufficient_funds", 51),
        (),
        ("declined", None, True, 2.5, b"\x00raw", ["a", 1], {"code": "51", "retry": False}),
    ],
)
def test_a_retry_raises_the_failure_with_the_first_ones_args(
    store: RedisStore, args: tuple[Any, ...]
) -> None:
    first, again = first_and_retry(store, CardDeclined(*args))
    assert first.args == args
    assert type(again) is CardDeclined
    assert again.args == args
    assert str(again) == str(first)


def test_a_step_raises_its_remembered_failure_with_its_args(store: RedisStore) -> None:
    ran: list[str] = []

    def charge() -> None:
        ran.append("charge")
        raise CardDeclined("expired_card", 9)

    for _ in range(2):
        with pytest.raises(CardDeclined) as again, guard(store, "s") as call:
            call.step("charge", charge, cache_exceptions=DECLARED)
        assert again.value.args == ("expired_card", 9)
    assert ran == ["charge"]  # the guard released; its retry resumed to the step's failure


def test_args_are_not_stored_when_they_are_the_message(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    # The record is then byte for byte what earlier versions wrote, and read.
    first, again = first_and_retry(store, CardDeclined("card declined"))
    assert again.args == first.args == ("card declined",)
    assert stored_entry(sync_client, prefix) == [f"{__name__}:CardDeclined", "card declined", {}]


@pytest.mark.parametrize(
    "args",
    [
        ("declined", Decimal("12.10")),  # msgspec stores a str: it would come back another type
        ("declined", ("nested", "tuple")),  # would come back a list
        ("declined", {1: "int key"}),
        ("declined", 2**70),  # past 64 bits: msgspec cannot encode it
        ("declined", object()),
    ],
    ids=["decimal", "tuple", "int-key", "bigint", "object"],
)
def test_args_that_would_not_come_back_as_they_were_give_the_message(
    store: RedisStore, sync_client: redis.Redis, prefix: str, args: tuple[Any, ...]
) -> None:
    first, again = first_and_retry(store, CardDeclined(*args))
    assert type(again) is CardDeclined
    assert again.args == (str(first),)  # as before args were stored: still remembered
    assert len(stored_entry(sync_client, prefix)) == 3


def test_args_that_would_change_its_message_give_the_message(store: RedisStore) -> None:
    # An OSError's str() is "[Errno 111] refused" only when __init__ (not called on a retry)
    # set errno; with the args alone it would be "(111, 'refused')". The message wins.
    first, again = first_and_retry(store, PspDown(111, "refused"))
    assert str(first) == "[Errno 111] refused"
    assert type(again) is PspDown
    assert str(again) == str(first)
    assert again.args == (str(first),)


def test_a_record_written_before_args_were_stored_reads_as_it_did(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    first_and_retry(store, CardDeclined("insufficient_funds", 51))
    key = record_for(prefix, "", GUARD_METHOD, "", "charge:1").key
    path = f"{__name__}:CardDeclined"
    older = b"\x03" + msgspec.msgpack.encode([path, "('insufficient_funds', 51)", {}])
    sync_client.hset(key, "resp", older)
    with pytest.raises(CardDeclined) as again, guard(store, "charge:1", cache_exceptions=DECLARED):
        pytest.fail("the block ran again")
    assert again.value.args == ("('insufficient_funds', 51)",)


@pytest.mark.parametrize("args", ["not an array", {"a": 1}, 5])
def test_stored_args_that_are_not_an_array_are_a_stored_failure_error(
    store: RedisStore, sync_client: redis.Redis, prefix: str, args: object
) -> None:
    first_and_retry(store, CardDeclined("insufficient_funds", 51))
    key = record_for(prefix, "", GUARD_METHOD, "", "charge:1").key
    forged = [f"{__name__}:CardDeclined", "declined", {}, args]
    sync_client.hset(key, "resp", b"\x03" + msgspec.msgpack.encode(forged))
    with (
        pytest.raises(StoredFailureError, match="does not decode"),
        guard(store, "charge:1", cache_exceptions=DECLARED),
    ):
        pytest.fail("the block ran again")


def test_stored_args_are_set_as_data_on_a_declared_class_only(
    store: RedisStore, sync_client: redis.Redis, prefix: str
) -> None:
    first_and_retry(store, CardDeclined("insufficient_funds", 51))
    key = record_for(prefix, "", GUARD_METHOD, "", "charge:1").key
    forged = ["subprocess:CalledProcessError", "x", {}, [1, ["rm", "-rf", "/"]]]
    sync_client.hset(key, "resp", b"\x03" + msgspec.msgpack.encode(forged))
    with (
        pytest.raises(StoredFailureError, match="not one of the classes declared here"),
        guard(store, "charge:1", cache_exceptions=DECLARED),
    ):
        pytest.fail("the block ran again")
