"""Progress of a SCAN over a whole keyspace, on stderr: ``idemkey stats`` and ``idemkey list``."""

from __future__ import annotations

import sys
import time

__all__ = ["LOG_SECONDS", "Progress", "THRESHOLD", "EVERY"]

#: Progress is printed only when the database holds at least this many keys.
THRESHOLD = 10_000
#: A line every this many keys looked at.
EVERY = 10_000
#: At most one line per this many seconds when stderr is not a terminal (a log file).
LOG_SECONDS = 2.0


class Progress:
    """Progress lines on stderr, only for large keyspaces; ``\\r`` on a terminal."""

    def __init__(self, total: int, enabled: bool, command: str = "stats") -> None:
        self.enabled = enabled and total >= THRESHOLD
        self.total = total
        self.command = command
        self.scanned = self.records = 0
        self.tty = sys.stderr.isatty()
        self.next = EVERY
        self.last = -1e9

    def update(self, scanned: int, records: int) -> None:
        if not self.enabled or scanned < self.next:
            return
        now = time.monotonic()
        if not self.tty and now - self.last < LOG_SECONDS:
            return  # a log file gets a line every few seconds, not one per SCAN page
        self.next, self.last = scanned + EVERY, now
        line = f"idemkey {self.command}: scanned {scanned}/{self.total} keys, {records} records"
        sys.stderr.write(("\r" + line) if self.tty else line + "\n")
        sys.stderr.flush()

    def keys(self, looked_at: int, records: int = 0) -> None:
        """A SCAN page looked at ``looked_at`` keys and gave ``records`` records."""
        self.scanned += looked_at
        self.records += records
        self.update(min(self.scanned, self.total), self.records)

    def done(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")
