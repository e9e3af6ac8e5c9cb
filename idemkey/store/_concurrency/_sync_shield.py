"""The sync side of ``_async_shield``: without an event loop there is no cancellation to
outlive, so a settling write simply runs now, in the caller's thread."""

from __future__ import annotations

from collections.abc import Callable

from ...events import logger

__all__ = ["settle_later"]


def settle_later(write: Callable[[], object]) -> None:
    """Run ``write()`` now; the caller is unwinding from an interruption (KeyboardInterrupt,
    a gevent timeout), so an error here is logged rather than raised over it."""
    try:
        write()
    except Exception as exc:
        logger.warning("idemkey could not finish a write cut off by an interruption: %s", exc)
