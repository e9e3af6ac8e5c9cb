"""The I/O shells of recovery points: run a step, or return its stored result.

Every rule is in :class:`idemkey._steps.StepBook`; these move bytes between it, the step
function and the store. ``Steps`` serves ``guard`` (the function runs in the caller's thread),
``AsyncSteps`` serves ``aguard`` (the function may be sync or async).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ._codec import decode_value, encode_value
from ._core import Claimed, Record
from ._steps import StepBook, step_field, step_key
from .store import AsyncRedisStore, RedisStore, uncancellable

__all__ = ["AsyncSteps", "Steps"]


class _StepsBase:
    __slots__ = ("book", "owner", "record")

    def __init__(self, record: Record, claim: Claimed) -> None:
        self.record = record
        self.owner = claim.owner
        self.book = StepBook(claim.fence, claim.steps)

    def key(self, name: str) -> str:
        return step_key(self.record.digest, name)


class Steps(_StepsBase):
    __slots__ = ("store",)

    def __init__(self, store: RedisStore, record: Record, claim: Claimed) -> None:
        super().__init__(record, claim)
        self.store = store

    def run(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        book = self.book
        stored = book.begin(name)
        if stored is not None:
            return decode_value(stored)
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                # Never awaited here: close it, or Python warns it was never awaited.
                close = getattr(value, "close", None)
                if close is not None:
                    close()
                raise TypeError(f"step {name!r} returned an awaitable: use aguard for async steps")
            # An unstorable result raises ConfigurationError here: the step does not count as
            # finished, and a retry runs it again.
            encoded = encode_value(value)
            stored = self.store.checkpoint(self.record, self.owner, step_field(name), encoded)
        except BaseException:
            book.abandon(name)
            raise
        if stored is None:
            raise book.lose(name)
        book.finish(name, stored)
        # What a resume would return: the same value whether the step ran now or before.
        return decode_value(stored)


class AsyncSteps(_StepsBase):
    __slots__ = ("store",)

    def __init__(self, store: AsyncRedisStore, record: Record, claim: Claimed) -> None:
        super().__init__(record, claim)
        self.store = store

    async def run(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        book = self.book
        stored = book.begin(name)
        if stored is not None:
            return decode_value(stored)
        store, record, owner, field = self.store, self.record, self.owner, step_field(name)
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
            encoded = encode_value(value)
            # The step's work is done: a cancellation must not keep its checkpoint from Redis
            # (a retry would run it again).
            stored = await uncancellable(lambda: store.checkpoint(record, owner, field, encoded))
        except BaseException:
            book.abandon(name)
            raise
        if stored is None:
            raise book.lose(name)
        book.finish(name, stored)
        return decode_value(stored)
