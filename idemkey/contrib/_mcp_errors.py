"""The tool errors of :mod:`idemkey.contrib.mcp`: what the agent is told, and what to do.

Each is a subclass of the SDK's ``ToolError``, which FastMCP sends as a tool error
(``isError``) whose text begins with the code, then says what to do, by phase: before the tool
ran (nothing ran: retry with the same key), after it ran with its outcome not recorded (it may
have run: retry with the same key later, never a new key), or a refusal. ``problem`` is the
HTTP problem code of the same case (docs/reference.md), where there is one.
"""

from __future__ import annotations

from mcp.server.fastmcp.exceptions import ToolError

from ..errors import (
    IdemkeyError,
    InvalidKeyError,
    JobDeadlineError,
    KeyReuseError,
    LeaseLostError,
    RequestInFlightError,
    ResultNotStorableError,
    StepAttemptsExhaustedError,
    StoreError,
)

__all__ = [
    "MAY_HAVE_RUN",
    "NOTHING_RAN",
    "IdempotencyToolError",
    "OutcomeUnknownToolError",
    "ResultNotKeptToolError",
    "StepsExhaustedToolError",
    "InFlightToolError",
    "InvalidKeyToolError",
    "KeyReusedToolError",
    "StoreUnavailableToolError",
]


class IdempotencyToolError(ToolError):
    """A tool call refused by idempotency; the text begins with ``code:``."""

    code = "idempotency_error"
    problem: str | None = None

    def __init__(self, message: str) -> None:
        super().__init__(f"{self.code}: {message}")


class KeyReusedToolError(IdempotencyToolError):
    """The key was used before with other arguments: the agent must pick a new key."""

    code = "idempotency_key_reused"
    problem = "key_reused"


class InFlightToolError(IdempotencyToolError):
    """The first call with this key still runs: retry with the same key after ``retry_after``."""

    code = "idempotency_key_in_flight"
    problem = "in_flight"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class InvalidKeyToolError(IdempotencyToolError):
    """The key is missing or malformed."""

    code = "idempotency_key_invalid"
    problem = "invalid_key"


class StoreUnavailableToolError(IdempotencyToolError):
    """Redis failed: nothing ran; retry with the same key."""

    code = "idempotency_store_unavailable"
    problem = "store_unavailable"


class OutcomeUnknownToolError(IdempotencyToolError):
    """The tool ran, but its outcome was not recorded (Redis failed when its result was being
    stored, or another executor took the call over): retry with the same key later."""

    code = "idempotency_outcome_unknown"


class StepsExhaustedToolError(IdempotencyToolError):
    """A step used all its attempts, or the job's ``deadline=`` passed; finished steps are kept."""

    code = "idempotency_steps_exhausted"


class ResultNotKeptToolError(IdempotencyToolError):
    """The call ran once, but its result could not be stored: a retry cannot get it."""

    code = "idempotency_result_not_kept"


NOTHING_RAN = "nothing ran: retry with the same idempotency key"
MAY_HAVE_RUN = (
    "the call may have run: retry with the same idempotency key later (its result is replayed "
    "once recorded), never with a new key"
)


def tool_error(exc: IdemkeyError, ran: bool) -> IdempotencyToolError | None:
    """What the agent is told for ``exc``; ``ran``: the tool's body had started."""
    if isinstance(exc, KeyReuseError):
        return KeyReusedToolError(
            "this idempotency key was already used with different arguments; "
            "use a new idempotency key for a different operation"
        )
    if isinstance(exc, RequestInFlightError):
        return InFlightToolError(
            "a call with this idempotency key is still running; retry with the same "
            f"idempotency key in {exc.retry_after:g} s",
            exc.retry_after,
        )
    if isinstance(exc, InvalidKeyError):
        return InvalidKeyToolError(exc.reason)
    if isinstance(exc, LeaseLostError):
        return OutcomeUnknownToolError(f"another executor took this call over; {MAY_HAVE_RUN}")
    if isinstance(exc, StoreError):
        if ran:
            return OutcomeUnknownToolError(
                f"the idempotency store failed when the result was being stored; {MAY_HAVE_RUN}"
            )
        return StoreUnavailableToolError(f"the idempotency store is unavailable; {NOTHING_RAN}")
    if isinstance(exc, (StepAttemptsExhaustedError, JobDeadlineError)):
        return StepsExhaustedToolError(
            f"{exc}; the finished steps are kept: retry with the same idempotency key to resume "
            "when the cause is fixed, never with a new key"
        )
    if isinstance(exc, ResultNotStorableError):
        return ResultNotKeptToolError(
            "the call ran once but its result could not be stored; do not retry it, and never "
            "with a new key (that would run it again)"
        )
    return None
