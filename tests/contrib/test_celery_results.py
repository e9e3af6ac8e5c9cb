"""What IdempotentTask stores of a task's result and of its arguments, in-process (eager
``apply``, a real Redis, no worker; tests/contrib/test_celery.py has the real-worker cases).

A result is stored as Celery's JSON (kombu's) writes it, so a duplicate returns what Celery gave
the first caller; a stored result is input, and decoding it builds only kombu's registered data
types. A value the task's result serializer would not give back equal is refused at save time.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import msgspec
import pytest
import redis
from celery import Celery

from idemkey import ConfigurationError, IdemkeyError, Policy, RecordFormatError, RedisStore
from idemkey._codec import decode_value, encode_value
from idemkey.contrib.celery import IdempotentTask

pytestmark = pytest.mark.redis

#: The msgpack extension code of a result stored as kombu JSON (contrib/_celery_results.py).
KOMBU_JSON = 74


def make_app(serializer: str = "json") -> Celery:
    app = Celery("results", set_as_current=False)
    app.conf.result_serializer = serializer
    app.conf.accept_content = app.conf.result_accept_content = ["json", "pickle"]
    return app


@pytest.fixture
def store(real_client: redis.Redis, prefix: str) -> RedisStore:
    return RedisStore(real_client, Policy(prefix=prefix))


@pytest.fixture
def runs() -> list[object]:
    return []


def returning(app: Celery, store: RedisStore, runs: list[object], value: object) -> Any:
    """A task that records each run in ``runs`` and returns ``value``."""

    @app.task(base=IdempotentTask, shared=False, name="tests.returning", idempotency_store=store)
    def task(order_id: str, amount: int = 0) -> object:
        runs.append(order_id)
        return value

    return task


def stored_results(client: redis.Redis, prefix: str) -> Iterator[bytes]:
    """The keys of the guard records under ``prefix`` that hold a result."""
    for key in client.scan_iter(f"{prefix}:*", _type="hash"):
        if client.hget(key, "resp"):
            yield key


TYPED = {"at": datetime(2024, 5, 1, 12), "day": date(2024, 6, 1), "total": Decimal("1.10")}


def test_a_duplicate_returns_the_types_the_first_call_returned(
    store: RedisStore, runs: list[object]
) -> None:
    task = returning(make_app(), store, runs, {**TYPED, "id": UUID(int=7), "raw": b"\xff"})
    first = task.apply(("o-1",)).get()
    again = task.apply(("o-1",)).get()
    assert again == first
    assert [type(v) for v in again.values()] == [datetime, date, Decimal, UUID, bytes]
    assert runs == ["o-1"]


def test_a_stored_result_decodes_only_into_the_data_types_kombu_registers(
    store: RedisStore, real_client: redis.Redis, prefix: str, runs: list[object]
) -> None:
    # Whoever can write the record chooses no code: a "__type__" kombu does not register, an
    # extension code that is not idemkey's, text that is no JSON are a RecordFormatError (which
    # quotes none of the stored text), and the task does not run again.
    task = returning(make_app(), store, runs, {"n": 1})
    assert task.apply(("o-f",)).get() == {"n": 1}
    [record] = stored_results(real_client, prefix)
    forged = {
        b'{"__type__": "os.system", "__value__": "touch /tmp/owned"}': "unreadable",
        b'{"__type__": "decimal", "__value__": ["no", "digits"]}': "unreadable",
        b'{"a": ': "unreadable",
        b"\xff\xfe": "unreadable",
    }
    for data, says in forged.items():
        real_client.hset(record, "resp", encode_value(msgspec.msgpack.Ext(KOMBU_JSON, data)))
        with pytest.raises(RecordFormatError, match=says) as raised:
            task.apply(("o-f",)).get()
        assert "os.system" not in str(raised.value)
    real_client.hset(record, "resp", encode_value(msgspec.msgpack.Ext(7, b"{}")))
    with pytest.raises(RecordFormatError, match="extension type 7"):
        task.apply(("o-f",)).get()
    # A registered type is rebuilt as that type, and nothing else.
    real_client.hset(
        record,
        "resp",
        encode_value(
            msgspec.msgpack.Ext(KOMBU_JSON, b'{"__type__": "decimal", "__value__": "2.5"}')
        ),
    )
    assert task.apply(("o-f",)).get() == Decimal("2.5")
    assert runs == ["o-f"]


def test_a_result_celerys_json_cannot_carry_is_not_kept(
    store: RedisStore, runs: list[object]
) -> None:
    # Celery could not send it to the caller either; the work ran, so it is not run again.
    # (A ResultNotStorableError; Celery hands it on as the IdemkeyError it derives from, the
    # nearest class that pickles: errors.py gives it no __reduce__.)
    task = returning(make_app(), store, runs, {"tags": {"a", "b"}})
    with pytest.raises(IdemkeyError, match="stored as Celery's JSON, which cannot carry it"):
        task.apply(("o-s",)).get()
    with pytest.raises(IdemkeyError, match="could not be encoded on the first run"):
        task.apply(("o-s",)).get()
    assert runs == ["o-s"]


def test_under_another_result_serializer_a_value_json_changes_is_refused(
    store: RedisStore, runs: list[object]
) -> None:
    # Pickle gives the first caller a tuple as a tuple; stored as JSON it would come back a
    # list, so it is refused rather than replayed as something else.
    task = returning(make_app("pickle"), store, runs, ("a", 1))
    with pytest.raises(IdemkeyError, match="result_serializer is 'pickle'"):
        task.apply(("o-p",)).get()
    with pytest.raises(IdemkeyError, match="could not be encoded on the first run"):
        task.apply(("o-p",)).get()
    assert runs == ["o-p"]
    # What JSON gives back equal is kept, the types kombu registers included.
    kept = returning(make_app("pickle"), store, runs, {**TYPED, "list": [1, "two"]})
    first = kept.apply(("o-k",)).get()
    assert kept.apply(("o-k",)).get() == first == {**TYPED, "list": [1, "two"]}
    assert runs == ["o-p", "o-k"]


def test_arguments_that_cannot_be_fingerprinted_are_refused_naming_the_task(
    store: RedisStore, runs: list[object]
) -> None:
    # An int past 64 bits is valid JSON and Celery delivers it; the advice must be one a
    # Celery user can follow (IdempotentTask builds the payload: no payload= to pass).
    task = returning(make_app(), store, runs, None)
    with pytest.raises(ConfigurationError) as raised:
        task.apply(("o-b", 2**70)).get()
    said = str(raised.value)
    assert "task 'tests.returning'" in said
    assert "payload=" not in said
    assert "idempotency_key=" in said
    assert "as a str" in said
    assert runs == []


def test_under_msgpack_a_tuple_is_kept_as_the_list_msgpack_hands_the_caller(
    store: RedisStore, runs: list[object]
) -> None:
    # msgpack (and yaml) hand the caller a tuple as a list, as Celery's JSON does: the stored
    # JSON gives back what the first caller got, so the result is kept and replayed.
    app = make_app("msgpack")
    app.conf.accept_content = app.conf.result_accept_content = ["json", "msgpack"]
    task = returning(app, store, runs, ("a", 1, {"pair": (2, 3)}))
    task.apply(("o-m",)).get()
    assert task.apply(("o-m",)).get() == ["a", 1, {"pair": [2, 3]}]
    assert runs == ["o-m"]
    # Pickle hands the caller the tuple itself: refused there, as before.
    with pytest.raises(IdemkeyError, match="result_serializer is 'pickle'"):
        returning(make_app("pickle"), store, runs, ("a", 1)).apply(("o-p",)).get()


def test_a_result_json_carries_is_stored_as_the_plain_value_an_earlier_release_reads(
    store: RedisStore, real_client: redis.Redis, prefix: str, runs: list[object]
) -> None:
    # 0.3.0 reads the stored msgspec value as the task's result: a kombu-JSON extension value
    # reached its worker as an Ext, which Celery's JSON could not send (EncodeError). So what
    # comes back equal as the plain value is stored so; only what needs kombu's types is not.
    plain = {"n": 1, "f": 1.5, "ok": True, "none": None, "items": ["a", 2, {"b": []}]}
    task = returning(make_app(), store, runs, plain)
    assert task.apply(("o-plain",)).get() == plain
    [record] = stored_results(real_client, prefix)
    assert decode_value(real_client.hget(record, "resp")) == plain
    assert task.apply(("o-plain",)).get() == plain
    real_client.delete(record)
    # kombu's types, and an int past 64 bits (msgpack cannot hold it plain, JSON can).
    typed = returning(make_app(), store, runs, {"at": datetime(2024, 5, 1), "big": 2**70})
    first = typed.apply(("o-typed",)).get()
    [record] = stored_results(real_client, prefix)
    stored = decode_value(real_client.hget(record, "resp"))
    assert type(stored) is msgspec.msgpack.Ext
    assert stored.code == KOMBU_JSON
    assert typed.apply(("o-typed",)).get() == first
    assert runs == ["o-plain", "o-typed"]


def test_under_msgpack_a_tuple_is_stored_as_the_plain_list_the_caller_got(
    store: RedisStore, real_client: redis.Redis, prefix: str, runs: list[object]
) -> None:
    app = make_app("msgpack")
    app.conf.accept_content = app.conf.result_accept_content = ["json", "msgpack"]
    task = returning(app, store, runs, ("a", 1, {"pair": (2, 3)}))
    task.apply(("o-t",)).get()
    [record] = stored_results(real_client, prefix)
    assert decode_value(real_client.hget(record, "resp")) == ["a", 1, {"pair": [2, 3]}]
    assert task.apply(("o-t",)).get() == ["a", 1, {"pair": [2, 3]}]
