"""The origin a claim keeps in its record: when, where from, and the key the client sent.

Sans-IO. A record's name is a one-way digest of scope, method, route and key, so an operator
could not tell records apart. The claim keeps its origin (claim.lua, ARGV[7]):

    "<claimed at, unix ms> <method> <route>\\n<scope>[\\nk:<escaped key>;]"

in hash fields of at most :data:`PIECE` bytes, ``"i"`` then ``"i1"`` ... ``"i15"``
(:data:`ORIGIN_FIELDS`): one value longer than Redis's ``hash-max-listpack-value`` (64) would
turn the record into a hash table for good, 32 bytes more once it completes. An origin longer
than the 16 pieces is cut there (the key then shows "..." at its end, or is lost when the cut
falls before it).

The key is an opaque client token, possibly hostile. It is kept escaped (:func:`escape_key`):
``%``, ``;``, white space and every character that is not printable (control characters,
bidirectional overrides, lone surrogates) as ``%XX`` of its UTF-8 bytes, so it never contains
a line break or the ``;`` that ends it, and the escaped form is what the CLI prints: no
terminal escape sequence reaches an operator's terminal. The console prints it through Jinja's
HTML autoescaping. :func:`decode_origin` reads it back as stored data: anything malformed
decodes to empty fields, never an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote_to_bytes

from ._stored import stored_int

__all__ = [
    "ORIGIN_FIELDS",
    "PIECE",
    "Origin",
    "decode_origin",
    "escape_key",
    "escape_lines",
    "record_origin",
    "printable_text",
    "unescape_key",
]

#: The longest piece of the origin one hash field holds (``hash-max-listpack-value``).
PIECE: Final = 64
#: The fields that hold the origin, in order (claim.lua writes them, complete.lua drops them).
ORIGIN_FIELDS: Final = ("i", *(f"i{n}" for n in range(1, 16)))
#: What marks the key's line in the origin, and what ends the key.
_KEY_MARK: Final = "\nk:"
_KEY_END: Final = ";"
_ALWAYS_ESCAPED: Final = frozenset("%;")


def escape_key(key: str) -> str:
    """``key`` with ``%``, ``;``, white space and every unprintable character as ``%XX`` of
    its UTF-8 bytes (a lone surrogate as its surrogatepass bytes): one line of printable text."""
    out = []
    for ch in key:
        if ch.isprintable() and not ch.isspace() and ch not in _ALWAYS_ESCAPED:
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
    return "".join(out)


def printable_text(text: str) -> str:
    """``text`` (a route, a scope) as an operator's terminal shows it: one printable token,
    white space and unprintable characters as ``%XX``, but ``%`` as it is, so that a line break
    :func:`escape_lines` kept as ``%0A`` is printed as what ``--route`` and ``--scope`` take."""
    if text.isprintable() and " " not in text:
        return text
    out = []
    for ch in text:
        if ch.isprintable() and not ch.isspace():
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
    return "".join(out)


def unescape_key(escaped: str) -> str:
    """The key :func:`escape_key` escaped (its bytes decoded as it encoded them)."""
    return unquote_to_bytes(escaped).decode("utf-8", "surrogatepass")


def escape_lines(text: str) -> str:
    """``text`` with its line breaks as ``%0A``: a route or scope as its origin keeps it (read
    back so; a literal ``%0A`` looks the same, which only the display shares)."""
    return text.replace("\n", "%0A")


def record_origin(scope: str, method: str, route: str, key: str | None = None) -> str:
    """What a claim keeps of where its record comes from, without its time (claim.lua puts
    its server's clock before it, the clock of the lease and the fence): the method, the route
    (or function name), the scope and, unless ``key`` is None (``Policy(keep_keys=False)``),
    the key the client sent, escaped: what the record's digest hides. :func:`decode_origin`
    reads it back. A line break in the route (a concrete path) or the scope is written as
    ``%0A`` (:func:`escape_lines`), so that no client moves the origin's lines.

    Text only: a lone surrogate in the route or scope (made from bytes) is written escaped, as
    the client's strict UTF-8 encoding could not send it (the record's name encodes it with
    ``surrogatepass``, so the record itself is unchanged). One call on every claim: a key that
    needs no escaping (the usual one) is tested here, without calling :func:`escape_key`."""
    if "\n" in route or "\n" in scope:  # a path of /charges%0A...: would move the lines
        route, scope = escape_lines(route), escape_lines(scope)
    if key is None:
        origin = f"{method} {route}\n{scope}"
    else:
        if not key.isprintable() or " " in key or not _ALWAYS_ESCAPED.isdisjoint(key):
            key = escape_key(key)
        origin = f"{method} {route}\n{scope}{_KEY_MARK}{key}{_KEY_END}"
    if origin.isascii():
        return origin
    return origin.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass(frozen=True, slots=True)
class Origin:
    """An origin as read back: ``key`` is the escaped key ("" when none was kept), ``cut``
    whether the key was cut at the origin's last piece."""

    at: float | None = None
    method: str = ""
    route: str = ""
    scope: str = ""
    key: str = ""
    cut: bool = False


def decode_origin(pieces: Sequence[object]) -> Origin:
    """The origin from the values of :data:`ORIGIN_FIELDS` (``HMGET``; a missing piece ends
    it, and so does a piece of any length but :data:`PIECE`: claim.lua cuts full pieces, so
    one after a short piece is a stale one a longer origin left, and a longer piece is 0.3's
    whole origin, which 0.3 wrote over ``i`` alone). Values that are not bytes, or not an
    origin, give an empty one."""
    parts = []
    for piece in pieces:
        if not isinstance(piece, bytes):
            break
        parts.append(piece)
        if len(piece) != PIECE:
            break
    if not parts:
        return Origin()
    raw = b"".join(parts).decode("utf-8", "replace")
    head, _, rest = raw.partition("\n")
    stamp, _, where = head.partition(" ")
    method, _, route = where.partition(" ")
    millis = stored_int(stamp)
    at = millis / 1000 if millis is not None else None
    scope, mark, tail = rest.rpartition(_KEY_MARK)
    if not mark:
        return Origin(at, method, route, rest)
    key, end, _stale = tail.partition(_KEY_END)
    # Escaped keys are printable and have no space; anything else was not written by
    # escape_key (stored data is input): shown as no key.
    if key and not (key.isprintable() and " " not in key):
        key = ""
    return Origin(at, method, route, scope, key, cut=bool(key) and not end)
