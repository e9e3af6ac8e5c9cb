"""The demo's own errors: it cannot start. The CLI turns them into its one-line messages."""

from __future__ import annotations

from ...errors import IdemkeyError

__all__ = ["DemoError", "ListenError", "MissingPackageError"]


class DemoError(IdemkeyError):
    """The demo app cannot run."""


class MissingPackageError(DemoError):
    """An optional package the demo needs is not installed (a setup problem, not a failure)."""


class ListenError(DemoError):
    """The demo server cannot listen on the address it was given (a busy port, say)."""
