"""The origin a claim keeps: the client's key escaped so that no key, however hostile, breaks
the origin's format or reaches a terminal or a page as anything but printable text; and what
Redis hands back is read as input (a malformed origin is empty fields, never an error)."""

from __future__ import annotations

import pytest

from idemkey._core._origin import (
    PIECE,
    decode_origin,
    escape_key,
    escape_lines,
    record_origin,
    unescape_key,
)

HOSTILE = [
    "plain-key_1.2~",
    "a b\tc\nd\r\n",
    "\x1b[2J\x1b]0;pwned\x07",  # terminal escape sequences
    "\u202eevil\u202c",  # a bidirectional override
    "%41;\nk:forged;",  # the origin's own delimiters
    "\ud800lone surrogate",
    "<script>alert(1)</script>&amp;",
    "é" * 255,
]


@pytest.mark.parametrize("key", HOSTILE)
def test_an_escaped_key_is_one_printable_token_and_reads_back(key: str) -> None:
    escaped = escape_key(key)
    assert escaped.isprintable()
    assert not any(c.isspace() for c in escaped)
    assert ";" not in escaped
    assert "\n" not in escaped
    assert unescape_key(escaped) == key
    text = "1712345678901 " + record_origin("tenant\nwith a line", "POST", "/charges", key)
    raw = text.encode("utf-8", "surrogatepass")
    # As claim.lua keeps it: pieces of 64 bytes, read back with HMGET.
    pieces = [raw[i : i + PIECE] for i in range(0, len(raw), PIECE)]
    origin = decode_origin(pieces)
    where = ("POST", "/charges", "tenant%0Awith a line")  # a line break kept as %0A
    assert (origin.method, origin.route, origin.scope) == where
    assert origin.key == escaped
    assert not origin.cut
    assert origin.at == 1712345678.901


def test_no_key_a_cut_key_and_garbage() -> None:
    assert decode_origin([b"1 GUARD f\nscope"]).key == ""
    assert decode_origin([b"1 GUARD f\n\nk:abc"]).cut  # the end never came: cut
    assert decode_origin([b"1 GUARD f\n\nk:abc;", None, b"stale"]).key == "abc"
    assert decode_origin([b"1 GUARD f\n\nk:ab\x1bc;"]).key == ""  # not escape_key's output
    assert decode_origin([None]).method == ""
    assert decode_origin([b"\xff\xfe not an origin"]).at is None
    # A stale piece after the key's end (a longer origin before) is not part of the key.
    assert decode_origin([b"1 GUARD f\n\nk:abc;", b"def;"]).key == "abc"


@pytest.mark.parametrize(
    ("route", "scope"),
    [
        ("/charges\ntenant-acme\nk:forged;", "tenant-mallory"),  # a path of /charges%0A...
        ("/charges", "tenant\r\nk:x;"),
        ("/x\n", "\n"),
    ],
)
def test_a_route_or_scope_with_line_breaks_cannot_move_the_origins_lines(
    route: str, scope: str
) -> None:
    text = "1712345678901 " + record_origin(scope, "POST", route, "k1")
    assert text.count("\n") == 2  # the head, the scope, the key: no line of the client's
    origin = decode_origin([text.encode()])
    assert (origin.method, origin.key) == ("POST", "k1")
    assert (origin.route, origin.scope) == (escape_lines(route), escape_lines(scope))
    assert "\n" not in origin.route + origin.scope


def test_a_short_piece_ends_the_origin_stale_pieces_after_it_are_not_read() -> None:
    # 0.3.0 rewrites "i" only: a short "i" then the "i1" a longer origin left before.
    stale = b"x" * PIECE
    origin = decode_origin([b"1 POST /charges\nacct_7", stale, b"yy"])
    assert origin.scope == "acct_7"
    assert origin.route == "/charges"
    # A full piece is followed by the next one, as claim.lua cut them.
    full = b"1 POST /c\n" + b"s" * (PIECE - 10)
    assert decode_origin([full, b"tail"]).scope == "s" * (PIECE - 10) + "tail"
    # 0.3.0 wrote its whole origin over "i" at any length: longer than a piece, it is whole.
    whole = b"1796698598198 POST /v1/payments/refunds\n" + b"a" * 32
    assert decode_origin([whole, stale, b"yy"]).scope == "a" * 32
