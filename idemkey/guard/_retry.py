"""StepRetry: how ``call.step(..., retry=StepRetry(...))`` retries a failing step in place.

Only the rules, without I/O: which exception is retried, how long to wait before the next
attempt. The attempt count itself lives in the record (``a:<name>``, attempt.lua), so an
executor that takes a crashed one's record over continues its count instead of restarting it.
"""

from __future__ import annotations

import contextvars
import random
import time
from dataclasses import dataclass, field
from typing import Any, Final

from .._arguments import check_arguments
from .._options import seconds
from ..errors import ConfigurationError, IdemkeyError

__all__ = ["StepRetry", "attempt_deadline", "step_deadline"]

_Types = tuple[type[BaseException], ...]


def _exception_types(name: str, value: object) -> _Types:
    if isinstance(value, type):
        value = (value,)
    if not isinstance(value, tuple) or not all(
        isinstance(cls, type) and issubclass(cls, BaseException) for cls in value
    ):
        raise ConfigurationError(f"StepRetry({name}=) takes exception classes, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class StepRetry:
    """Retry a failing step in place, up to ``attempts`` attempts in all.

    * ``attempts``: attempts in all, the first included (1: no retry), counted in the record
      across executors: a takeover after a crash continues the count.
    * ``backoff``: seconds before the second attempt; each next wait is ``multiplier`` times
      longer, at most ``max_backoff``; ``jitter`` (a fraction, 0 to 1) spreads each wait at
      random by up to that much either way, so that many executors do not retry in step.
    * ``retry_on``: the exceptions retried (default: every ``Exception``); ``never``: those
      never retried even when ``retry_on`` matches (a declined card). idemkey's own errors
      (a lost lease, an unstorable result) and the step's ``cache_exceptions`` are never
      retried.
    * ``timeout``: seconds per attempt (None: unbounded). Under ``aguard`` the attempt is
      cancelled when it runs out and counts as failed with ``TimeoutError``; under ``guard``
      it is a cooperative deadline that ``step_deadline()`` hands to the step (see
      docs/steps.md).
    """

    attempts: int = 3
    backoff: float = 0.1
    multiplier: float = 2.0
    max_backoff: float = 10.0
    jitter: float = 0.1
    retry_on: _Types = (Exception,)
    never: _Types = ()
    timeout: float | None = None
    # Not an argument: ``dataclasses.replace`` would hand the copy this one's generator, and
    # two retries drawing from one generator share their jitter.
    _random: random.Random = field(
        default_factory=random.Random, init=False, repr=False, compare=False
    )

    def __new__(cls, *args: Any, **options: Any) -> StepRetry:
        # An unknown or repeated option is a ConfigurationError naming it, not the TypeError
        # of the generated __init__.
        check_arguments(cls, args, options)
        return object.__new__(cls)

    def __post_init__(self) -> None:
        if type(self.attempts) is not int or self.attempts < 1:
            raise ConfigurationError(f"StepRetry(attempts=) must be an int >= 1: {self.attempts!r}")
        # Durations through the one converter every option uses (a bool is no duration).
        for name in ("backoff", "max_backoff"):
            value = seconds(getattr(self, name), f"StepRetry({name}=)", positive=False)
            object.__setattr__(self, name, value)
        if self.timeout is not None:
            object.__setattr__(self, "timeout", seconds(self.timeout, "StepRetry(timeout=)"))
        multiplier, jitter = self.multiplier, self.jitter
        if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)):
            raise ConfigurationError(f"StepRetry(multiplier=) must be >= 1: {multiplier!r}")
        if not 1 <= multiplier < 1e6:
            raise ConfigurationError(f"StepRetry(multiplier=) must be >= 1: {multiplier!r}")
        if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not 0 <= jitter <= 1:
            raise ConfigurationError(f"StepRetry(jitter=) must be within 0..1: {jitter!r}")
        object.__setattr__(self, "retry_on", _exception_types("retry_on", self.retry_on))
        object.__setattr__(self, "never", _exception_types("never", self.never))

    def retries(self, exc: BaseException, cached: tuple[type[BaseException], ...]) -> bool:
        """Whether an attempt that raised ``exc`` is followed by another (attempts allowing)."""
        if isinstance(exc, IdemkeyError) or (cached and isinstance(exc, cached)):
            return False
        return isinstance(exc, self.retry_on) and not isinstance(exc, self.never)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after attempt number ``attempt`` (1-based) failed."""
        try:
            grown = self.backoff * self.multiplier ** (attempt - 1)
        except OverflowError:  # a float power past ~1e308 raises instead of giving inf
            grown = float("inf")
        base = min(grown, self.max_backoff)
        if self.jitter:
            base *= 1 + self.jitter * self._random.uniform(-1.0, 1.0)
        return max(0.0, base)


#: The attempt that runs now: its deadline (``time.monotonic()``), None when it has none.
_DEADLINE: Final[contextvars.ContextVar[float | None]] = contextvars.ContextVar(
    "idemkey_step_deadline", default=None
)

#: Set the running attempt's deadline (a token for ``reset``).
attempt_deadline: Final = _DEADLINE.set


def step_deadline() -> float | None:
    """Seconds left for the step attempt that runs now (``StepRetry(timeout=)``), at least 0;
    None outside a step or when it has no timeout. A sync step hands it to its own I/O (a
    socket or HTTP timeout): under ``guard`` nothing interrupts it."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())
