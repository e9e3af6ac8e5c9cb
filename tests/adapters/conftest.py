"""The adapter harness registry and the fixtures the shared suite runs on.

``HARNESSES`` maps a harness name to its factory (see ``tests/adapters/harness.py``). It is
filled from every ``tests/adapters/harness_*.py`` module that exports a ``HARNESSES`` dict of
its own: ``harness_wsgi`` (flask, wsgi, django) and ``harness_asgi`` (starlette, fastapi).
A harness module that exists but fails to import fails the run: no adapter silently drops out.

Each harness runs against the session's real Redis; the names in ``FAKEREDIS_HARNESSES`` run a
second time on fakeredis[lua], a fast extra layer (test ids ``[wsgi-fakeredis]``).
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio
import redis.asyncio

from idemkey import AsyncRedisStore, Policy
from tests.adapters.harness import GLIDE_SCHEME, VALKEY_PY_SCHEME, Harness, HarnessFactory

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator

HARNESSES: dict[str, HarnessFactory] = {}

for _module in sorted(
    info.name
    for info in pkgutil.iter_modules([str(Path(__file__).parent)])
    if info.name.startswith("harness_")
):
    HARNESSES.update(importlib.import_module(f"tests.adapters.{_module}").HARNESSES)

FAKEREDIS_HARNESSES = ("wsgi",)
# Run a second time on the real server through a valkey-py client (ids ``[wsgi-valkey-py]``):
# one sync and one asyncio adapter, the paths a valkey-py user's requests take.
VALKEY_PY_HARNESSES = ("wsgi", "starlette")
# And through a valkey-glide client (ids ``[starlette-glide]``): an asyncio adapter only, as
# glide's clients are asyncio.
GLIDE_HARNESSES = ("starlette",)

# Small limits so the size rows of the table are cheap to exercise.
SUITE_POLICY = {
    "max_request_bytes": 2048,
    "max_response_bytes": 2048,
    "lease": 2.0,
    "ttl": 60.0,
}

_PARAMS = [pytest.param((name, "redis"), id=name, marks=pytest.mark.redis) for name in HARNESSES]
_PARAMS += [
    pytest.param((name, "fakeredis"), id=f"{name}-fakeredis")
    for name in FAKEREDIS_HARNESSES
    if name in HARNESSES
]
_PARAMS += [
    pytest.param((name, "valkey-py"), id=f"{name}-valkey-py", marks=pytest.mark.redis)
    for name in VALKEY_PY_HARNESSES
    if name in HARNESSES
]
_PARAMS += [
    pytest.param((name, "glide"), id=f"{name}-glide", marks=pytest.mark.redis)
    for name in GLIDE_HARNESSES
    if name in HARNESSES
]


@pytest.fixture(params=_PARAMS)
def harness_kind(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(harness name, "redis", "valkey-py", "glide" or "fakeredis") of this run of a suite
    test."""
    kind: tuple[str, str] = request.param
    return kind


@pytest.fixture
def base_policy(prefix: str) -> Policy:
    """The suite's policy: small limits, this test's unique key prefix."""
    return Policy(prefix=prefix, **SUITE_POLICY)


@pytest.fixture
def make_harness(
    request: pytest.FixtureRequest, harness_kind: tuple[str, str], base_policy: Policy
) -> Iterator[Callable[..., Harness]]:
    """``make_harness(policy=None, *, redis_url=..., **policy_changes) -> Harness``.

    Builds this run's harness kind with ``base_policy`` (or ``policy``) plus ``policy_changes``.
    ``redis_url`` overrides the store's server (e.g. a dead one). Harnesses close at teardown.
    """
    name, backend = harness_kind
    default_url: str | None = None
    if backend in ("redis", "valkey-py", "glide"):
        default_url = request.getfixturevalue("redis_url")
    store_url = default_url
    if backend == "valkey-py" and default_url is not None:
        pytest.importorskip("valkey")  # the test extra has it; the nox floors' runs may not
        store_url = VALKEY_PY_SCHEME + default_url.split("://", 1)[1]
    if backend == "glide" and default_url is not None:
        pytest.importorskip("glide", reason="valkey-glide is not installed (idemkey[glide])")
        store_url = GLIDE_SCHEME + default_url.split("://", 1)[1]
    made: list[Harness] = []

    def make(policy: Policy | None = None, *, redis_url: Any = ..., **changes: Any) -> Harness:
        policy = (policy or base_policy).replace(**changes) if changes else policy or base_policy
        url = store_url if redis_url is ... else redis_url
        harness = HARNESSES[name](url, policy)
        made.append(harness)
        return harness

    try:
        yield make
    finally:
        for harness in made:
            harness.close()
        if default_url is not None:
            from tests.conftest import _purge_prefix

            _purge_prefix(default_url or "", base_policy.prefix)


@pytest.fixture
def harness(make_harness: Callable[..., Harness]) -> Harness:
    """This run's harness with the suite policy."""
    return make_harness()


@pytest_asyncio.fixture
async def asgi_store(
    async_client: redis.asyncio.Redis, prefix: str
) -> AsyncIterator[AsyncRedisStore]:
    """An :class:`AsyncRedisStore` with the default policy on the test's prefix."""
    store = AsyncRedisStore(async_client, Policy(prefix=prefix))
    try:
        yield store
    finally:
        await store.aclose()
