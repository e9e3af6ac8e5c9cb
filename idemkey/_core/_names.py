"""Sans-IO: the Redis names of one record, built from its parts or its digest and parsed back;
part of :mod:`idemkey._core`, which re-exports them.

The one place that knows the name ``{prefix}:{<digest>}`` (:data:`RECORD_NAME`) and its hints:
the store, the guards, the command line and the console build a record's name here
(:func:`record_for`, :func:`record_from_digest`), ``records()`` and the CLI's scans match it
(:func:`record_pattern`) and read a key's prefix and digest back (:func:`parse_record_name`;
a record's own name, its prefix: :func:`record_prefix`).
The Lua scripts build the hints from ``KEYS[1]`` (``KEYS[1] .. ":done"``): see
docs/design.md#record-keys.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final, NamedTuple

__all__ = [
    "DONE_HINT",
    "GONE_HINT",
    "LOCK_HINT",
    "RECORD_NAME",
    "Record",
    "RecordName",
    "is_digest",
    "parse_record_name",
    "record_for",
    "record_from_digest",
    "record_pattern",
    "record_prefix",
]

#: A record's hash: the prefix, then the digest in braces, the cluster hash tag (``%`` format:
#: an operator, not a call, on the hot path).
RECORD_NAME: Final = "%s:{%s}"
#: The hints beside a record, named from it: 0.2's lock string (a 0.2 claim's lease), the
#: wake-up stream and the expiry tombstone.
LOCK_HINT: Final = ":lock"
DONE_HINT: Final = ":done"
GONE_HINT: Final = ":gone"

# What sits in a record's braces: a BLAKE2b-128 digest in lower-case hex.
_DIGEST: Final = "[0-9a-f]{32}"
_DIGEST_TEXT: Final = re.compile(_DIGEST)

# A Record is built on every request: a named tuple, so the hot path builds it with
# tuple.__new__ (C) rather than a Python __new__.
_new_tuple = tuple.__new__


class _Names(NamedTuple):
    digest: str
    record_key: str


class Record(_Names):
    """The Redis names of one idempotency record; ``digest`` is what sits in the braces.

    ``record_key`` names the record's hash. :attr:`lock_key` names the string where idemkey
    0.2 kept a claim's lease (0.3 keeps it in the hash), built when asked: only readers of
    0.2's live claims ask (``idemkey inspect``), so a request never builds it.
    """

    __slots__ = ()

    def __new__(cls, digest: str, record_key: str, lock_key: str | None = None) -> Record:
        # 0.3.0's Record had lock_key as a third field: still taken, and it can only be the
        # name the scripts build from the record's (KEYS[1] .. ":lock").
        if lock_key is not None and lock_key != record_key + LOCK_HINT:
            raise ValueError(f"a record's lock_key is its record_key + {LOCK_HINT!r}")
        return _new_tuple(cls, (digest, record_key))

    @property
    def lock_key(self) -> str:
        """The name of 0.2's lock string (reading 0.2 claims: remove in 0.4)."""
        return self.record_key + LOCK_HINT

    @property
    def key(self) -> str:
        """The 0.2 name of :attr:`record_key`."""
        return self.record_key

    @property
    def lock(self) -> str:
        """The 0.2 name of :attr:`lock_key`."""
        return self.lock_key


def record_for(prefix: str, scope: str, method: str, route: str, key: str) -> Record:
    """Name the record for ``key`` used by ``scope`` on ``method route``.

    Same key in another scope or on another route is another record.
    """
    s = scope.encode("utf-8", "surrogatepass")
    m = method.encode()
    r = route.encode("utf-8", "surrogatepass")
    k = key.encode("utf-8", "surrogatepass")
    # Each part as b"<length>:<bytes>", built in one formatting step (hot path: a generator
    # join took longer than the hash).
    material = b"%d:%b%d:%b%d:%b%d:%b" % (len(s), s, len(m), m, len(r), r, len(k), k)
    digest = hashlib.blake2b(material, digest_size=16).hexdigest()
    # record_from_digest without its Python call (hot path: every request).
    return _new_tuple(Record, (digest, RECORD_NAME % (prefix, digest)))


def is_digest(value: str) -> bool:
    """Whether ``value`` is a record's digest (32 lower-case hex digits), as an operator
    gives one (``idemkey inspect --digest``, the console's forget)."""
    return _DIGEST_TEXT.fullmatch(value) is not None


def record_from_digest(prefix: str, digest: str) -> Record:
    """The record under ``prefix`` whose digest is ``digest`` (from a log line, an event, the
    console's page; check it with :func:`is_digest`), as :func:`record_for` names it."""
    return _new_tuple(Record, (digest, RECORD_NAME % (prefix, digest)))


def record_prefix(record_key: str) -> str:
    """The prefix of a record's name (``Record.record_key``, as :data:`RECORD_NAME` builds
    it): everything before its last ``:{``, since a prefix holds no brace."""
    return record_key.rpartition(":{")[0]


def _glob_escape(value: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in value)


def record_pattern(prefix: str) -> str:
    """The SCAN MATCH pattern of the records under ``prefix`` (not their hints)."""
    return RECORD_NAME % (_glob_escape(prefix), "*")


class RecordName(NamedTuple):
    """A key's name read back: the record's ``prefix`` and ``digest``, and ``hint``: ``""``
    for the record's hash, else :data:`LOCK_HINT`, :data:`DONE_HINT` or :data:`GONE_HINT`."""

    prefix: str
    digest: str
    hint: str


# A policy's prefix has no brace (_options._prefix), and the digest is 32 hex digits.
_PARSED: Final = re.compile(
    rb"([^{}]+):\{(%b)\}(%b)?"
    % (
        _DIGEST.encode(),
        b"|".join(re.escape(hint.encode()) for hint in (LOCK_HINT, DONE_HINT, GONE_HINT)),
    )
)


def parse_record_name(name: bytes | str) -> RecordName | None:
    """What the key ``name`` (as SCAN answers it) names, or None when it is not a record's
    hash or hint. A prefix that is not UTF-8 is read with ``\\x..`` escapes."""
    raw = name if isinstance(name, bytes) else name.encode("utf-8", "surrogatepass")
    found = _PARSED.fullmatch(raw)
    if found is None:
        return None
    prefix, digest, hint = found.groups()
    return RecordName(
        prefix.decode("utf-8", "backslashreplace"), digest.decode(), (hint or b"").decode()
    )
