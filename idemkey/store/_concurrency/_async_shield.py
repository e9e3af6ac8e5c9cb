"""What the async driver does differently from the sync one: outliving a cancellation.

A server cancels a request's task when its client leaves. The store writes that settle a record
(complete, release) must still happen, or the record stays in progress and a retry runs the
work again once the lease lapses. The sync twin (``_sync_shield``) has no cancellation to
outlive and just calls the write.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from ._async_runtime import detach

__all__ = ["settle_later"]


def settle_later(write: Callable[[], Coroutine[Any, Any, Any]]) -> None:
    """Run ``write()`` to its end in a task of its own: the caller is being cancelled."""
    detach(write())
