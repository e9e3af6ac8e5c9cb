"""guard() / aguard(): run a block of plain Python code once per idempotency key.

::

    with guard(store, f"charge:{invoice.id}", payload=invoice_bytes) as call:
        if call.replayed:
            return call.result
        call.save(charge(invoice, fence=call.fence))

A ``with`` body cannot be skipped (PEP 377 was rejected), so the replay path is explicit:
``call.replayed`` and ``call.result``. ``save()`` only records the value; leaving the block
completes the record with it, even when the block raises afterwards (the work is done and
must not run twice). Leaving without ``save()``, or raising before it, releases the key so a
retry runs again.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from time import perf_counter
from types import TracebackType
from typing import Any, Generic, TypeVar, cast, overload

from ._codec import decode_value, encode_payload, encode_value
from ._core import (
    Claimed,
    Decision,
    InFlight,
    Mismatch,
    Record,
    Replay,
    new_owner,
    payload_fingerprint,
    record_for,
)
from .errors import (
    InvalidKeyError,
    KeyReuseError,
    LeaseLostError,
    RequestInFlightError,
    StoreError,
)
from .events import EventKind, report
from .policy import Policy
from .store import AsyncRedisStore, RedisStore, detach, uncancellable

__all__ = ["AsyncGuard", "Call", "Guard", "aguard", "current_call", "guard", "idempotent"]

T = TypeVar("T")
GUARD_METHOD = "GUARD"  # the record's "method" for guards: never equal to an HTTP method's record

_UNSET: Any = object()
_CURRENT: contextvars.ContextVar[Call[Any] | None] = contextvars.ContextVar(
    "idemkey_current_call", default=None
)


def current_call() -> Call[Any]:
    """The claimed call whose block (or ``@idempotent`` function) is running in this context.

    For code that cannot be handed the call, such as a function under ``@idempotent`` that
    fences its transaction (``idemkey.contrib.sqlalchemy.fenced(session, current_call())``).
    Raises ``LookupError`` outside a claimed block.
    """
    call = _CURRENT.get()
    if call is None:
        raise LookupError("no claimed idemkey call is running in this context")
    return call


class Call(Generic[T]):
    """What a guard yields: either a replay of the stored result, or a claim to do the work."""

    __slots__ = ("_result", "_saved", "fence", "record", "replayed", "takeover", "ttl_ms")

    def __init__(
        self,
        *,
        replayed: bool,
        result: Any = _UNSET,
        fence: int | None = None,
        takeover: bool = False,
        record: Record | None = None,
        ttl_ms: int | None = None,
    ) -> None:
        self.replayed = replayed
        #: The record's Redis names; its ``digest`` names it in SQL (``contrib.sqlalchemy``).
        self.record = record
        #: The record's retention, milliseconds.
        self.ttl_ms = ttl_ms
        #: Fencing token: grows with every takeover; pass it to downstream writes.
        self.fence = fence
        #: True when this claim took over from an executor whose lease lapsed.
        self.takeover = takeover
        self._result: Any = result
        self._saved: bytes | None = None

    @property
    def result(self) -> T:
        """The stored result of the first run (only when ``replayed``), or what was saved."""
        if self._result is _UNSET:
            raise AttributeError("no result: this call was not replayed and nothing was saved")
        return cast(T, self._result)

    def save(self, value: T) -> None:
        """Record the result; the record completes with it when the block exits."""
        if self.replayed:
            raise RuntimeError("cannot save() on a replayed call")
        self._saved = encode_value(value)
        self._result = value


class _GuardState(Generic[T]):
    """The I/O-free part of a guard: which record, which fingerprint, what a decision means."""

    def __init__(
        self,
        key: str,
        payload: object,
        scope: str,
        policy: Policy | None,
        result_type: Any,
        store_policy: Policy,
    ) -> None:
        if not isinstance(key, str) or not key:
            raise InvalidKeyError("a guard key must be a non-empty string")
        self.policy = policy if policy is not None else store_policy
        self.scope = scope
        self.record: Record = record_for(self.policy.prefix, scope, GUARD_METHOD, "", key)
        self.fingerprint = payload_fingerprint(encode_payload(payload))
        self.result_type = result_type
        self.claim: Claimed | None = None
        self.call: Call[T] | None = None
        self._current: contextvars.Token[Call[Any] | None] | None = None

    def enter(self, decision: Decision, seconds: float) -> Call[T]:
        """The Call for a claim or a replay; raises for a mismatch or a request in flight."""
        kind = type(decision)
        if kind is Claimed:
            claim = cast(Claimed, decision)
            self.claim = claim
            self.notify("takeover" if claim.takeover else "claimed", claim.fence, seconds=seconds)
            self.call = Call(
                replayed=False,
                fence=claim.fence,
                takeover=claim.takeover,
                record=self.record,
                ttl_ms=self.policy.ttl_ms,
            )
            self._current = _CURRENT.set(self.call)
            return self.call
        if kind is Replay:
            self.notify("replayed", seconds=seconds)
            value = decode_value(cast(Replay, decision).response, self.result_type)
            return Call(replayed=True, result=value)
        if kind is Mismatch:
            self.notify("mismatch", seconds=seconds)
            raise KeyReuseError()
        self.notify("in_flight", seconds=seconds)
        raise RequestInFlightError(cast(InFlight, decision).retry_after)

    @property
    def ttl_ms(self) -> int:
        return self.policy.ttl_ms

    def saved(self) -> bytes | None:
        """The saved result, if any; the block is left, so it is no longer the current call."""
        if self._current is not None:
            _CURRENT.reset(self._current)
            self._current = None
        return self.call._saved if self.call is not None else None

    def exited(
        self, done: bool, completing: bool, exc: BaseException | None, seconds: float
    ) -> None:
        """Report how leaving the block went; a lost lease raises unless the block raised."""
        fence = self.claim.fence if self.claim else None
        if not completing:
            if done:
                self.notify("released", fence, seconds=seconds)
            else:
                self.notify("lease_lost", fence, "another executor took the record over")
        elif done:
            self.notify("completed", fence, seconds=seconds)
        else:
            self.notify("lease_lost", fence, "another executor took the record over")
            if exc is None:
                raise LeaseLostError(fence)

    def store_failed(self, error: StoreError, exc: BaseException | None) -> None:
        """Redis failed while leaving the block: raise it, unless the block's own exception
        is already on its way out (that one is what the caller must see; ours is logged)."""
        self.notify("store_error", self.claim.fence if self.claim else None, str(error))
        if exc is None:
            raise error

    def notify(
        self,
        kind: EventKind,
        fence: int | None = None,
        detail: str = "",
        seconds: float | None = None,
    ) -> None:
        hook = self.policy.on_event
        report(hook, kind, self.record, self.scope, GUARD_METHOD, "", fence, detail, seconds)


class Guard(_GuardState[T]):
    """The context manager :func:`guard` returns."""

    def __init__(
        self,
        store: RedisStore,
        key: str,
        payload: object,
        scope: str,
        policy: Policy | None,
        result_type: Any,
    ) -> None:
        super().__init__(key, payload, scope, policy, result_type, store.policy)
        self.store = store

    def __enter__(self) -> Call[T]:
        policy, started = self.policy, perf_counter()
        try:
            decision = self.store.claim(
                self.record,
                self.fingerprint,
                lease_ms=policy.lease_ms,
                ttl_ms=policy.ttl_ms,
                wait=policy.wait,
            )
        except StoreError as error:
            self.notify("store_error", detail=str(error))
            raise
        return self.enter(decision, perf_counter() - started)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        claim, saved, started = self.claim, self.saved(), perf_counter()
        if claim is None:
            return
        try:
            if saved is None:
                done = self.store.release(self.record, claim.owner)
            else:
                done = self.store.complete(self.record, claim.owner, saved, ttl_ms=self.ttl_ms)
        except StoreError as error:
            self.store_failed(error, exc)
            return
        self.exited(done, saved is not None, exc, perf_counter() - started)


class AsyncGuard(_GuardState[T]):
    """The async context manager :func:`aguard` returns."""

    def __init__(
        self,
        store: AsyncRedisStore,
        key: str,
        payload: object,
        scope: str,
        policy: Policy | None,
        result_type: Any,
    ) -> None:
        super().__init__(key, payload, scope, policy, result_type, store.policy)
        self.store = store

    async def __aenter__(self) -> Call[T]:
        policy, started, owner = self.policy, perf_counter(), new_owner()
        try:
            decision = await self.store.claim(
                self.record,
                self.fingerprint,
                owner=owner,
                lease_ms=policy.lease_ms,
                ttl_ms=policy.ttl_ms,
                wait=policy.wait,
            )
        except StoreError as error:
            self.notify("store_error", detail=str(error))
            raise
        except asyncio.CancelledError:
            # Redis may have applied the claim before the cancel cut off its reply: free it, or
            # every retry would get RequestInFlightError until the lease lapsed. Not ours
            # (never claimed): the release script changes nothing.
            detach(self.store.release(self.record, owner))
            raise
        return self.enter(decision, perf_counter() - started)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        claim, saved, started = self.claim, self.saved(), perf_counter()
        if claim is None:
            return
        store, record, owner, ttl_ms = self.store, self.record, claim.owner, self.ttl_ms

        def write() -> Coroutine[Any, Any, bool]:
            if saved is None:
                return store.release(record, owner)
            return store.complete(record, owner, saved, ttl_ms=ttl_ms)

        try:
            # The caller may go away (a cancelled task) while this is on its way: the write is
            # finished all the same, or a retry would run the work again after the lease.
            done = await uncancellable(write)
        except StoreError as error:
            self.store_failed(error, exc)
            return
        self.exited(done, saved is not None, exc, perf_counter() - started)


# Overloads so that ``result_type=Receipt`` gives a ``Call[Receipt]`` and no result_type a
# ``Call[Any]``: with ``type[T] | Any`` alone, mypy cannot solve T and asks users to annotate.
@overload
def guard(
    store: RedisStore,
    key: str,
    *,
    payload: object = ...,
    scope: str = ...,
    policy: Policy | None = ...,
    result_type: type[T],
) -> Guard[T]: ...
@overload
def guard(
    store: RedisStore,
    key: str,
    *,
    payload: object = ...,
    scope: str = ...,
    policy: Policy | None = ...,
    result_type: Any = ...,
) -> Guard[Any]: ...
def guard(
    store: RedisStore,
    key: str,
    *,
    payload: object = b"",
    scope: str = "",
    policy: Policy | None = None,
    result_type: type[T] | Any = Any,
) -> Guard[T]:
    """Run a block once per ``key`` (within ``scope``); see the module docstring.

    ``payload`` identifies the work (bytes, str, or anything msgspec encodes): the same key
    with another payload raises :class:`KeyReuseError`. While the first call runs, others raise
    :class:`RequestInFlightError`, or wait up to ``policy.wait`` seconds for its result.
    ``result_type`` decodes a replayed result into that type (a Struct, a dataclass, ...).
    """
    return Guard(store, key, payload, scope, policy, result_type)


@overload
def aguard(
    store: AsyncRedisStore,
    key: str,
    *,
    payload: object = ...,
    scope: str = ...,
    policy: Policy | None = ...,
    result_type: type[T],
) -> AsyncGuard[T]: ...
@overload
def aguard(
    store: AsyncRedisStore,
    key: str,
    *,
    payload: object = ...,
    scope: str = ...,
    policy: Policy | None = ...,
    result_type: Any = ...,
) -> AsyncGuard[Any]: ...
def aguard(
    store: AsyncRedisStore,
    key: str,
    *,
    payload: object = b"",
    scope: str = "",
    policy: Policy | None = None,
    result_type: type[T] | Any = Any,
) -> AsyncGuard[T]:
    """The asyncio twin of :func:`guard`: ``async with aguard(store, key, ...) as call``."""
    return AsyncGuard(store, key, payload, scope, policy, result_type)


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
