"""One attempt of a step under aguard; hand-written, twin of ``_sync_attempt``.

What a task and a thread do differently with a step function, and nothing else: a task can
await what it returned and cancel it at its timeout; a thread can do neither. The generated
``Steps`` imports ``_sync_attempt`` where ``AsyncSteps`` imports this module
(scripts/unasync.py maps ``_async_<name>`` to ``_sync_<name>``), so both export
:func:`run_attempt`. The rules of steps are in ``_steps`` (no I/O); the shell that calls this
is ``_async_steps``.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

from ._retry import _DEADLINE, attempt_deadline

__all__ = ["run_attempt"]


async def run_attempt(
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    timeout: float | None,
) -> Any:
    """One attempt of step ``name``: with a ``timeout``, a coroutine step is cancelled when it
    runs out (``TimeoutError``), and ``step_deadline()`` tells it how long it has."""
    if timeout is None:
        return await _result(fn(*args, **kwargs))
    token = attempt_deadline(time.monotonic() + timeout)
    try:
        return await asyncio.wait_for(_result(fn(*args, **kwargs)), timeout)
    except asyncio.TimeoutError as exc:  # not the builtin TimeoutError before Python 3.11
        raise TimeoutError(f"an attempt of step {name!r} ran out of {timeout:g} s") from exc
    finally:
        _DEADLINE.reset(token)


async def _result(value: Any) -> Any:
    """A step function may be a coroutine function: await what it returned."""
    return await value if inspect.isawaitable(value) else value
