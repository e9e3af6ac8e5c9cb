"""The tool errors of :mod:`idemkey.contrib.mcp`: what the agent is told, and what to do.

Each is a subclass of the SDK's ``ToolError``, which FastMCP sends as a tool error
(``isError``) whose text begins with the code.
"""

from __future__ import annotations

from mcp.server.fastmcp.exceptions import ToolError

__all__ = [
    "IdempotencyToolError",
    "InFlightToolError",
    "InvalidKeyToolError",
    "KeyReusedToolError",
    "StoreUnavailableToolError",
]


class IdempotencyToolError(ToolError):
    """A tool call refused by idempotency; the text begins with ``code:``."""

    code = "idempotency_error"

    def __init__(self, message: str) -> None:
        super().__init__(f"{self.code}: {message}")


class KeyReusedToolError(IdempotencyToolError):
    """The key was used before with other arguments: the agent must pick a new key."""

    code = "idempotency_key_reused"


class InFlightToolError(IdempotencyToolError):
    """The first call with this key still runs: retry with the same key after ``retry_after``."""

    code = "idempotency_key_in_flight"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class InvalidKeyToolError(IdempotencyToolError):
    """The key is missing or malformed."""

    code = "idempotency_key_invalid"


class StoreUnavailableToolError(IdempotencyToolError):
    """Redis failed: nothing ran; retry with the same key."""

    code = "idempotency_store_unavailable"
