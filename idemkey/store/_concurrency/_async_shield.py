"""What the async driver and guard do differently from the sync ones: outliving a cancellation.

A server cancels a request's task when its client leaves. The store writes that settle a record
(complete, release) must still happen, or the record stays in progress and a retry runs the
work again once the lease lapses. The sync twin (``_sync_shield``) has no cancellation to
outlive and just calls the write (an interrupted claim's release, there).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Coroutine
from typing import Any

from ._async_runtime import detach, finish

__all__ = ["settle_later"]


async def settle_later(write: Callable[[], Coroutine[Any, Any, Any]]) -> None:
    """Run ``write()`` to its end in a task of its own, and wait a moment for it (``finish``):
    the caller is being cancelled or interrupted. A coroutine being closed (GeneratorExit: its
    task was destroyed unfinished) cannot wait, so there the task is only started."""
    if isinstance(sys.exc_info()[1], GeneratorExit):
        detach(write())
    else:
        await finish(write())
