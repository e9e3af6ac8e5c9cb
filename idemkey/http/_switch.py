"""The process-wide switch behind :func:`idemkey.testing.disabled`.

Its own module so that :mod:`idemkey.http` can read it on every request without importing the
test kit (which imports fakeredis lazily, but is still more than one attribute lookup).
"""

from __future__ import annotations

import threading

__all__ = ["switch"]


class _Switch:
    """Off while at least one ``disabled()`` block is open, in any thread.

    Process-wide, not a context variable, on purpose: the app under test often runs in another
    thread (Starlette's TestClient, a live server) than the test that turned idemkey off.
    """

    __slots__ = ("_depth", "_lock", "disabled")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self.disabled = False

    def push(self) -> None:
        with self._lock:
            self._depth += 1
            self.disabled = True

    def pop(self) -> None:
        with self._lock:
            self._depth = max(0, self._depth - 1)
            self.disabled = self._depth > 0


switch = _Switch()
