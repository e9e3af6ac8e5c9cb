"""@idempotent: make a function (sync or async) run once per key, for queue workers.

It picks :func:`guard` or :func:`aguard` by the function's kind; everything else is theirs.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, ParamSpec, TypeVar, cast, overload

import msgspec

from ..errors import ConfigurationError
from ..policy import Policy
from ..store import AsyncRedisStore, RedisStore
from ._async_guard import AsyncGuard
from ._failures import rules_for
from ._policy_check import check_guard_policy
from ._state import decodable
from ._sync_guard import Guard

__all__ = ["Outcome", "idempotent"]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """What a function decorated with ``@idempotent(..., outcome=True)`` returns: its
    ``result``, and whether it was ``replayed`` (the stored result of an earlier run, the
    function not run again) or produced by this call."""

    result: T
    replayed: bool


@overload
def idempotent(
    store: RedisStore,
    *,
    key: Callable[..., str],
    payload: Callable[..., object] | None = ...,
    scope: str = ...,
    policy: Policy | None = ...,
    result_type: Any = ...,
    name: str | None = ...,
    outcome: Literal[False] = ...,
    cache_exceptions: object = ...,
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
    name: str | None = ...,
    outcome: Literal[False] = ...,
    cache_exceptions: object = ...,
) -> Callable[[F], F]: ...
@overload
def idempotent(
    store: RedisStore,
    *,
    key: Callable[..., str],
    payload: Callable[..., object] | None = ...,
    scope: str = ...,
    policy: Policy | None = ...,
    result_type: Any = ...,
    name: str | None = ...,
    outcome: Literal[True],
    cache_exceptions: object = ...,
) -> Callable[[Callable[P, R]], Callable[P, Outcome[R]]]: ...
@overload
def idempotent(
    store: AsyncRedisStore,
    *,
    key: Callable[..., str],
    payload: Callable[..., object] | None = ...,
    scope: str = ...,
    policy: Policy | None = ...,
    result_type: Any = ...,
    name: str | None = ...,
    outcome: Literal[True],
    cache_exceptions: object = ...,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[Outcome[R]]]]: ...
def idempotent(
    store: RedisStore | AsyncRedisStore,
    *,
    key: Callable[..., str],
    payload: Callable[..., object] | None = None,
    scope: str = "",
    policy: Policy | None = None,
    result_type: Any = Any,
    name: str | None = None,
    outcome: bool = False,
    cache_exceptions: object = (),
) -> Callable[[Any], Any]:
    """Make a function (sync or async) run once per key, for queue workers::

        @idempotent(store, key=lambda invoice: f"charge:{invoice.id}")
        def charge(invoice): ...

    ``key`` and ``payload`` receive the call's arguments. The payload defaults to the arguments
    themselves, bound to the function's parameters (so ``f(1, amount=5)`` and ``f(1, 5)`` are the
    same call; they must then be msgspec-encodable), leaving out a method's ``self`` or ``cls``.
    A repeat call returns the stored result, decoded as ``result_type``, which defaults to the
    function's return annotation (so a dataclass, tuple or ``datetime`` comes back as one).

    Each function has records of its own: ``name`` (default: ``module.qualname``) is part of
    every record, so two functions never share one, whatever their keys. Pass the old name
    when you rename or move a function whose records must still be replayed. A function made
    inside another (a closure, a method of a local class), a lambda, a ``functools.partial``
    or a callable object needs ``name=``: its qualname names no one function (two closures of
    one factory share it), or it has none; :class:`ConfigurationError` says so here.

    A generator function (sync or async) raises :class:`ConfigurationError` here: calling it
    only makes the generator, whose body runs later, as it is iterated, outside the guard.

    ``outcome=True``: the function returns an :class:`Outcome` instead, the result with
    whether it was a replay (an awaitable of one for an async function).
    ``cache_exceptions`` (classes, or a mapping of class to field names) are deterministic
    failures: the first one raised is stored as the outcome, and every repeat call raises it
    again without running the function (see docs/steps.md, "Remembered failures").
    """

    if not callable(key) or (payload is not None and not callable(payload)):
        raise ConfigurationError("key= and payload= take functions of the call's arguments")
    # Every argument fails here, at decoration, not at the first call (result_type=5 ran the
    # work and stored it, then every retry raised).
    _check_arguments(store, name, scope, policy, result_type, outcome)
    rules_for(cache_exceptions)

    def decorate(func: F) -> F:
        kind = _generator_kind(func)
        if kind is not None:
            # Calling one only makes the generator: its body runs later, as it is iterated,
            # outside the guard, and the generator itself is no result to store.
            raise ConfigurationError(
                f"@idempotent cannot guard {kind} function ({_shown(func)}): its body "
                "runs only as the generator is iterated, after the guard has ended; return a "
                "list instead, or iterate it inside guard()/aguard()"
            )
        record_name = name if name is not None else _record_name(func)
        signature = inspect.signature(func)
        leave_out = _bound_receiver(signature)
        decode_as = result_type if result_type is not Any else _return_type(func)

        def identify(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, object]:
            if payload is not None:
                data = payload(*args, **kwargs)
            else:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                data = bound.arguments
                if leave_out is not None:
                    del data[leave_out]
            return key(*args, **kwargs), data

        if inspect.iscoroutinefunction(func):
            if not isinstance(store, AsyncRedisStore):
                raise ConfigurationError("an async function needs an AsyncRedisStore")
            astore = store

            @functools.wraps(func)
            async def arun(*args: Any, **kwargs: Any) -> Any:
                call_key, data = identify(args, kwargs)
                guarded: AsyncGuard[Any] = AsyncGuard(
                    astore, call_key, data, scope, policy, decode_as, record_name, cache_exceptions
                )
                async with guarded as call:
                    if call.replayed:
                        return Outcome(call.result, True) if outcome else call.result
                    result = await cast(Callable[..., Awaitable[Any]], func)(*args, **kwargs)
                    call.save(result)
                    return Outcome(result, False) if outcome else result

            return cast(F, arun)
        if not isinstance(store, RedisStore):
            raise ConfigurationError("a sync function needs a RedisStore")
        sstore = store

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            call_key, data = identify(args, kwargs)
            guarded: Guard[Any] = Guard(
                sstore, call_key, data, scope, policy, decode_as, record_name, cache_exceptions
            )
            with guarded as call:
                if call.replayed:
                    return Outcome(call.result, True) if outcome else call.result
                result = func(*args, **kwargs)
                call.save(result)
                return Outcome(result, False) if outcome else result

        return cast(F, run)

    return decorate


def _check_arguments(
    store: object, name: object, scope: object, policy: object, result_type: Any, outcome: object
) -> None:
    if name is not None and (not isinstance(name, str) or not name):
        raise ConfigurationError(
            f"@idempotent(name=...): expected a non-empty string naming the function's records, "
            f"got {name!r:.60}"
        )
    if not isinstance(scope, str):
        raise ConfigurationError(f"@idempotent(scope=...): expected a str, got {scope!r:.60}")
    if policy is not None:
        if not isinstance(policy, Policy):
            raise ConfigurationError(
                f"@idempotent(policy=...): expected a Policy or None, got {policy!r:.60}"
            )
        if isinstance(store, (RedisStore, AsyncRedisStore)):
            check_guard_policy(policy, store.policy)
    if result_type is not Any:
        decodable(result_type)  # the guards' own check, cached per type
    if not isinstance(outcome, bool):
        raise ConfigurationError(
            f"@idempotent(outcome=...): expected True or False, got {outcome!r:.60}"
        )


def _shown(func: Callable[..., Any]) -> str:
    return getattr(func, "__qualname__", None) or f"{func!r:.80}"


def _record_name(func: Callable[..., Any]) -> str:
    """``module.qualname``, the record name of a function that names one function only."""
    module, qualname = getattr(func, "__module__", None), getattr(func, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise ConfigurationError(
            f"@idempotent needs name= for {func!r:.80}: it has no module and qualified name "
            "to name its records by (a functools.partial or a callable object); pass "
            "name=, a stable name of your choosing"
        )
    if "<locals>" in qualname or "<lambda>" in qualname:
        # Every closure one factory makes has this qualname, and so would share records: a
        # record name must identify one function, in every process.
        raise ConfigurationError(
            f"@idempotent needs name= for {module}.{qualname}: a function made inside another "
            "(or a lambda) shares that name with every other made there, and they would "
            "share records; pass name=, a stable name of your choosing, one per function"
        )
    return f"{module}.{qualname}"


def _generator_kind(func: Callable[..., Any]) -> str | None:
    """Which kind of generator function ``func`` is ("a generator", "an async generator"), or
    None for any other function."""
    if inspect.isasyncgenfunction(func):
        return "an async generator"
    if inspect.isgeneratorfunction(func):
        return "a generator"
    return None


def _bound_receiver(signature: inspect.Signature) -> str | None:
    """The name of a method's ``self`` or ``cls`` parameter, which the payload leaves out: it
    is the object the method runs on, not the work's input (and rarely encodable)."""
    first = next(iter(signature.parameters.values()), None)
    if first is not None and first.name in ("self", "cls") and first.kind in _POSITIONAL:
        return first.name
    return None


_POSITIONAL: Final = (
    inspect.Parameter.POSITIONAL_ONLY,
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
)


def _return_type(func: Callable[..., Any]) -> Any:
    """The function's return annotation when msgspec can decode into it, else ``Any``."""
    try:
        hint = typing.get_type_hints(func).get("return", Any)
        msgspec.msgpack.Decoder(hint)
    except Exception:  # an unresolvable annotation, or a type msgspec does not decode
        return Any
    return hint
