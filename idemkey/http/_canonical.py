"""Canonical forms of a request body, for the fingerprint (sans-IO, no framework).

Two sends of one operation must fingerprint the same even where a client legitimately changes
the bytes, and two different operations must not:

* ``multipart/form-data``: httpx, requests and curl pick a new random boundary per call, so a
  retried upload differs in every delimiter. :func:`multipart_form` reduces the body to its
  parts: each part's name, filename, content type and content, in order. The boundary,
  the preamble, the epilogue and other part headers are left out.
* JSON (``Policy(fingerprint="json")``): :func:`canonical_json` ignores key order and
  insignificant whitespace. An object with a repeated key is not canonicalised (parsers
  disagree on which value wins), nor is a number a double does not hold as written, nor
  anything that is not JSON: those compare as bytes.

Each function returns None when the body is not in its form; the caller then compares bytes.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
from typing import Final

__all__ = ["canonical_json", "multipart_form"]

_TOKEN: Final = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
# One `; name=value` parameter; the value is a quoted string (with \-escapes) or a token run.
_PARAM: Final = re.compile(rf';\s*({_TOKEN})\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)', re.DOTALL)
_ESCAPE: Final = re.compile(r"\\(.)", re.DOTALL)


def _params(value: str) -> dict[str, str]:
    """The parameters of a header value such as ``form-data; name="a"; filename="b"``."""
    found: dict[str, str] = {}
    for name, raw in _PARAM.findall(value):
        raw = raw.strip()
        if raw.startswith('"') and raw.endswith('"') and len(raw) >= 2:
            raw = _ESCAPE.sub(r"\1", raw[1:-1])
        found.setdefault(name.lower(), raw)
    return found


def _field(value: str | None) -> bytes:
    """A length-prefixed field; ``-`` for an absent one, so absent and empty differ."""
    if value is None:
        return b"-"
    data = value.encode("utf-8", "surrogateescape")
    return b"%d:%b" % (len(data), data)


def multipart_form(content_type: str, body: bytes) -> bytes | None:
    """The parts of a ``multipart/form-data`` body, or None if it is not one (then: bytes)."""
    boundary = _params(content_type).get("boundary")
    if not boundary or len(boundary) > 200:
        return None
    delimiter = b"--" + boundary.encode("latin-1", "replace")
    if body.startswith(delimiter):
        pos = len(delimiter)
    else:  # a preamble comes first: the delimiter then follows a line break
        found = body.find(b"\r\n" + delimiter)
        if found < 0:
            return None
        pos = found + 2 + len(delimiter)
    separator = b"\r\n" + delimiter
    out: list[bytes] = []
    while True:
        if body.startswith(b"--", pos):  # the close delimiter: the rest is the epilogue
            return b"".join(out)
        line_end = body.find(b"\r\n", pos)
        if line_end < 0 or body[pos:line_end].strip(b" \t"):
            return None
        start = line_end + 2
        end = body.find(separator, start)
        if end < 0:
            return None
        part = _part(body[start:end])
        if part is None:
            return None
        out.append(part)
        pos = end + len(separator)


def _part(raw: bytes) -> bytes | None:
    """name, filename, filename*, content type and content of one part, length-prefixed."""
    if raw.startswith(b"\r\n"):
        head, content = b"", raw[2:]
    else:
        split = raw.find(b"\r\n\r\n")
        if split < 0:
            return None
        head, content = raw[:split], raw[split + 4 :]
    headers: dict[str, str] = {}
    for line in head.decode("latin-1").split("\r\n") if head else ():
        name, colon, value = line.partition(":")
        if not colon:
            return None
        headers.setdefault(name.strip().lower(), value.strip())
    disposition = headers.get("content-disposition")
    if disposition is None:
        return None
    params = _params(disposition)
    fields = (
        params.get("name"),
        params.get("filename"),
        params.get("filename*"),
        headers.get("content-type"),
    )
    return b"".join(_field(f) for f in fields) + b"%d:%b" % (len(content), content)


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise _Duplicate
    return result


def _exact_float(text: str) -> float:
    # A number a double does not hold as written (past 17 significant digits, or out of range)
    # would canonicalise two amounts the app tells apart (`parse_float=Decimal`) as one:
    # 12345678901234567.89 and 12345678901234567.00. Such a body compares as bytes instead.
    value = float(text)
    try:
        exact = Decimal(repr(value)) == Decimal(text)
    except InvalidOperation:  # inf or nan, from a literal past a double's range
        exact = False
    if not exact:
        raise _Inexact
    return value


class _Inexact(ValueError):
    pass


def canonical_json(body: bytes) -> bytes | None:
    """The JSON value of ``body`` with sorted keys and no whitespace, or None if not JSON (or
    if a number in it is not a double exactly as written)."""
    try:
        value = json.loads(body, object_pairs_hook=_no_duplicates, parse_float=_exact_float)
    except (ValueError, RecursionError):  # includes _Duplicate, _Inexact, undecodable bytes
        return None
    # ASCII output: valid JSON that no non-JSON body (compared as bytes) can equal.
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
