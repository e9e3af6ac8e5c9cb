"""The lean script path (idemkey/store/_concurrency/_async_lean.py) against the plain one.

The lean path must be the one a default ``redis.Redis`` / ``redis.asyncio.Redis`` takes (else it
is dead code), must step aside where it cannot do what ``execute_command`` does, and must answer
every script call exactly as the plain path answers it, byte for byte, on the real server. The
whole store contract also runs on the plain path (the ``Plain*Store`` classes in test_scripts.py,
test_guard.py and test_tombstones.py), while the default classes run the lean one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.sentinel import Sentinel

from idemkey import AsyncRedisStore, Policy, RedisStore
from idemkey._core import record_for
from idemkey.store._concurrency import _async_lean, _sync_lean
from tests.conftest import _purge_prefix
from tests.store._both import AlwaysBatched, Both, _resolve

pytestmark = pytest.mark.skipif(
    int(redis.__version__.split(".", 1)[0]) < 8, reason="the lean path needs redis-py 8"
)

BIG = b"r" * 20_000  # over redis-py's 6000-byte cutoff: the body goes as its own chunk


def _is_lean(store: RedisStore | AsyncRedisStore) -> bool:
    owner = getattr(store._evalsha, "__self__", None)
    return isinstance(owner, (_sync_lean.Lean, _async_lean.Lean))


def _refuse_execute_command(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the plain path ran: {args[:1]}")

    monkeypatch.setattr(client, "execute_command", refuse)


def test_a_default_redis_client_takes_the_lean_path(
    real_client: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix))
    assert _is_lean(store)
    record = record_for(prefix, "", "GUARD", "", "k")
    for script in store._scripts.values():  # NOSCRIPT is reloaded the plain way
        real_client.script_load(script.script)
    _refuse_execute_command(real_client, monkeypatch)
    claimed = store.claim(record, b"fp", heartbeat=False)
    assert store.complete(record, claimed.owner, BIG)  # type: ignore[union-attr]
    assert store.claim(record, b"fp").response == BIG  # type: ignore[union-attr]
    store.close()


async def test_a_default_asyncio_client_takes_the_lean_path(
    real_async_client: redis.asyncio.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix))
    assert _is_lean(store)
    assert isinstance(store._evalsha.__self__, _async_lean.Batched)  # type: ignore[attr-defined]
    record = record_for(prefix, "", "GUARD", "", "k")
    for script in store._scripts.values():
        await real_async_client.script_load(script.script)
    _refuse_execute_command(real_async_client, monkeypatch)
    claimed = await store.claim(record, b"fp", heartbeat=False)
    assert await store.complete(record, claimed.owner, BIG)  # type: ignore[union-attr]
    assert (await store.claim(record, b"fp")).response == BIG  # type: ignore[union-attr]
    await store.aclose()


class _Hooked(redis.Redis):
    """An application's client that wraps every command (a tracer): the plain path calls it."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        return super().execute_command(*args, **options)


def _plain_clients() -> list[tuple[str, Callable[[], Any]]]:
    valkey = pytest.importorskip("valkey")
    callbacks = redis.Redis()
    callbacks.set_response_callback("EVALSHA", lambda response, **options: response)
    return [
        ("fakeredis", lambda: fakeredis.FakeRedis()),
        ("fakeredis asyncio", lambda: fakeredis.FakeAsyncRedis()),
        ("valkey-py", lambda: valkey.Valkey()),
        ("valkey-py asyncio", lambda: valkey.asyncio.Valkey()),
        ("single connection", lambda: redis.Redis(single_connection_client=True)),
        ("asyncio single connection", lambda: redis.asyncio.Redis(single_connection_client=True)),
        ("a hooked subclass", _Hooked),
        ("an EVALSHA callback", lambda: callbacks),
        ("client-side cache", lambda: redis.Redis(protocol=3, cache_config=_cache_config())),
        ("sentinel", lambda: Sentinel([("127.0.0.1", 1)]).master_for("idemkey")),
        ("asyncio sentinel", lambda: AsyncSentinel([("127.0.0.1", 1)]).master_for("idemkey")),
    ]


def _cache_config() -> Any:
    from redis.cache import CacheConfig

    return CacheConfig()


def test_the_plain_path_runs_where_the_lean_one_cannot() -> None:
    for label, make in _plain_clients():
        client = make()
        is_async = "asyncio" in label
        store = (AsyncRedisStore if is_async else RedisStore)(client, Policy(prefix="p"))
        assert not _is_lean(store), label
        assert store._evalsha == store._plain_evalsha, label


# ---- the same answers on both paths ----------------------------------------------------------


async def _scenario(both: Both) -> list[object]:
    """Every script, each of its answers, on records of ``both``'s prefix; the raw replies."""
    replies: list[object] = []
    send = both.store._evalsha
    # Loaded first: a NOSCRIPT reply would be answered by the registered script, outside the
    # path recorded here, and drop that call's reply from the list (a fresh server's first run).
    for script in both.store._scripts.values():
        await _resolve(both.client.script_load(script.script))

    async def recorded(sha: str, keys_and_args: tuple[str | bytes | int, ...]) -> Any:
        reply = await _resolve(send(sha, keys_and_args))
        replies.append(reply)
        return reply

    def sync_recorded(sha: str, keys_and_args: tuple[str | bytes | int, ...]) -> Any:
        reply = send(sha, keys_and_args)
        replies.append(reply)
        return reply

    both.store._evalsha = recorded if both.is_async else sync_recorded  # type: ignore[assignment]
    a, b = both.record("a"), both.record("b")
    call: Callable[..., Awaitable[Any]] = lambda method, *args, **kw: _resolve(  # noqa: E731
        getattr(both.store, method)(*args, **kw)
    )
    await call("claim", a, b"fp", owner="o1", heartbeat=False)  # claimed
    await call("claim", a, b"fp", owner="o1", heartbeat=False)  # re-sent: the same
    await call("claim", a, b"other", owner="o2", heartbeat=False)  # mismatch
    await call("checkpoint", a, "o1", "s:one", b"step result")
    await call("checkpoint", a, "o2", "s:one", b"not ours")
    await call("attempt", a, "o1", "a:two")
    await call("attempt", a, "o1", "a:two")
    await call("renew", a, "o1", lease_ms=30_000)
    await call("renew", a, "o2", lease_ms=30_000)
    await call("complete", a, "o2", b"not ours")
    await call("complete", a, "o1", BIG, grace_ms=60_000)
    await call("complete", a, "o1", BIG)  # re-sent: the same answer
    await call("claim", a, b"fp", owner="o3", heartbeat=False)  # replay
    await call("claim", b, b"fp", owner="o1", heartbeat=False)
    await call("release", b, "o2")
    await call("release", b, "o1")
    await call("claim", b, b"fp", owner="o4", heartbeat=False)  # a higher fence, after a release
    await call("cancel", b)
    await call("cancel", b, abandon=True)
    await both.delete(a.key)
    await call("claim", a, b"fp", owner="o5", heartbeat=False, expired=True)  # the tombstone
    replies.append(await both.snapshot(b))
    for index, reply in enumerate(replies):  # the tombstone's age in ms is a clock, not a reply
        if isinstance(reply, list) and reply[:1] == [5] and len(reply) == 2:
            replies[index] = [5, "<age>"]
    return _fences_named(replies)


def _fences_named(replies: list[object]) -> list[object]:
    """The fences (the server's clock in µs, 16 digits) named by their order of appearance: two
    runs compare alike when their fences repeat and grow alike."""
    names: dict[int, str] = {}

    def name(fence: int) -> str:
        return names.setdefault(fence, f"<fence {len(names) + 1}>")

    def walk(item: Any) -> Any:
        if isinstance(item, int) and item > 10**15:
            return name(item)
        if isinstance(item, bytes) and item.isdigit() and int(item) > 10**15:
            return name(int(item)).encode()
        if isinstance(item, list | tuple):
            return type(item)(walk(part) for part in item)
        if isinstance(item, dict):
            return {walk(k): walk(v) for k, v in item.items()}
        return item

    named: list[object] = walk(replies)
    fences = sorted(names)  # the order of appearance is the order of the values: they grow
    assert [names[f] for f in fences] == [f"<fence {i}>" for i in range(1, len(fences) + 1)]
    return named


async def test_both_paths_answer_alike_sync(real_client: redis.Redis, prefix: str) -> None:
    lean = RedisStore(real_client, Policy(prefix=prefix + "lean"))
    plain = RedisStore(real_client, Policy(prefix=prefix + "plain"))
    plain._evalsha = plain._plain_evalsha  # type: ignore[method-assign]
    assert _is_lean(lean)
    lean_replies = await _scenario(Both(lean, prefix + "lean"))
    plain_replies = await _scenario(Both(plain, prefix + "plain"))
    assert lean_replies == plain_replies
    assert BIG in [r[1] for r in lean_replies if isinstance(r, list) and len(r) == 2]
    lean.close()
    plain.close()


async def test_both_paths_answer_alike_asyncio(
    real_async_client: redis.asyncio.Redis, prefix: str
) -> None:
    lean = AsyncRedisStore(real_async_client, Policy(prefix=prefix + "lean"))
    plain = AsyncRedisStore(real_async_client, Policy(prefix=prefix + "plain"))
    plain._evalsha = plain._plain_evalsha  # type: ignore[method-assign]
    assert _is_lean(lean)
    lean_replies = await _scenario(Both(lean, prefix + "lean"))
    plain_replies = await _scenario(Both(plain, prefix + "plain"))
    assert lean_replies == plain_replies
    await lean.aclose()
    await plain.aclose()


async def test_the_batched_path_answers_alike(
    real_async_client: redis.asyncio.Redis, prefix: str
) -> None:
    """The same scenario with every call sent in a batch (tests/store/test_batch.py fires them
    at once): the same raw replies and stored bytes as the plain path."""
    batched = AsyncRedisStore(real_async_client, Policy(prefix=prefix + "lean"))
    sender = AlwaysBatched(real_async_client)
    batched._evalsha = sender.evalsha  # type: ignore[method-assign]
    plain = AsyncRedisStore(real_async_client, Policy(prefix=prefix + "plain"))
    plain._evalsha = plain._plain_evalsha  # type: ignore[method-assign]
    batched_replies = await _scenario(Both(batched, prefix + "lean"))
    plain_replies = await _scenario(Both(plain, prefix + "plain"))
    assert batched_replies == plain_replies
    assert sum(sender.sizes) == sender.calls > 0
    await batched.aclose()
    await plain.aclose()


def test_the_packed_command_is_redis_pys() -> None:
    """Byte for byte what the client's own connection packs, small and large arguments alike,
    for the sync and the asyncio pools, UTF-8 and latin-1 clients (redis-py 8.1 packs a sync
    connection's text with hiredis as UTF-8, 8.2 with the client's encoding: the packer is
    checked against the installed connection, not assumed)."""
    from idemkey.store._base import evalsha_packer, pack_evalsha

    cases = (
        ("k", b"fp", "owner", 30_000, 86_400_000),
        ("k", "o", BIG, 5, "t", 1),
        ("préfixe:{k}", b"\x00\xff", "o", -1, 0),
    )
    latin = ("é:{k}", "o", 1)
    for client in (
        redis.Redis(),
        redis.Redis(encoding="latin-1"),
        redis.asyncio.Redis(),
        redis.asyncio.Redis(encoding="latin-1"),
    ):
        pool = client.connection_pool
        pack = evalsha_packer(pool)
        assert pack is not None, pool
        connection = pool.connection_class(**pool.connection_kwargs)
        for args in (*cases, latin):
            theirs = b"".join(connection.pack_command("EVALSHA", "a" * 40, 1, *args))
            assert b"".join(pack("a" * 40, args)) == theirs, (pool, args)
    encode = redis.Redis().get_encoder().encode
    connection = redis.Connection()
    heads: dict[tuple[str, int], bytes] = {}
    pack_evalsha(heads, encode, "a" * 40, ("k", "l", 1))
    assert pack_evalsha(heads, encode, "a" * 40, ("x", "y", 2)) == [
        b"".join(connection.pack_command("EVALSHA", "a" * 40, 1, "x", "y", 2))
    ]


class _OtherPacking(redis.Connection):
    """A connection that packs its commands unlike either of idemkey's packers (as a future
    redis-py might): the lean path must not stand in for it."""

    def pack_command(self, *args: Any) -> list[bytes]:
        return [b"#" + chunk for chunk in super().pack_command(*args)]


class _OtherAsyncPacking(redis.asyncio.Connection):
    def pack_command(self, *args: Any) -> list[bytes]:
        return [b"#" + chunk for chunk in super().pack_command(*args)]


def test_a_client_that_packs_otherwise_takes_the_plain_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The packer check, not lean_eligible's list of classes, is what keeps such a client off
    the lean path: with the class check let through, the store still takes the plain path."""
    from idemkey.store._base import evalsha_packer

    sync_client = redis.Redis(connection_pool=redis.ConnectionPool(connection_class=_OtherPacking))
    async_client = redis.asyncio.Redis(
        connection_pool=redis.asyncio.ConnectionPool(connection_class=_OtherAsyncPacking)
    )
    assert evalsha_packer(sync_client.connection_pool) is None
    assert evalsha_packer(async_client.connection_pool) is None
    monkeypatch.setattr(_sync_lean, "lean_eligible", lambda client, asyncio: True)
    monkeypatch.setattr(_async_lean, "lean_eligible", lambda client, asyncio: True)
    assert _sync_lean.lean_for(sync_client) is None
    assert _async_lean.lean_for(async_client) is None
    store = RedisStore(sync_client, Policy(prefix="otherpacking"))
    assert store._evalsha == store._plain_evalsha
    astore = AsyncRedisStore(async_client, Policy(prefix="otherpacking"))
    assert astore._evalsha == astore._plain_evalsha
    # And the same client with redis-py's own connection does take it.
    plain_client = redis.Redis()
    assert _sync_lean.lean_for(plain_client) is not None


# ---- what the client's connections do, on both paths ---------------------------------------

PATHS = ["lean", "plain"]


def _store(client: Any, path: str, prefix: str = "p") -> RedisStore:
    store = RedisStore(client, Policy(prefix=prefix))
    if path == "plain":
        store._evalsha = store._plain_evalsha  # type: ignore[method-assign]
    assert _is_lean(store) == (path == "lean")
    return store


@pytest.mark.parametrize("path", PATHS)
def test_the_clients_retry_policy_resends_a_dropped_read(
    redis_url: str, prefix: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One read fails with a dropped connection: the connection's own ``retry`` sends again
    (after a disconnect), and the store's re-send (``_eval_again``) is not needed."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    real_client = redis.Redis.from_url(redis_url, retry=Retry(NoBackoff(), 1))
    store = _store(real_client, path, prefix)
    record = record_for(prefix, "", "GUARD", "", "k")
    store.release(record, "nobody")  # a pooled connection, connected
    for script in store._scripts.values():
        real_client.script_load(script.script)
    conn = real_client.connection_pool.get_connection()
    real_client.connection_pool.release(conn)
    failures, disconnects = [], []
    read, disconnect = conn.read_response, conn.disconnect

    def read_once_dropped(*args: Any, **kwargs: Any) -> Any:
        reply = read(*args, **kwargs)
        if not failures:
            failures.append(reply)
            raise redis.ConnectionError("dropped under the read")
        return reply

    def counted_disconnect(*args: Any, **kwargs: Any) -> None:
        disconnects.append(args)
        disconnect(*args, **kwargs)

    monkeypatch.setattr(conn, "read_response", read_once_dropped)
    monkeypatch.setattr(conn, "disconnect", counted_disconnect)
    monkeypatch.setattr(store, "_eval_again", None)  # not the store's re-send: the client's
    decision = store.claim(record, b"fp", owner="o1", heartbeat=False)
    assert type(decision).__name__ == "Claimed"
    assert len(failures) == 1
    assert disconnects  # the connection was reset before the second attempt
    store.close()
    real_client.close()
    _purge_prefix(redis_url, prefix)


@pytest.mark.parametrize("path", PATHS)
def test_the_connections_timeout_bounds_a_script_call(private_redis_server: Any, path: str) -> None:
    """A server that does not answer: the client's ``socket_timeout`` ends the call as a
    StoreError (a timeout is never sent again by the store)."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from idemkey import StoreError

    client = private_redis_server.client(socket_timeout=0.3, retry=Retry(NoBackoff(), 0))
    store = _store(client, path)
    record = record_for("p", "", "GUARD", "", "k")
    store.release(record, "nobody")  # connected, the release script loaded
    private_redis_server.pause()
    try:
        with pytest.raises(StoreError, match="Timeout"):
            store.release(record, "nobody")
    finally:
        private_redis_server.resume()
        store.close()
        client.close()


@pytest.mark.parametrize("path", PATHS)
def test_the_connections_health_check_runs(private_redis_server: Any, path: str) -> None:
    """``health_check_interval``: a PING before a script call on a connection idle that long."""
    client = private_redis_server.client(health_check_interval=1)
    store = _store(client, path)
    record = record_for("p", "", "GUARD", "", "k")
    store.release(record, "nobody")
    conn = client.connection_pool.get_connection()
    client.connection_pool.release(conn)
    pings = client.info("commandstats").get("cmdstat_ping", {}).get("calls", 0)
    conn.next_health_check = 0  # as if idle past the interval
    store.release(record, "nobody")
    assert client.info("commandstats")["cmdstat_ping"]["calls"] == pings + 1
    store.close()
    client.close()


def _async_store(client: Any, path: str, prefix: str = "p") -> AsyncRedisStore:
    store = AsyncRedisStore(client, Policy(prefix=prefix))
    if path == "plain":
        store._evalsha = store._plain_evalsha  # type: ignore[method-assign]
    assert _is_lean(store) == (path == "lean")
    return store


@pytest.mark.parametrize("path", PATHS)
async def test_the_asyncio_clients_retry_policy_resends_a_dropped_read(
    redis_url: str, prefix: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the sync test: redis.asyncio's connection ``retry`` sends again after a disconnect."""
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    client = redis.asyncio.Redis.from_url(redis_url, retry=Retry(NoBackoff(), 1))
    store = _async_store(client, path, prefix)
    record = record_for(prefix, "", "GUARD", "", "k")
    for script in store._scripts.values():
        await client.script_load(script.script)
    conn = await client.connection_pool.get_connection()
    await client.connection_pool.release(conn)
    failures: list[object] = []
    disconnects: list[object] = []
    read, disconnect = conn.read_response, conn.disconnect

    async def read_once_dropped(*args: Any, **kwargs: Any) -> Any:
        reply = await read(*args, **kwargs)
        if not failures:
            failures.append(reply)
            raise redis.ConnectionError("dropped under the read")
        return reply

    async def counted_disconnect(*args: Any, **kwargs: Any) -> None:
        disconnects.append(kwargs)
        await disconnect(*args, **kwargs)

    monkeypatch.setattr(conn, "read_response", read_once_dropped)
    monkeypatch.setattr(conn, "disconnect", counted_disconnect)
    monkeypatch.setattr(store, "_eval_again", None)
    decision = await store.claim(record, b"fp", owner="o1", heartbeat=False)
    assert type(decision).__name__ == "Claimed"
    assert len(failures) == 1
    assert disconnects
    await store.aclose()
    await client.aclose()
    _purge_prefix(redis_url, prefix)


@pytest.mark.parametrize("path", PATHS)
async def test_the_asyncio_connections_timeout_bounds_a_script_call(
    private_redis_server: Any, path: str
) -> None:
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from idemkey import StoreError

    client = private_redis_server.async_client(socket_timeout=0.3, retry=Retry(NoBackoff(), 0))
    store = _async_store(client, path)
    record = record_for("p", "", "GUARD", "", "k")
    await store.release(record, "nobody")
    private_redis_server.pause()
    try:
        with pytest.raises(StoreError, match="Timeout"):
            await store.release(record, "nobody")
    finally:
        private_redis_server.resume()
        await store.aclose()
        await client.aclose()
