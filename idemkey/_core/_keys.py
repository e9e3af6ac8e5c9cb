"""Sans-IO: the key an ``Idempotency-Key`` field value carries (RFC 8941 sf-string or bare
form), checked; part of :mod:`idemkey._core`, which re-exports it.
"""

from __future__ import annotations

import re
from typing import Final

from ..errors import InvalidKeyError

__all__ = ["MAX_KEY_LENGTH", "parse_key"]

MAX_KEY_LENGTH: Final = 255

# RFC 8941 sf-string: printable ASCII, with only \" and \\ escaped. Spaces are allowed inside.
_SF_STRING: Final = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
_SF_ESCAPE: Final = re.compile(r'\\(["\\])')
_OWS: Final = " \t"


def parse_key(value: str, *, strict: bool = False) -> str:
    """Return the key carried by one ``Idempotency-Key`` field value.

    Accepts the RFC 8941 sf-string form (``"abc"``) and, unless ``strict``, the bare form
    (``abc``); both give the same key. The key is 1 to 255 printable ASCII characters.
    Anything else raises :class:`InvalidKeyError` with the rule it broke.
    """
    value = value.strip(_OWS)
    if not value:
        return _invalid("the key is empty")
    if not value.isascii():
        return _invalid("the key must be ASCII")
    if value[0] == '"':
        match = _SF_STRING.fullmatch(value)
        if match is None:
            return _invalid("the key is not a valid RFC 8941 string")
        key = match.group(1)
        if "\\" in key:
            key = _SF_ESCAPE.sub(r"\1", key)
        if "," in key:
            # gunicorn and werkzeug join two field lines `"x` and `y"` into `"x,y"`, a valid
            # sf-string: a comma is refused in both forms, so several lines never pass as one.
            return _invalid("the key must not contain a comma (several field lines?)")
    elif strict:
        return _invalid('the key must be an RFC 8941 string in double quotes, like "abc"')
    elif not value.isprintable() or " " in value or "," in value:
        # Bare keys: visible ASCII (printable ASCII is 0x20-0x7e) but the space and the comma,
        # which only appears where a server joined several field lines into one (PEP 3333
        # does): several keys in one request are invalid. String methods, not a regular
        # expression: the regex engine is cold code on every keyed request.
        return _invalid("the key must be visible ASCII characters, without spaces or commas")
    else:
        key = value
    if not key:
        return _invalid("the key is empty")
    if len(key) > MAX_KEY_LENGTH:
        return _invalid(f"the key is longer than {MAX_KEY_LENGTH} characters")
    return key


def _invalid(reason: str) -> str:
    raise InvalidKeyError(reason)
