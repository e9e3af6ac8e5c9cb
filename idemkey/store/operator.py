"""What ``store.cancel()`` and ``store.forget()`` answer: the operator's calls, decoded.

Sans-IO: the store sends cancel.lua or forget.lua and hands the reply here, so the command
line and the console read a small frozen value and decode nothing themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

from ..errors import StoreError
from .diagnostics import _text as text

__all__ = [
    "Cancelled",
    "Forgotten",
    "Seen",
    "decode_cancel_reply",
    "decode_forget_reply",
    "seen_args",
]

#: What forget found: a record's state (``in_progress`` only with a live claim), "foreign" for a
#: key of another type at the record's name (deleted: every claim refuses it), or "" for none.
FoundState = Literal["in_progress", "lapsed", "complete", "released", "foreign", ""]
_FOUND: frozenset[str] = frozenset(("in_progress", "lapsed", "complete", "released", "foreign", ""))

#: What an operator was shown of a record: its state and its fence as stored (bytes where no
#: parser reads it; None: it had none), sent to forget.lua and cancel.lua, which keep a record
#: that is no longer that.
Seen = tuple[str, int | bytes | None]


def seen_args(seen: Seen | None) -> tuple[str | int | bytes, ...]:
    """The scripts' optional ARGV for ``seen``: none, or the state and the fence ("": none)."""
    return () if seen is None else (seen[0], "" if seen[1] is None else seen[1])


#: What cancel found: ``was`` of :class:`Cancelled`.
CancelState = Literal["in_progress", "released", "complete", ""]
_CANCEL_FOUND: frozenset[str] = frozenset(("in_progress", "released", "complete", ""))


@dataclass(frozen=True)
class Cancelled:
    """A cancelled record: what it was, and its fence now (raised by the cancel).

    ``was`` is ``"in_progress"`` (its owner lost it: its checkpoints and completion are refused
    from now on) or ``"released"`` (a released record with finished steps, released again).
    ``changed`` is true when the caller said what it was shown (``seen``) and the record is no
    longer that: nothing was cancelled, ``was`` is what it is now (``"complete"``, ``""``: none
    too) and ``fence`` is 0.
    """

    was: CancelState
    fence: int
    changed: bool = False


@dataclass(frozen=True)
class Forgotten:
    """What ``store.forget()`` found and did.

    ``state`` is what the record was (``""``: there was none); ``deleted`` the keys deleted
    (the record, its expiry tombstone, a 0.2 lock string, its wake-up stream); ``held`` is true
    when a live claim holds the record and ``force`` was not given: nothing was deleted.
    ``changed`` is true when the caller said what it was shown (``seen``) and the record is no
    longer that (``state`` is what it is now): nothing was deleted either.
    """

    state: FoundState
    deleted: int
    held: bool = False
    changed: bool = False

    @property
    def forgotten(self) -> bool:
        """Whether a record was deleted."""
        return not self.held and not self.changed and self.state != ""


def decode_cancel_reply(reply: object) -> Cancelled | None:
    """cancel.lua's reply: ``{1, fence}``, ``{2, fence}``, ``{0}`` (nothing to cancel) or
    ``{-2, state}`` (not the record the caller was shown)."""
    if isinstance(reply, list) and reply and reply[0] == 0:
        return None
    if isinstance(reply, list) and len(reply) == 2 and reply[0] == -2:
        found = text(reply[1])
        if found in _CANCEL_FOUND:
            return Cancelled(cast(CancelState, found), 0, changed=True)
    if isinstance(reply, list) and len(reply) == 2 and reply[0] in (1, 2) and type(reply[1]) is int:
        return Cancelled("in_progress" if reply[0] == 1 else "released", reply[1])
    raise StoreError(f"unexpected reply from the cancel script: {reply!r:.200}")


def decode_forget_reply(reply: object) -> Forgotten:
    """forget.lua's reply: ``{deleted, state}``, ``{-1, "in_progress"}`` when a live claim
    holds the record, ``{-2, state}`` when it is not what the caller was shown."""
    if isinstance(reply, list) and len(reply) == 2 and type(reply[0]) is int:
        state = text(reply[1])
        if state in _FOUND and reply[0] >= -2:
            if reply[0] == -1:
                return Forgotten("in_progress", 0, held=True)
            if reply[0] == -2:
                return Forgotten(cast(FoundState, state), 0, changed=True)
            return Forgotten(cast(FoundState, state), reply[0])
    raise StoreError(f"unexpected reply from the forget script: {reply!r:.200}")
