"""Which clients a store accepts, and how Redis failures reach the caller.

A store takes the client the user already has (redis-py or valkey, sync or asyncio) made with
``decode_responses=False``. Whatever the backend raises reaches the caller once, as
``StoreError`` chained to the backend's exception; a script cache flushed by a restart or a
failover (NOSCRIPT) is reloaded without the caller noticing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import fakeredis
import pytest
import redis
import redis.asyncio
import valkey
import valkey.asyncio

from idemkey import (
    AsyncRedisStore,
    ConfigurationError,
    Event,
    Policy,
    RecordFormatError,
    RedisStore,
    RequestInFlightError,
    StoreError,
    aguard,
    guard,
)
from idemkey.records import Claimed, Replay, record_for
from tests._servers import RedisServer, free_port, no_async_retry, no_retry, wait_until

# ---- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: redis.Redis(decode_responses=True),
        lambda: fakeredis.FakeRedis(decode_responses=True),
        lambda: valkey.Valkey(decode_responses=True),
    ],
    ids=["redis", "fakeredis", "valkey"],
)
def test_a_client_that_decodes_responses_is_refused(make: Callable[[], object]) -> None:
    with pytest.raises(ConfigurationError, match="decode_responses=False"):
        RedisStore(make())


async def test_an_async_client_that_decodes_responses_is_refused() -> None:
    client = redis.asyncio.Redis(decode_responses=True)
    try:
        with pytest.raises(ConfigurationError, match="decode_responses=False"):
            AsyncRedisStore(client)
    finally:
        await client.aclose()


@pytest.mark.parametrize("client", [None, "redis://localhost:6379/0", object()])
def test_something_that_is_not_a_client_is_refused(client: object) -> None:
    with pytest.raises(ConfigurationError, match="redis-py or valkey client"):
        RedisStore(client)


# ---- valkey ----------------------------------------------------------------------------------


def test_a_valkey_client_works(redis_url: str, prefix: str) -> None:
    client = valkey.Valkey.from_url(redis_url)
    store = RedisStore(client, Policy(prefix=prefix))
    try:
        with guard(store, "charge:1", payload=b"inv") as call:
            with pytest.raises(RequestInFlightError), guard(store, "charge:1", payload=b"inv"):
                pytest.fail("the body must not run twice")
            call.save("charged")
        with guard(store, "charge:1", payload=b"inv") as again:
            assert again.result == "charged"
    finally:
        store.close()
        client.delete(*client.keys(f"*{prefix}*"))
        client.close()


async def test_an_async_valkey_client_works(redis_url: str, prefix: str) -> None:
    client = valkey.asyncio.Valkey.from_url(redis_url)
    store = AsyncRedisStore(client, Policy(prefix=prefix))
    try:
        async with aguard(store, "charge:1", payload=b"inv") as call:
            call.save("charged")
        async with aguard(store, "charge:1", payload=b"inv") as again:
            assert again.result == "charged"
    finally:
        await store.aclose()
        await client.delete(*await client.keys(f"*{prefix}*"))
        await client.aclose()


def test_a_valkey_failure_is_a_store_error() -> None:
    client = valkey.Valkey(port=free_port(), socket_connect_timeout=1, retry_on_error=[])
    store = RedisStore(client)
    with pytest.raises(StoreError) as exc:
        store.claim(record_for("p", "", "GUARD", "", "k"), "fp", heartbeat=False)
    assert isinstance(exc.value.__cause__, valkey.ConnectionError)


class AppValkey(valkey.Valkey):
    """An application's own subclass of valkey-py's client: still valkey-py, errors and all."""


def test_a_subclassed_valkey_client_works(redis_url: str, prefix: str) -> None:
    # The first EVALSHA gets valkey-py's NoScriptError, which must be known as NOSCRIPT.
    client = AppValkey.from_url(redis_url)
    client.script_flush()
    store = RedisStore(client, Policy(prefix=prefix))
    try:
        with guard(store, "charge:1", payload=b"inv") as call:
            call.save("charged")
        with guard(store, "charge:1", payload=b"inv") as again:
            assert again.result == "charged"
    finally:
        store.close()
        client.delete(*client.keys(f"*{prefix}*"))
        client.close()


def test_a_subclassed_valkey_client_failure_is_a_store_error() -> None:
    client = AppValkey(port=free_port(), socket_connect_timeout=1, retry_on_error=[])
    store = RedisStore(client)
    with pytest.raises(StoreError) as exc:
        store.claim(record_for("p", "", "GUARD", "", "k"), "fp", heartbeat=False)
    assert isinstance(exc.value.__cause__, valkey.ConnectionError)


# ---- Redis down ------------------------------------------------------------------------------


def _down_client() -> redis.Redis:
    """A client for a port nobody listens on, failing at once (no retries)."""
    return redis.Redis(port=free_port(), socket_connect_timeout=1, retry=no_retry())


def test_a_redis_that_is_down_is_a_store_error() -> None:
    client = _down_client()
    store = RedisStore(client)
    record = record_for("p", "", "GUARD", "", "k")
    for call in (
        lambda: store.claim(record, "fp"),
        lambda: store.complete(record, "o", b"r"),
        lambda: store.release(record, "o"),
        lambda: store.renew(record, "o"),
    ):
        with pytest.raises(StoreError) as exc:
            call()
        assert not isinstance(exc.value, redis.RedisError)
        assert isinstance(exc.value.__cause__, redis.ConnectionError)
    with pytest.raises(StoreError), guard(store, "k"):
        pytest.fail("the body must not run without a claim")
    client.close()


async def test_a_redis_that_is_down_is_a_store_error_for_asyncio() -> None:
    client = redis.asyncio.Redis(port=free_port(), socket_connect_timeout=1, retry=no_async_retry())
    store = AsyncRedisStore(client)
    try:
        with pytest.raises(StoreError) as exc:
            await store.claim(record_for("p", "", "GUARD", "", "k"), "fp")
        assert isinstance(exc.value.__cause__, redis.ConnectionError)
        with pytest.raises(StoreError):
            async with aguard(store, "k"):
                pytest.fail("the body must not run without a claim")
    finally:
        await client.aclose()


def test_redis_dying_inside_the_block_is_a_store_error_on_exit(
    private_redis_server: RedisServer,
) -> None:
    client = private_redis_server.client(socket_connect_timeout=1, retry=no_retry())
    store = RedisStore(client)

    def work_while_redis_dies() -> None:
        with guard(store, "k") as call:
            call.save("done")
            private_redis_server.kill()

    try:
        with pytest.raises(StoreError) as exc:
            work_while_redis_dies()
        assert isinstance(exc.value.__cause__, (redis.ConnectionError, OSError))
    finally:
        store.close()
        client.close()


def test_the_blocks_own_exception_wins_over_a_store_error_on_exit(
    private_redis_server: RedisServer,
) -> None:
    client = private_redis_server.client(socket_connect_timeout=1, retry=no_retry())
    events: list[Event] = []
    store = RedisStore(client, Policy(on_event=events.append))

    def fail_while_redis_dies() -> None:
        with guard(store, "k"):
            private_redis_server.kill()
            raise LookupError("the caller must see this one")

    try:
        with pytest.raises(LookupError, match="must see"):
            fail_while_redis_dies()
    finally:
        store.close()
        client.close()
    assert [event.kind for event in events] == ["claimed", "store_error"]


def test_an_error_reply_is_a_store_error(real_client: redis.Redis, prefix: str) -> None:
    record = record_for(prefix, "", "GUARD", "", "k")
    real_client.set(record.key, "not a hash")  # WRONGTYPE for the release script
    store = RedisStore(real_client, Policy(prefix=prefix))
    with pytest.raises(StoreError, match="WRONGTYPE") as exc:
        store.release(record, "owner")
    assert isinstance(exc.value.__cause__, redis.ResponseError)
    # The claim script tells this key apart (tests/store/test_forget.py): Redis answered.
    with pytest.raises(RecordFormatError, match="not an idemkey record: a string"):
        store.claim(record, "fp")


# ---- NOSCRIPT --------------------------------------------------------------------------------


def test_scripts_are_reloaded_after_script_flush(private_redis_server: RedisServer) -> None:
    client = private_redis_server.client()
    store = RedisStore(client)
    record = record_for("p", "", "GUARD", "", "k")
    try:
        first = store.claim(record, "fp", heartbeat=False)
        assert isinstance(first, Claimed)
        client.script_flush()
        assert client.script_exists(store._scripts["complete"].sha) == [False]
        assert store.complete(record, first.owner, b"resp") is True
        client.script_flush()
        assert store.claim(record, "fp") == Replay(b"resp")
    finally:
        store.close()
        client.close()


async def test_async_scripts_are_reloaded_after_script_flush(
    private_redis_server: RedisServer,
) -> None:
    client = private_redis_server.async_client()
    store = AsyncRedisStore(client)
    record = record_for("p", "", "GUARD", "", "k")
    try:
        await client.script_flush()
        first = await store.claim(record, "fp", heartbeat=False)
        assert isinstance(first, Claimed)
        await client.script_flush()
        assert await store.complete(record, first.owner, b"resp") is True
        await client.script_flush()
        assert await store.claim(record, "fp") == Replay(b"resp")
    finally:
        await store.aclose()
        await client.aclose()


def test_a_restarted_redis_is_used_again(private_redis_server: RedisServer) -> None:
    # A restart empties the script cache and drops the connections: the next call recovers.
    client = private_redis_server.client()
    store = RedisStore(client)
    try:
        with guard(store, "a") as call:
            call.save(1)
        private_redis_server.restart()
        with guard(store, "b") as call:
            assert not call.replayed
            call.save(2)
        with guard(store, "b") as again:
            assert again.result == 2
    finally:
        store.close()
        client.close()


# ---- lifecycle -------------------------------------------------------------------------------


def test_close_stops_the_heartbeat_and_leaves_the_client_open() -> None:
    client = fakeredis.FakeRedis()
    store = RedisStore(client)
    before = set(threading.enumerate())
    with guard(store, "k") as call:
        call.save(1)
    (heartbeat,) = set(threading.enumerate()) - before
    assert heartbeat.name == "idemkey-heartbeat"
    assert heartbeat.daemon  # never holds up interpreter exit
    store.close()
    wait_until(lambda: not heartbeat.is_alive(), timeout=5, message="the heartbeat to stop")
    assert client.ping()


async def test_aclose_stops_the_async_heartbeat() -> None:
    client = fakeredis.FakeAsyncRedis()
    store = AsyncRedisStore(client)
    before = asyncio.all_tasks()
    async with aguard(store, "k") as call:
        (heartbeat,) = asyncio.all_tasks() - before - {asyncio.current_task()}
        call.save(1)
    await store.aclose()
    assert heartbeat.done()
    assert await client.ping()
    await client.aclose()
