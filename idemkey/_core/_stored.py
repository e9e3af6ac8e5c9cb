"""Numbers read back from Redis: stored bytes are input, whoever wrote them.

Sans-IO. A record's fields, its origin and the uncertain journal hold numbers as text
(fences, deadlines, claim times). A key under the prefix that idemkey did not write, or a
damaged record, may hold anything there: ``str.isdigit`` passes ``"²"`` (which ``int``
refuses), and ``int`` refuses more than 4300 digits, or turns a few hundred into a time no
float holds. One listing must not fail on one such record: :func:`stored_int` reads what is
not a plain number as none.
"""

from __future__ import annotations

from typing import Final

__all__ = ["stored_int"]

#: The most digits a number idemkey writes has: Redis integers and Lua's %d are 64-bit.
_MOST_DIGITS: Final = 19


def stored_int(raw: str) -> int | None:
    """``raw`` as a non-negative integer, when it is 1 to 19 ASCII digits; else None."""
    if 0 < len(raw) <= _MOST_DIGITS and raw.isascii() and raw.isdigit():
        return int(raw)
    return None
