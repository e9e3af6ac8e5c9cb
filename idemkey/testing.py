"""A test kit for your app's own tests: stores on an embedded Redis, a switch to turn idemkey off.

::

    from idemkey.testing import disabled, fake_async_store, fake_store

    store = fake_store()                    # a RedisStore on a fresh in-process fakeredis
    astore = fake_async_store(wait=1.0)     # an AsyncRedisStore; keywords are Policy fields

    with disabled():                        # every HTTP adapter passes requests straight through
        client.post("/charges", json=...)   # no key needed, nothing claimed or stored

The embedded server is fakeredis with its Lua engine (``pip install 'idemkey-redis[testing]'``),
which runs idemkey's real scripts in your process: no redis-server to start, and each store gets its
own empty server. It is a fast layer for your app's tests; idemkey itself is tested against a
real Redis. With pytest, ``pytest_plugins = ["idemkey.pytest_plugin"]`` in your ``conftest.py``
gives the fixtures ``idemkey_store``, ``idemkey_async_store`` and ``idemkey_disabled``.

:func:`disabled` turns idemkey off for the whole process while the block runs (the app under
test often runs in another thread than the test): the Flask, WSGI, ASGI, FastAPI, Starlette and
Django integrations then pass every request through to the handler as if they were not
installed. ``guard()`` and ``@idempotent`` are not affected: they are calls in your code.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast

from . import AsyncRedisStore, RedisStore
from ._options import derive, keyword, policy_options
from .errors import ConfigurationError
from .http._switch import switch
from .policy import Policy

__all__ = ["disabled", "fake_async_store", "fake_redis", "fake_store"]

_F = TypeVar("_F", bound=Callable[..., Any])


def fake_redis(*, asyncio: bool = False) -> Any:
    """A client on a fresh, empty in-process fakeredis server that runs Lua scripts.

    ``asyncio=True``: a ``FakeAsyncRedis`` (redis.asyncio API), else a ``FakeRedis``.
    Replies are bytes (``decode_responses=False``), as idemkey's stores need.
    """
    if importlib.util.find_spec("fakeredis") is None or importlib.util.find_spec("lupa") is None:
        raise ConfigurationError(
            "idemkey.testing needs fakeredis with Lua: pip install 'idemkey-redis[testing]'"
        )
    import fakeredis

    server = fakeredis.FakeServer()
    if asyncio:
        return fakeredis.FakeAsyncRedis(server=server, decode_responses=False)
    return fakeredis.FakeRedis(server=server, decode_responses=False)


def fake_store(policy: Policy | None = None, /, **changes: Any) -> RedisStore:
    """A :class:`~idemkey.RedisStore` on a fresh embedded server.

    ``policy`` (default ``Policy()``) with ``changes`` applied, e.g. ``fake_store(wait=1.0)``.
    """
    return RedisStore(fake_redis(), _policy(policy, changes, "fake_store"))


def fake_async_store(policy: Policy | None = None, /, **changes: Any) -> AsyncRedisStore:
    """An :class:`~idemkey.AsyncRedisStore` on a fresh embedded server (see :func:`fake_store`).

    Use it on one event loop, as any asyncio Redis client.
    """
    return AsyncRedisStore(fake_redis(asyncio=True), _policy(policy, changes, "fake_async_store"))


def disabled() -> _Disabled:
    """Turn idemkey's HTTP integrations off while the block runs, or while a decorated
    function's call runs (an ``async def``'s: until its coroutine is done).

    Every request then reaches the handler as if idemkey were not installed: no key is
    required, nothing is claimed, stored or replayed. Nested and concurrent blocks are counted:
    idemkey is on again when the last one exits.
    """
    return _Disabled()


class _Disabled:
    """What :func:`disabled` returns: a context manager, and a decorator of functions and
    coroutine functions. It holds no state, so one can be entered again, even while open."""

    __slots__ = ()

    def __enter__(self) -> None:
        switch.push()

    def __exit__(self, *exc_info: object) -> None:
        switch.pop()

    def __call__(self, func: _F) -> _F:
        if inspect.isasyncgenfunction(func) or inspect.isgeneratorfunction(func):
            # Calling one only makes the generator; its body runs later, as it is iterated,
            # after the decorated call has turned idemkey on again.
            raise ConfigurationError(
                f"@disabled() cannot hold idemkey off for a generator function "
                f"({getattr(func, '__qualname__', func)!r}): its body runs only as it is "
                "iterated, after the call; write `with disabled():` inside it (in a pytest "
                "fixture: around its yield), or use the idemkey_disabled fixture"
            )
        if inspect.iscoroutinefunction(func):
            # Calling it only makes the coroutine: the body runs in the await, held off too.
            @functools.wraps(func)
            async def off_while_awaited(*args: Any, **kwargs: Any) -> Any:
                with self:
                    return await func(*args, **kwargs)

            return cast(_F, off_while_awaited)

        @functools.wraps(func)
        def off_while_called(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return cast(_F, off_while_called)


def _policy(policy: Policy | None, changes: dict[str, Any], call: str) -> Policy:
    """``policy`` with ``changes`` through the one converter, errors naming ``call``."""
    base = policy if policy is not None else Policy()
    return derive(base, policy_options(changes, keyword(call)), call)
