"""AsyncSteps: the I/O shell of recovery points (``call.step``) under aguard.

One text for both guards: the async file is the source, and scripts/unasync.py writes the sync
one (``Steps``, for guard) from it. Every rule is in :class:`idemkey._steps.StepBook`; this
moves bytes between it, the step function and the store.
"""

# unasync: generates _sync_steps.py
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._codec import decode_value, encode_value
from .._core import Claimed, Record
from .._steps import StepBook, _async_result, step_field, step_key
from ..errors import ConfigurationError, StepNotStorableError
from ..store import AsyncRedisStore
from ..store._concurrency._async_runtime import uncancellable

__all__ = ["AsyncSteps"]


class AsyncSteps:
    """Runs the steps of one call: claimed (checkpointed), or unprotected (``claim`` None:
    Redis failed and ``on_store_error="open"`` runs the block anyway, storing nothing)."""

    __slots__ = ("book", "key", "owner", "record", "store")

    def __init__(
        self, store: AsyncRedisStore, record: Record, claim: Claimed | None, key: str
    ) -> None:
        self.store = store
        self.record = record
        self.key = key
        self.owner = claim.owner if claim is not None else None
        self.book = StepBook(claim.fence if claim else None, claim.steps if claim else ())

    def step_key(self, name: str) -> str:
        return step_key(self.record.digest, name)

    async def run(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        book = self.book
        stored = book.begin(name)
        if stored is not None:
            return decode_value(stored)
        try:
            value = await _async_result(name, fn(*args, **kwargs))
            try:
                encoded = encode_value(value)
            except ConfigurationError as exc:
                # Refused before it counts as finished: a retry runs the step again.
                raise StepNotStorableError(self.key, name, str(exc.__cause__ or exc)) from exc
            owner, field = self.owner, step_field(name)
            if owner is None:
                stored = encoded  # unprotected: nothing is stored
            else:
                # The step's work is done: a cancelled caller must not keep its checkpoint
                # from Redis (a retry would run it again).
                stored = await uncancellable(
                    lambda: self.store.checkpoint(self.record, owner, field, encoded)
                )
        except BaseException:
            book.abandon(name)
            raise
        if stored is None:
            raise book.lose(name)
        book.finish(name, stored)
        # What a resume would return: the same value whether the step ran now or before.
        return decode_value(stored)
