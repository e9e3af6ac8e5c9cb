"""The console page's refresh interval, checked once: for ``idemkey console --refresh``,
its :func:`~idemkey.cli.console.run` and ``idemkey.console.create_app(refresh=)``.

Here, not in ``idemkey.console`` (which needs Starlette to import) nor in the ``console``
command (which imports ``idemkey.console``): both import this module, and it imports neither.
"""

from __future__ import annotations

from typing import Final

from ..errors import ConfigurationError

__all__ = ["MAX_REFRESH", "MIN_REFRESH", "refresh_seconds"]

#: The page's refresh interval, in seconds: each refresh scans the prefix once, so not more
#: often than twice a second; and at most a day, well inside a browser's timers, which hold
#: 2**31 - 1 ms (24.8 days): a longer ``setInterval`` overflows and fires every few
#: milliseconds, a SCAN of the prefix each time.
MIN_REFRESH: Final = 0.5
MAX_REFRESH: Final = 86_400.0


def refresh_seconds(value: object, name: str = "refresh") -> float:
    """``value`` as the page's refresh interval in seconds, or a :class:`ConfigurationError`
    naming the range (:data:`MIN_REFRESH` to :data:`MAX_REFRESH`; not NaN, not infinity)."""
    if (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and MIN_REFRESH <= value <= MAX_REFRESH  # never NaN
    ):
        return float(value)
    shown = f"{MIN_REFRESH:g} and {MAX_REFRESH:g} seconds (a day)"
    raise ConfigurationError(f"{name} must be between {shown}, got {value!r}")
