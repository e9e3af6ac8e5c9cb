"""@idempotent: make a function (sync or async) run once per key, for queue workers.

It picks :func:`guard` or :func:`aguard` by the function's kind; everything else is theirs.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast, overload

from ..policy import Policy
from ..store import AsyncRedisStore, RedisStore
from ._async_guard import aguard
from ._sync_guard import guard

__all__ = ["idempotent"]

F = TypeVar("F", bound=Callable[..., Any])


@overload
def idempotent(
    store: RedisStore,
    *,
    key: Callable[..., str],
    payload: Callable[..., object] | None = ...,
    scope: str = ...,
    policy: Policy | None = ...,
    result_type: Any = ...,
) -> Callable[[F], F]: ...
@overload
def idempotent(
    store: AsyncRedisStore,
    *,
    key: Callable[..., str],
    payload: Callable[..., object] | None = ...,
    scope: str = ...,
    policy: Policy | None = ...,
    result_type: Any = ...,
) -> Callable[[F], F]: ...
def idempotent(
    store: RedisStore | AsyncRedisStore,
    *,
    key: Callable[..., str],
    payload: Callable[..., object] | None = None,
    scope: str = "",
    policy: Policy | None = None,
    result_type: Any = Any,
) -> Callable[[F], F]:
    """Make a function (sync or async) run once per key, for queue workers::

        @idempotent(store, key=lambda invoice: f"charge:{invoice.id}")
        def charge(invoice): ...

    ``key`` and ``payload`` receive the call's arguments. The payload defaults to the arguments
    themselves, bound to the function's parameters (so ``f(1, amount=5)`` and ``f(1, 5)`` are the
    same call; they must then be msgspec-encodable). A repeat call returns the stored result.
    """

    def decorate(func: F) -> F:
        signature = inspect.signature(func)

        def identify(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, object]:
            if payload is not None:
                data = payload(*args, **kwargs)
            else:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                data = bound.arguments
            return key(*args, **kwargs), data

        if inspect.iscoroutinefunction(func):
            if not isinstance(store, AsyncRedisStore):
                raise TypeError("an async function needs an AsyncRedisStore")
            astore = store

            @functools.wraps(func)
            async def arun(*args: Any, **kwargs: Any) -> Any:
                call_key, data = identify(args, kwargs)
                async with aguard(
                    astore,
                    call_key,
                    payload=data,
                    scope=scope,
                    policy=policy,
                    result_type=result_type,
                ) as call:
                    if call.replayed:
                        return call.result
                    result = await cast(Callable[..., Awaitable[Any]], func)(*args, **kwargs)
                    call.save(result)
                    return result

            return cast(F, arun)
        if not isinstance(store, RedisStore):
            raise TypeError("a sync function needs a RedisStore")
        sstore = store

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            call_key, data = identify(args, kwargs)
            with guard(
                sstore, call_key, payload=data, scope=scope, policy=policy, result_type=result_type
            ) as call:
                if call.replayed:
                    return call.result
                result = func(*args, **kwargs)
                call.save(result)
                return result

        return cast(F, run)

    return decorate
