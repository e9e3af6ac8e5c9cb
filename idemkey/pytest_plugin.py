"""pytest fixtures for testing an app that uses idemkey; enable it in your ``conftest.py``::

    pytest_plugins = ["idemkey.pytest_plugin"]

* ``idemkey_store``: a :class:`~idemkey.RedisStore` on a fresh embedded fakeredis (with Lua),
  closed after the test.
* ``idemkey_async_store``: its :class:`~idemkey.AsyncRedisStore` twin (use it on the test's
  event loop).
* ``idemkey_disabled``: idemkey's HTTP integrations are off for the test (see
  :func:`idemkey.testing.disabled`); or mark a test ``@pytest.mark.idemkey_disabled``.

Not registered automatically: a test suite opts in, so installing idemkey never changes
anyone else's pytest run.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import AsyncRedisStore, RedisStore
from .testing import disabled, fake_async_store, fake_store

__all__ = ["idemkey_async_store", "idemkey_disabled", "idemkey_store"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "idemkey_disabled: idemkey's HTTP integrations are off during this test"
    )


@pytest.fixture
def idemkey_store() -> Iterator[RedisStore]:
    """A RedisStore on a fresh embedded fakeredis server with Lua."""
    store = fake_store()
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def idemkey_async_store() -> AsyncRedisStore:
    """An AsyncRedisStore on a fresh embedded fakeredis server with Lua.

    A plain fixture, so it works with any async test runner; its heartbeat task (if a claim
    started one) belongs to the test's loop and ends with it.
    """
    return fake_async_store()


@pytest.fixture
def idemkey_disabled() -> Iterator[None]:
    """idemkey's HTTP integrations pass every request through during the test."""
    with disabled():
        yield


@pytest.fixture(autouse=True)
def _idemkey_disabled_marker(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("idemkey_disabled") is None:
        yield
        return
    with disabled():
        yield
