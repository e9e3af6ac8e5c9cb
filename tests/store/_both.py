"""One face for RedisStore and AsyncRedisStore, so every behaviour is written once.

A test class mixes in :class:`SyncStore` or :class:`AsyncStore` (each providing the ``store``
fixture) with a class of ``async def`` tests that only use :class:`Both`: every call is
awaited, and for the sync store it simply runs inline. Both stores run on the real session
server and on fakeredis, through the ``sync_client`` / ``async_client`` fixture params.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
import pytest_asyncio
import redis
import redis.asyncio

from idemkey import AsyncRedisStore, Call, Policy, RedisStore, aguard, guard, idempotent
from idemkey._core import owner_tag
from idemkey.records import GUARD_METHOD, Decision, Record, record_for
from idemkey.store._base import evalsha_packer, lean_eligible
from idemkey.store._concurrency._async_lean import Batched, _LoopState
from tests._lease import lapse, lease_holder, lease_left
from tests.conftest import _purge_prefix

T = TypeVar("T")


async def _resolve(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class Both:
    """A store of either kind, with awaitable methods and raw Redis reads for assertions."""

    def __init__(self, store: RedisStore | AsyncRedisStore, prefix: str, raw: Any = None) -> None:
        self.store = store
        self.prefix = prefix
        self.is_async = isinstance(store, AsyncRedisStore)
        #: redis-py's API, for the raw reads: the store's own client, or ``raw`` where the
        #: store's speaks another (valkey-glide's facade).
        self.client: Any = store.client if raw is None else raw

    # ---- names ---------------------------------------------------------------------------

    def record(self, key: str = "k") -> Record:
        """A record in this test's prefix, named as an HTTP request's would be."""
        return record_for(self.prefix, "tenant", "POST", "/charges", key)

    def guard_record(self, key: str, scope: str = "") -> Record:
        """The record ``guard(store, key, scope=scope)`` uses."""
        return record_for(self.prefix, scope, GUARD_METHOD, "", key)

    # ---- the store API, awaited ----------------------------------------------------------

    async def claim(self, record: Record, fp: str | bytes = "fp1", **kwargs: Any) -> Decision:
        decision: Decision = await _resolve(self.store.claim(record, fp, **kwargs))
        return decision

    async def complete(self, record: Record, owner: str, resp: bytes, **kwargs: Any) -> bool:
        return bool(await _resolve(self.store.complete(record, owner, resp, **kwargs)))

    async def release(self, record: Record, owner: str) -> bool:
        return bool(await _resolve(self.store.release(record, owner)))

    async def renew(self, record: Record, owner: str, **kwargs: Any) -> bool:
        return bool(await _resolve(self.store.renew(record, owner, **kwargs)))

    async def renew_reply(self, record: Record, owner: str, lease_ms: int, fence: int) -> int:
        """renew.lua's reply as the heartbeat gets it: 1, 0 or RECORD_LOST."""
        return int(await _resolve(self.store._renew(record, owner, lease_ms, fence)))

    async def complete_reply(self, record: Record, owner: str, resp: bytes, fence: int) -> int:
        """complete.lua's own reply, sent with the claim's fence: 1, 0 or RECORD_LOST."""
        args = (record.key, owner, resp, 100_000, owner_tag(owner), fence)
        return int(await _resolve(self.store._eval("complete", *args)))

    async def delete(self, *keys: str) -> None:
        await _resolve(self.client.delete(*keys))

    async def checkpoint(self, record: Record, owner: str, field: str, result: bytes) -> object:
        return await _resolve(self.store.checkpoint(record, owner, field, result))

    @contextlib.asynccontextmanager
    async def guard(self, key: str, **kwargs: Any) -> AsyncIterator[Call[Any]]:
        """``guard`` or ``aguard``; an exception in the block reaches the real guard's exit."""
        if isinstance(self.store, AsyncRedisStore):
            async with aguard(self.store, key, **kwargs) as call:
                yield call
        else:
            with guard(self.store, key, **kwargs) as call:
                yield call

    def idempotent(self, body: Callable[..., T], **kwargs: Any) -> Callable[..., Awaitable[T]]:
        """Decorate ``body`` (as an async function for the async store) and return an async
        function that calls the decorated one."""
        if isinstance(self.store, AsyncRedisStore):

            @functools.wraps(body)
            async def abody(*args: Any, **kw: Any) -> T:
                return body(*args, **kw)

            decorated: Callable[..., Any] = idempotent(self.store, **kwargs)(abody)
        else:
            decorated = idempotent(self.store, **kwargs)(body)

        async def run(*args: Any, **kw: Any) -> T:
            result: T = await _resolve(decorated(*args, **kw))
            return result

        return run

    def background(self, work: Callable[[], Awaitable[T]]) -> Awaitable[T]:
        """Run ``work`` concurrently with the test: a task for the async store, a thread with
        its own event loop for the sync store (whose calls block)."""
        if self.is_async:
            return asyncio.ensure_future(work())
        return asyncio.ensure_future(asyncio.to_thread(asyncio.run, work()))  # type: ignore[arg-type]

    # ---- raw Redis, for assertions -------------------------------------------------------

    async def hash(self, record: Record) -> dict[bytes, bytes]:
        result: dict[bytes, bytes] = await _resolve(self.client.hgetall(record.key))
        return result

    async def lock_holder(self, record: Record) -> bytes | None:
        """The owner whose live claim holds the record (its lease not lapsed), or None."""
        result: bytes | None = await _resolve(lease_holder(self.client, record))
        return result

    async def lease_left(self, record: Record) -> int:
        """Milliseconds left of the record's lease, -2 when no live claim holds it."""
        return int(await _resolve(lease_left(self.client, record)))

    async def pttl(self, key: str) -> int:
        return int(await _resolve(self.client.pttl(key)))

    async def pexpire(self, key: str, ms: int) -> None:
        await _resolve(self.client.pexpire(key, ms))

    async def snapshot(self, record: Record) -> tuple[dict[bytes, bytes], bytes | None]:
        """Everything a record holds, to compare byte for byte before and after."""
        return await self.hash(record), await self.lock_holder(record)

    async def expire_lock(self, record: Record) -> None:
        """Let the lease lapse now, as if its owner had crashed (its deadline moved to the
        past, ``tests._lease.lapse``)."""
        assert await _resolve(lapse(self.client, record)) == 1, "no claim in progress to lapse"

    async def keys(self) -> list[bytes]:
        result: list[bytes] = await _resolve(self.client.keys(f"*{self.prefix}*"))
        return result

    async def server_time(self) -> float:
        """The server's clock (``TIME``), Unix seconds."""
        seconds, micros = await _resolve(self.client.time())
        return int(seconds) + int(micros) / 1e6


class SyncStore:
    """Mixin: ``store`` is a :class:`RedisStore` on ``sync_client`` (real Redis, fakeredis)."""

    @pytest.fixture
    def store(self, sync_client: redis.Redis, prefix: str) -> Iterator[Both]:
        store = RedisStore(sync_client, Policy(prefix=prefix))
        try:
            yield Both(store, prefix)
        finally:
            store.close()


class AsyncStore:
    """Mixin: ``store`` is an :class:`AsyncRedisStore` on ``async_client``."""

    @pytest_asyncio.fixture
    async def store(self, async_client: redis.asyncio.Redis, prefix: str) -> AsyncIterator[Both]:
        store = AsyncRedisStore(async_client, Policy(prefix=prefix))
        try:
            yield Both(store, prefix)
        finally:
            await store.aclose()


class PlainSyncStore:
    """Mixin: ``store`` is a :class:`RedisStore` on the real server that sends its scripts with
    ``execute_command`` (the plain path) instead of the lean path a default client takes: the
    contract holds on both (tests/store/test_lean.py pins their answers equal)."""

    @pytest.fixture
    def store(self, real_client: redis.Redis, prefix: str) -> Iterator[Both]:
        store = RedisStore(real_client, Policy(prefix=prefix))
        store._evalsha = store._plain_evalsha  # type: ignore[method-assign]
        try:
            yield Both(store, prefix)
        finally:
            store.close()


class PlainAsyncStore:
    """Mixin: :class:`PlainSyncStore` for :class:`AsyncRedisStore`."""

    @pytest_asyncio.fixture
    async def store(
        self, real_async_client: redis.asyncio.Redis, prefix: str
    ) -> AsyncIterator[Both]:
        store = AsyncRedisStore(real_async_client, Policy(prefix=prefix))
        store._evalsha = store._plain_evalsha  # type: ignore[method-assign]
        try:
            yield Both(store, prefix)
        finally:
            await store.aclose()


class AlwaysBatched(Batched):
    """:class:`Batched` that sends every call in a batch, even one made alone (as if another
    call were always in flight), and keeps each batch's size: the store contract then runs on
    the batched sending, not only on the call sent alone."""

    def __init__(self, client: Any) -> None:
        pack = evalsha_packer(client.connection_pool)
        assert pack is not None, "the batched kind runs only where the lean path applies"
        super().__init__(client, pack)
        self.sizes: list[int] = []
        self.calls = 0

    async def evalsha(self, sha: str, keys_and_args: tuple[str | bytes | int, ...]) -> Any:
        self.calls += 1
        loop = asyncio.get_running_loop()
        if self._state.loop is not loop:
            self._state = _LoopState(loop)
        state = self._state
        state.in_flight += 1
        try:
            return await Batched.evalsha(self, sha, keys_and_args)
        finally:
            state.in_flight -= 1

    async def _send(self, batch: list[Any]) -> None:
        self.sizes.append(len(batch))
        await Batched._send(self, batch)


class BatchedAsyncStore:
    """Mixin: ``store`` is an :class:`AsyncRedisStore` on the real server whose every script
    call goes out in a batch (:class:`AlwaysBatched`); the contract holds there too."""

    @pytest_asyncio.fixture
    async def store(
        self, real_async_client: redis.asyncio.Redis, prefix: str
    ) -> AsyncIterator[Both]:
        if not lean_eligible(real_async_client, asyncio=True):
            # The batched path is the lean path's (redis-py 8 or later): an older client, as
            # `nox -s lowest_core` installs, never batches.
            pytest.skip("the batched path needs the lean path (redis-py 8 or later)")
        store = AsyncRedisStore(real_async_client, Policy(prefix=prefix))
        batched = AlwaysBatched(real_async_client)
        store._evalsha = batched.evalsha  # type: ignore[method-assign]
        try:
            yield Both(store, prefix)
        finally:
            await store.aclose()
        assert sum(batched.sizes) == batched.calls  # every call was sent in a batch


class ValkeyPySyncStore:
    """Mixin: ``store`` is a :class:`RedisStore` on a ``valkey.Valkey`` client (valkey-py, the
    redis-py fork) on the real session server: the same contract as on redis-py."""

    @pytest.fixture
    def store(self, redis_url: str, prefix: str) -> Iterator[Both]:
        valkey = pytest.importorskip("valkey")  # the test extra has it; `nox -s minimal` not
        client = valkey.Valkey.from_url(redis_url)
        store = RedisStore(client, Policy(prefix=prefix))
        try:
            yield Both(store, prefix)
        finally:
            store.close()
            client.close()
            _purge_prefix(redis_url, prefix)


class ValkeyPyAsyncStore:
    """Mixin: ``store`` is an :class:`AsyncRedisStore` on a ``valkey.asyncio.Valkey`` client."""

    @pytest_asyncio.fixture
    async def store(self, redis_url: str, prefix: str) -> AsyncIterator[Both]:
        valkey = pytest.importorskip("valkey.asyncio")
        client = valkey.Valkey.from_url(redis_url)
        store = AsyncRedisStore(client, Policy(prefix=prefix))
        try:
            yield Both(store, prefix)
        finally:
            await store.aclose()
            await client.aclose()
            _purge_prefix(redis_url, prefix)


def glide_client_for(url: str) -> Any:
    """A coroutine making a ``glide.GlideClient`` on the server at ``url`` (skips the test when
    valkey-glide is not installed: the test extra has it)."""
    glide = pytest.importorskip("glide", reason="valkey-glide is not installed (idemkey[glide])")
    address = redis.connection.parse_url(url)
    config = glide.GlideClientConfiguration(
        [glide.NodeAddress(address.get("host", "127.0.0.1"), int(address.get("port", 6379)))],
        request_timeout=5000,
        database_id=int(address.get("db", 0)) or None,
    )
    return glide.GlideClient.create(config)


class GlideAsyncStore:
    """Mixin: ``store`` is an :class:`AsyncRedisStore` on a ``glide.GlideClient`` (valkey-glide,
    through ``idemkey/store/_glide.py``) on the real session server; raw reads go through
    ``real_async_client``."""

    @pytest_asyncio.fixture
    async def store(
        self, redis_url: str, real_async_client: redis.asyncio.Redis, prefix: str
    ) -> AsyncIterator[Both]:
        client = await glide_client_for(redis_url)
        store = AsyncRedisStore(client, Policy(prefix=prefix))
        try:
            yield Both(store, prefix, raw=real_async_client)
        finally:
            await store.aclose()
            await client.close()
