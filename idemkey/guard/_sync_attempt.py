"""One attempt of a step under guard; hand-written, twin of ``_async_attempt``.

A thread can neither await what a step function returned nor interrupt it: a coroutine is
refused, and a timeout is a cooperative deadline the step reads with ``step_deadline()`` (see
docs/steps.md). Exports :func:`run_attempt`, as its twin does, for the generated ``Steps``.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

from ..errors import UsageError
from ._retry import _DEADLINE, attempt_deadline

__all__ = ["run_attempt"]


def run_attempt(
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    timeout: float | None,
) -> Any:
    """One attempt of step ``name``: a ``timeout`` is a deadline the step reads with
    ``step_deadline()``; nothing interrupts a thread."""
    if timeout is None:
        return _result(name, fn(*args, **kwargs))
    token = attempt_deadline(time.monotonic() + timeout)
    try:
        return _result(name, fn(*args, **kwargs))
    finally:
        _DEADLINE.reset(token)


def _result(name: str, value: Any) -> Any:
    """Nothing can await a step's coroutine here: refuse it (closed, so Python does not warn
    that it was never awaited)."""
    if inspect.isawaitable(value):
        close = getattr(value, "close", None)
        if close is not None:
            close()
        raise UsageError(f"step {name!r} returned an awaitable: use aguard for async steps")
    return value
