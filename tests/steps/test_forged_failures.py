"""Stored data chooses no code: remembered failures forged in Redis by someone who can write
one record field (a shared Redis, a compromised neighbour, a restored backup).

Each test makes a real record through idemkey on the session's real redis-server, then
rewrites one field with raw redis-py (HSET of a hand-built MessagePack failure, as an attacker
writes it), and retries. What a user relies on: a stored failure comes back only as a class
the guard (step, task) declared, matched by its exact ``module:qualname``, with only the
fields declared for it; anything else is a ``StoredFailureError`` naming what was found, the
block does not run, and nothing is imported, built or raised from the record's names.
"""

from __future__ import annotations

import abc
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis
import redis.asyncio

from idemkey import (
    AsyncRedisStore,
    ConfigurationError,
    LeaseLostError,
    Policy,
    RecordFormatError,
    RedisStore,
    StoredFailureError,
    aguard,
    guard,
)
from idemkey._core import record_for
from idemkey.guard import GUARD_METHOD

pytestmark = pytest.mark.redis


class DeclinedError(Exception):
    """The one failure the guards here declare, with its one declared field."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class HardDeclinedError(DeclinedError):
    """A subclass nobody declares: stored as the DeclinedError it also is."""


DECLARED = {DeclinedError: ("code",)}
DECLINED_PATH = f"{__name__}:DeclinedError"
MARKER_MODULE = "idemkey_forged_marker"


def forged(type_path: str, message: str = "forged", **fields: Any) -> bytes:
    """A stored failure as an attacker writes it: format byte 3, then MessagePack."""
    return b"\x03" + msgspec.msgpack.encode([type_path, message, fields])


@pytest.fixture
def store(real_client: redis.Redis, prefix: str) -> Iterator[RedisStore]:
    store = RedisStore(real_client, Policy(prefix=prefix))
    yield store
    store.close()


def record_key(prefix: str, key: str) -> str:
    return record_for(prefix, "", GUARD_METHOD, "", key).key


def declined_record(store: RedisStore, key: str, *, declare: bool = True) -> None:
    """A real completed record: a declared failure stored (or, undeclared, a saved value)."""
    if declare:
        with pytest.raises(DeclinedError), guard(store, key, cache_exceptions=DECLARED):
            raise DeclinedError("card declined", "do_not_honor")
    else:
        with guard(store, key) as call:
            call.save("ok")


def retry(store: RedisStore, key: str, declared: object = DECLARED) -> StoredFailureError:
    """A retry of ``key``: must raise StoredFailureError without running the block."""
    with pytest.raises(StoredFailureError) as raised, guard(store, key, cache_exceptions=declared):
        pytest.fail("the block ran: a forged record decided the outcome")
    return raised.value


@pytest.fixture
def marker_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A module on sys.path whose import writes a file: the proof of an import."""
    marker = tmp_path / "imported"
    code = f"open({str(marker)!r}, 'w').close()\n\nclass Boom(Exception):\n    pass\n"
    (tmp_path / f"{MARKER_MODULE}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield marker
    sys.modules.pop(MARKER_MODULE, None)


def test_a_forged_record_still_has_the_shape_idemkey_reads(
    store: RedisStore, real_client: redis.Redis, prefix: str
) -> None:
    # The control for every test below: the same forging with the declared class and field is
    # raised as that class, so what they refuse is the name, not the bytes' shape.
    declined_record(store, "k")
    real_client.hset(record_key(prefix, "k"), "resp", forged(DECLINED_PATH, "changed", code="x"))
    with pytest.raises(DeclinedError) as raised, guard(store, "k", cache_exceptions=DECLARED):
        pytest.fail("the block ran")
    assert (str(raised.value), raised.value.code) == ("changed", "x")


@pytest.mark.parametrize("declare", [True, False])
def test_a_module_named_in_the_record_is_never_imported(
    store: RedisStore, real_client: redis.Redis, prefix: str, marker_module: Path, declare: bool
) -> None:
    declined_record(store, "k", declare=declare)
    real_client.hset(record_key(prefix, "k"), "resp", forged(f"{MARKER_MODULE}:Boom"))
    error = retry(store, "k", DECLARED if declare else ())
    assert error.type_path == f"{MARKER_MODULE}:Boom"
    assert f"{MARKER_MODULE}:Boom" in str(error)
    assert not marker_module.exists()
    assert MARKER_MODULE not in sys.modules


def test_an_undeclared_class_is_never_built(
    store: RedisStore, real_client: redis.Redis, prefix: str
) -> None:
    declined_record(store, "k")
    payload = forged("subprocess:CalledProcessError", "x", cmd="rm -rf /", returncode=1)
    real_client.hset(record_key(prefix, "k"), "resp", payload)
    error = retry(store, "k")
    assert not isinstance(error, subprocess.CalledProcessError)
    assert error.type_path == "subprocess:CalledProcessError"
    assert error.fields == {"cmd": "rm -rf /", "returncode": 1}  # data, shown, not set
    assert DECLINED_PATH in error.reason  # what was declared, for the operator


def test_undeclared_fields_on_a_declared_class_are_refused(
    store: RedisStore, real_client: redis.Redis, prefix: str
) -> None:
    declined_record(store, "k")
    payload = forged(DECLINED_PATH, "declined", code="x", is_admin=True, refund_to="attacker")
    real_client.hset(record_key(prefix, "k"), "resp", payload)
    error = retry(store, "k")
    assert not isinstance(error, DeclinedError)
    assert "'is_admin'" in error.reason
    assert "'refund_to'" in error.reason


def test_a_guard_that_declared_nothing_raises_no_stored_class(
    store: RedisStore, real_client: redis.Redis, prefix: str
) -> None:
    declined_record(store, "k", declare=False)
    payload = forged("idemkey.errors:LeaseLostError", "lost", fence=999)
    real_client.hset(record_key(prefix, "k"), "resp", payload)
    error = retry(store, "k", ())
    assert not isinstance(error, LeaseLostError)
    assert error.type_path == "idemkey.errors:LeaseLostError"
    assert "declares" in error.reason


@pytest.mark.parametrize(
    "payload",
    [b"\x03\xc1", b"\x03\x93\x01\x02\x03", b"\x03" + msgspec.msgpack.encode(["a:B"]), b"\x03"],
    ids=["never-used-byte", "wrong-types", "too-short", "empty"],
)
def test_a_malformed_entry_is_a_stored_failure_error(
    store: RedisStore, real_client: redis.Redis, prefix: str, payload: bytes
) -> None:
    declined_record(store, "k")
    real_client.hset(record_key(prefix, "k"), "resp", payload)
    error = retry(store, "k")
    assert error.type_path == ""
    assert "does not decode" in error.reason
    assert repr(payload[:8])[2:-1] in str(error)  # what was found


def test_a_subclass_is_stored_as_the_declared_class_it_is() -> None:
    from idemkey.guard._failures import raise_failure, rules_for

    rules = rules_for(DECLARED)
    assert rules is not None
    stored = rules.encode(HardDeclinedError("hard", "lost_card"))
    assert stored is not None
    assert msgspec.msgpack.decode(stored[1:]) == [DECLINED_PATH, "hard", {"code": "lost_card"}]
    again = raise_failure(stored, rules)
    assert type(again) is DeclinedError
    assert (str(again), again.code) == ("hard", "lost_card")


class Refusal(Exception, metaclass=abc.ABCMeta):
    """A declared ABC: a class registered on it is an instance by isinstance, not by MRO."""


Refusal.register(LookupError)


def test_a_virtual_subclass_is_not_remembered() -> None:
    from idemkey.guard._failures import rules_for

    rules = rules_for((Refusal,))
    assert rules is not None
    assert isinstance(KeyError("k"), rules.types)
    assert rules.encode(KeyError("k")) is None  # released like any other exception
    assert rules.encode(Refusal("no")) is not None


def test_a_declaration_names_each_class_once_by_a_path_of_plain_fields(
    store: RedisStore,
) -> None:
    with pytest.raises(ConfigurationError, match="identifiers"):
        guard(store, "k", cache_exceptions={DeclinedError: ("__class__",)})
    with pytest.raises(ConfigurationError, match="identifiers"):
        guard(store, "k", cache_exceptions={DeclinedError: ("not a name",)})


async def test_aguard_raises_no_undeclared_class(
    real_async_client: redis.asyncio.Redis, real_client: redis.Redis, prefix: str
) -> None:
    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix))
    with pytest.raises(DeclinedError):
        async with aguard(store, "a", cache_exceptions=DECLARED):
            raise DeclinedError("card declined", "x")
    payload = forged("subprocess:CalledProcessError", "x", cmd="rm -rf /", returncode=1)
    real_client.hset(record_key(prefix, "a"), "resp", payload)
    with pytest.raises(StoredFailureError) as raised:
        async with aguard(store, "a", cache_exceptions=DECLARED):
            pytest.fail("the block ran")
    assert raised.value.type_path == "subprocess:CalledProcessError"


# Steps: a finished step's field (s:<name>) forged, read when a retry resumes the record.


def finished_step(store: RedisStore) -> None:
    """Record "s" with step "charge" finished (a value) and the key released."""
    with pytest.raises(ConnectionError), guard(store, "s") as call:  # noqa: PT012
        call.step("charge", lambda: "charged")
        raise ConnectionError("the next step's PSP timed out")


STEP_FORGERIES = {
    "marker-module": forged(f"{MARKER_MODULE}:Boom"),
    "undeclared-class": forged("subprocess:CalledProcessError", "x", cmd="rm -rf /"),
    "undeclared-fields": forged(DECLINED_PATH, "d", code="x", is_admin=True, refund_to="a"),
    "lease-lost": forged("idemkey.errors:LeaseLostError", "lost", fence=999),
    "malformed": b"\x03\x93\x01\x02\x03",
}


@pytest.mark.parametrize("declare", [True, False])
@pytest.mark.parametrize("payload", list(STEP_FORGERIES.values()), ids=list(STEP_FORGERIES))
def test_a_forged_step_failure_is_a_stored_failure_error(
    store: RedisStore,
    real_client: redis.Redis,
    prefix: str,
    marker_module: Path,
    payload: bytes,
    declare: bool,
) -> None:
    finished_step(store)
    real_client.hset(record_key(prefix, "s"), "s:charge", payload)
    ran: list[str] = []
    declared = DECLARED if declare else ()
    with pytest.raises(StoredFailureError), guard(store, "s") as call:  # noqa: PT012
        call.step("charge", ran.append, "charge", cache_exceptions=declared)
        pytest.fail("the block went on past the step")
    assert ran == []
    assert not marker_module.exists()
    assert MARKER_MODULE not in sys.modules


def test_a_forged_step_failure_of_the_declared_shape_is_raised(
    store: RedisStore, real_client: redis.Redis, prefix: str
) -> None:
    # The control for the step forgeries: the field is the one a resume reads.
    finished_step(store)
    real_client.hset(record_key(prefix, "s"), "s:charge", forged(DECLINED_PATH, "d", code="x"))
    with pytest.raises(DeclinedError), guard(store, "s") as call:
        call.step("charge", pytest.fail, "ran", cache_exceptions=DECLARED)


async def test_aguard_steps_raise_no_undeclared_class(
    real_async_client: redis.asyncio.Redis, real_client: redis.Redis, prefix: str
) -> None:
    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix))
    with pytest.raises(ConnectionError):  # noqa: PT012
        async with aguard(store, "s") as call:
            await call.step("charge", lambda: "charged")
            raise ConnectionError("the next step's PSP timed out")
    real_client.hset(record_key(prefix, "s"), "s:charge", STEP_FORGERIES["undeclared-class"])
    with pytest.raises(StoredFailureError) as raised:
        async with aguard(store, "s") as call:
            await call.step("charge", pytest.fail, "ran", cache_exceptions=DECLARED)
    assert raised.value.type_path == "subprocess:CalledProcessError"
    await store.aclose()


@pytest.mark.parametrize("what", ["failure", "result"])
def test_a_value_nested_past_the_decoders_depth_is_refused_not_a_recursion_error(
    store: RedisStore, real_client: redis.Redis, prefix: str, what: str
) -> None:
    # About 1 KiB of MessagePack: ten thousand one-element arrays, then nil.
    deep = b"\x91" * 10_000 + b"\xc0"
    declined_record(store, "k", declare=what == "failure")
    if what == "failure":
        real_client.hset(record_key(prefix, "k"), "resp", forged(DECLINED_PATH, "x", code=[]))
        stored = real_client.hget(record_key(prefix, "k"), "resp")
        assert stored is not None
        real_client.hset(record_key(prefix, "k"), "resp", stored[:-1] + deep)  # code=<deep>
        assert "does not decode" in retry(store, "k").reason
    else:
        real_client.hset(record_key(prefix, "k"), "resp", b"\x01" + deep)
        with pytest.raises(RecordFormatError), guard(store, "k"):
            pytest.fail("the block ran: an unreadable record decided the outcome")


def test_a_step_name_that_is_not_utf8_is_refused_and_the_record_left_as_it_was(
    store: RedisStore, real_client: redis.Redis, prefix: str
) -> None:
    # idemkey writes every step name from a str: one that does not decode was forged. The claim
    # script has claimed the record by the time its reply is read; the claim is given back.
    def crash_after_a_step() -> None:  # released, the finished step kept
        with guard(store, "k") as call:
            call.step("charge", lambda: 1)
            raise RuntimeError("the crash after a finished step")

    with pytest.raises(RuntimeError):
        crash_after_a_step()
    key = record_key(prefix, "k")
    real_client.hset(key, b"s:\xff", b"\x01\x01")
    forged_record = real_client.hgetall(key)
    # What a claim and its release rewrite, as for any attempt that ended without a result:
    # the origin's time, the last owner, the takeover count; the fence only grows.
    rewritten = {b"i", b"ro", b"tk", b"fence"}
    for _ in range(2):  # and again: the first refusal left no claim in the way
        with pytest.raises(RecordFormatError, match="not UTF-8"), guard(store, "k"):
            pytest.fail("the block ran on a record idemkey cannot read")
        after = real_client.hgetall(key)
        assert {k: v for k, v in after.items() if k not in rewritten} == {
            k: v for k, v in forged_record.items() if k not in rewritten
        }
        assert int(after[b"fence"]) > int(forged_record[b"fence"])
