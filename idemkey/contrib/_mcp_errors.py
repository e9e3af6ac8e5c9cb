"""The tool errors of :mod:`idemkey.contrib.mcp`: what the agent is told, and what to do.

Each is a subclass of the SDK's ``ToolError``, which FastMCP sends as a tool error
(``isError``) whose text begins with the code, then says what to do, by phase: before the tool
ran (nothing ran: retry with the same key), after it ran with its outcome not recorded (it may
have run: retry with the same key later, never a new key), or a refusal. ``problem`` is the
HTTP problem code of the same case (docs/reference/problems.md), where there is one.
"""

from __future__ import annotations

from mcp.server.fastmcp.exceptions import ToolError

from ..errors import (
    ConfigurationError,
    IdemkeyError,
    InvalidKeyError,
    JobDeadlineError,
    KeyReuseError,
    LeaseLostError,
    RecordFormatError,
    RequestInFlightError,
    ResultNotStorableError,
    StepAttemptsExhaustedError,
    StoredFailureError,
    StoreError,
)

__all__ = [
    "MAY_HAVE_RUN",
    "NOTHING_RAN",
    "arguments_unsupported",
    "ArgumentsUnsupportedToolError",
    "IdempotencyToolError",
    "OutcomeUnknownToolError",
    "ResultNotKeptToolError",
    "StepsExhaustedToolError",
    "InFlightToolError",
    "InvalidKeyToolError",
    "KeyReusedToolError",
    "RecordUnreadableToolError",
    "ResultOutdatedToolError",
    "StoreUnavailableToolError",
    "result_outdated",
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


class RecordUnreadableToolError(IdempotencyToolError):
    """The key's stored result cannot be read by this server (a newer release wrote it, or it
    is damaged): the call with this key ran before; retry with the same key later."""

    code = "idempotency_record_unreadable"
    problem = "record_unreadable"


class ArgumentsUnsupportedToolError(IdempotencyToolError):
    """The arguments cannot be fingerprinted (an integer beyond 64 bits): nothing ran, and the
    same arguments are refused under any key."""

    code = "idempotency_arguments_unsupported"


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


class ResultOutdatedToolError(IdempotencyToolError):
    """The call ran under an earlier version of the tool, whose stored result does not fit the
    tool's output schema now: it cannot be replayed, and the tool does not run again for the
    key. Not "retry later": no retry would get it."""

    code = "idempotency_result_outdated"


NOTHING_RAN = "nothing ran: retry with the same idempotency key"
#: How much of the stored text an outdated result's error passes on.
_OUTDATED_TEXT = 2000


def result_outdated(why: str, sent: str) -> ResultOutdatedToolError:
    """What the agent is told for a stored result the output schema refuses now (``why``:
    where), with ``sent``, the text blocks the call that ran sent (a replay would too)."""
    if len(sent) > _OUTDATED_TEXT:
        sent = sent[:_OUTDATED_TEXT] + " [...]"
    said = f"; what it sent then: {sent}" if sent else ""
    return ResultOutdatedToolError(
        "the call with this idempotency key ran under an earlier version of this tool, whose "
        f"result does not fit the tool's output schema now ({why}), so it cannot be replayed; "
        "the tool did not run again and will not for this key: do not retry it, and never "
        f"with a new key (that would run it again){said}"
    )


def arguments_unsupported(cause: BaseException) -> ArgumentsUnsupportedToolError:
    """What the agent is told for arguments the fingerprint cannot hold (``cause``: why)."""
    if isinstance(cause, OverflowError):
        # The fingerprint (msgpack) holds integers of 64 bits; msgspec raises OverflowError
        # for nothing else.
        return ArgumentsUnsupportedToolError(
            "an integer in the arguments is beyond 64 bits (-2**63 to 2**64 - 1), which the "
            "idempotency fingerprint cannot hold; nothing ran, and the same arguments are "
            "refused under any idempotency key: send integers within 64 bits"
        )
    return ArgumentsUnsupportedToolError(
        "the arguments cannot be fingerprinted for idempotency (a value in them has no JSON "
        "form); nothing ran, and the same arguments are refused under any idempotency key"
    )


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
    if isinstance(exc, (RecordFormatError, StoredFailureError)) and not ran:
        # A record Redis holds, which this server cannot read: Redis did not fail, and the
        # call with this key ran before, so "nothing ran" would invite a new key. A remembered
        # failure is one too: the integration never writes one (a newer release, another
        # writer, damage). Told without what the record holds: stored bytes are input, and
        # this text reaches the model.
        return RecordUnreadableToolError(
            "the stored result of this idempotency key cannot be read by this server (written "
            "by a newer release, or damaged); the tool did not run now, but the call with this "
            "key ran before: retry with the same idempotency key later, never with a new key "
            "(that would run it again)"
        )
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
    if isinstance(exc, ConfigurationError) and not ran and exc.__cause__ is not None:
        # The one ConfigurationError the guard raises for a call is the fingerprint's
        # (idemkey._codec.encode_payload): the arguments were valid JSON and valid for the
        # tool's schema, so it is the caller's input, told as such, not the server's setup.
        return arguments_unsupported(exc.__cause__)
    if isinstance(exc, ResultNotStorableError):
        return ResultNotKeptToolError(
            "the call ran once but its result could not be stored; do not retry it, and never "
            "with a new key (that would run it again)"
        )
    return None
