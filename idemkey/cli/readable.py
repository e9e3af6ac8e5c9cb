"""Human-readable durations, sizes, times and previews: the commands' text output, and the
console's page (``compact_seconds``, ``utc_time``), so a lease reads the same in both and a
stored time past what a date holds fails neither."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Final

__all__ = [
    "NOT_A_DATE",
    "PREVIEW_BYTES",
    "compact_seconds",
    "duration",
    "preview",
    "shown",
    "shorten",
    "size",
    "utc_time",
]

PREVIEW_BYTES: Final = 120
#: How a stored time past what a date holds is shown (the JSON keeps the number).
NOT_A_DATE: Final = "(not a date)"


def duration(ms: int) -> str:
    """A PTTL as ``1d 2h 3m 4.5s``; negative answers mean none / no TTL."""
    if ms == -2:
        return "none"
    if ms == -1:
        return "no TTL (never expires)"
    seconds = ms / 1000
    parts = []
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            parts.append(f"{int(seconds // length)}{unit}")
            seconds %= length
    parts.append(f"{seconds:.1f}s" if not parts else f"{int(seconds)}s")
    return " ".join(parts)


def compact_seconds(value: float | None) -> str:
    """Seconds in one unit, short enough for a column (``42.0s``, ``3m``, ``1.5h``); ``-``: none."""
    if value is None:
        return "-"
    if value < 60:
        return f"{value:.1f}s"
    if value < 3600:
        return f"{value / 60:.0f}m"
    if value < 86400:
        return f"{value / 3600:.1f}h"
    return f"{value / 86400:.1f}d"


def utc_time(seconds: float) -> datetime | None:
    """Unix ``seconds`` as a UTC datetime; None past what a date holds. A time read back from
    Redis (a journal entry's ``at``, a record's) is stored data, any 19 digits: the one guarded
    conversion the commands and the console's page share (``datetime`` stops at year 9999)."""
    try:
        return datetime.fromtimestamp(seconds, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def preview(body: bytes, limit: int = PREVIEW_BYTES) -> str:
    """The start of a body: text when it decodes as UTF-8, escaped bytes otherwise."""
    head = body[:limit]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = repr(head)[2:-1]
    else:
        text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text + ("..." if len(body) > limit else "")


def shown(text: str) -> str:
    """Stored text as a terminal may print it: a character that is not printable (an escape
    sequence, a line break, a bidirectional override) as its Python escape, spaces kept."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def shorten(owner: str) -> str:
    return owner[:8] + "..." if len(owner) > 8 else owner
