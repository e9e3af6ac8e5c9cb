"""Sans-IO core: keys, record names, fingerprints, script arguments and replies (the
``Idempotency-Key`` field's parser in ``_keys`` and a record's names, built and parsed, in
``_names``, re-exported here).

Nothing here does I/O, so the sync and async stores, the guards and the HTTP adapters share
every decision, and tests cover them without a server.

Invariants:

* A record lives in one Redis key, the hash ``{prefix}:{<d>}``; a live claim's lease is its
  field ``lease``, so every script touches that key alone, and a cluster slot being migrated
  serves it through ASK. Its hints, the done stream ``:done`` and the tombstone ``:gone``,
  share the hash tag (one slot). Claims written by 0.2 kept the lease in ``{prefix}:{<d>}:lock``.
* ``<d>`` is a BLAKE2b-128 digest over the length-prefixed scope, method, route and key. The
  digest is the tenant-isolation boundary (a cryptographic hash: nobody can craft a key that
  collides with another tenant's record), and it keeps raw client input out of the braces, where
  ``""`` or ``"}x"`` would change the slot.
* The fingerprint only compares two requests that already share a record, so it may be fast:
  xxh3-128 over the length-prefixed method, target, sorted query, content type and body (and
  the content encoding when there is one), as 16 raw bytes: a completed record keeps it, and
  hex would double it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, NamedTuple, cast
from urllib.parse import unquote_to_bytes

import xxhash

from ..errors import RecordFormatError, StoreError
from ._keys import MAX_KEY_LENGTH, parse_key
from ._names import (
    DONE_HINT,
    GONE_HINT,
    LOCK_HINT,
    Record,
    RecordName,
    is_digest,
    parse_record_name,
    record_for,
    record_from_digest,
    record_pattern,
)
from ._origin import record_origin

__all__ = [
    "DONE_HINT",
    "GONE_HINT",
    "LOCK_HINT",
    "MAX_KEY_LENGTH",
    "Claimed",
    "Decision",
    "Expired",
    "ExpiringDecision",
    "InFlight",
    "Mismatch",
    "NotARecordError",
    "RECORD_LOST",
    "Record",
    "RecordName",
    "Replay",
    "decode_claim_reply",
    "IN_FLIGHT_RETRY_AFTER",
    "fingerprint",
    "in_flight_retry_after",
    "is_digest",
    "new_owner",
    "next_poll_delay",
    "owner_tag",
    "parse_key",
    "parse_record_name",
    "payload_fingerprint",
    "record_for",
    "record_from_digest",
    "record_origin",
    "record_pattern",
    "record_state",
    "retry_after_seconds",
]

# Claimed and Replay are built on every request: named tuples, so the hot path builds them
# with tuple.__new__ (C) rather than a Python __init__ (a frozen dataclass's sets each field
# through object.__setattr__). Immutable, compared and hashed by value, as before.
_new_tuple = tuple.__new__


def _plain_name(pair: str) -> str:
    # _by_name for a query with nothing to decode (the usual one): one C call per pair.
    return pair.partition("=")[0] + "="


def _by_name(pair: str) -> str:
    # Sorted by name alone, and stably: a repeated name's values keep their order, which the
    # app reads (`?sort=price&sort=date` is not `?sort=date&sort=price`). The name as the app
    # reads it, decoded (`%73ort` and `sort` are one name, `a` and `a=` one too), then "=":
    # pairs of distinct plain names sort exactly as whole pairs did before 0.4, so stored
    # fingerprints still match.
    name = pair.partition("=")[0]
    if "%" in name or "+" in name or not name.isascii():
        # The bytes the client sent: a server hands the query over as latin-1 text (WSGI),
        # and the app decodes them, escaped or not, as UTF-8 (`%C3%A9` and a raw `é` alike).
        raw = name.replace("+", " ")
        try:
            sent = raw.encode("latin-1")
        except UnicodeEncodeError:  # text past latin-1: the app's own, already decoded
            sent = raw.encode("utf-8", "surrogatepass")
        name = unquote_to_bytes(sent).decode("utf-8", "replace")
    return name + "="


def fingerprint(
    method: str,
    target: str,
    query: str,
    content_type: str,
    body: bytes,
    content_encoding: str = "",
) -> bytes:
    """Fingerprint an HTTP request; two requests with one key must match it to be one request.

    ``target`` is the concrete path (not the route template), so one key cannot be replayed
    against another resource on the same route. The query's parameters are compared by name
    in any order, but the values of a repeated name in the order sent. ``body`` is the bytes
    sent or a canonical form of them (:mod:`idemkey._canonical`); ``content_encoding`` (gzip,
    ...) is part of the request: the same bytes sent encoded and not encoded are two requests.
    """
    if "&" in query:
        plain = query.isascii() and "%" not in query and "+" not in query
        query = "&".join(sorted(query.split("&"), key=_plain_name if plain else _by_name))
    m = method.encode()
    t = target.encode("utf-8", "surrogatepass")
    q = query.encode("utf-8", "surrogatepass")
    c = content_type.encode("latin-1", "replace")
    if (
        content_encoding
    ):  # a sixth part, only when present: unencoded fingerprints stay as they were
        e = content_encoding.lower().encode("latin-1", "replace")
        return xxhash.xxh3_128_digest(
            b"%d:%b%d:%b%d:%b%d:%b%d:%b%d:%b"
            % (len(m), m, len(t), t, len(q), q, len(c), c, len(body), body, len(e), e)
        )
    # Length-prefixed parts as in record_for; the body is copied once, not twice.
    return xxhash.xxh3_128_digest(
        b"%d:%b%d:%b%d:%b%d:%b%d:%b" % (len(m), m, len(t), t, len(q), q, len(c), c, len(body), body)
    )


#: :func:`payload_fingerprint` without its Python call, for the guards (every call).
PAYLOAD_DIGEST: Final = xxhash.xxh3_128_digest


def payload_fingerprint(payload: bytes) -> bytes:
    """Fingerprint a guard payload (16 bytes)."""
    return PAYLOAD_DIGEST(payload)


#: Characters of the owner token a completed record keeps, after its fingerprint (complete.lua).
OWNER_TAG_LENGTH: Final = 12


def owner_tag(owner: str) -> str:
    """What a completed record keeps of its owner, sent to complete.lua with each completion:
    the first 12 digits of one of :func:`new_owner`'s tokens, else a 44-bit hash of the whole
    token in hex, so owners that share a prefix stay apart. Computed here only."""
    if len(owner) == 32:
        return owner[:OWNER_TAG_LENGTH]
    h = 0
    for byte in owner.encode("utf-8", "surrogatepass"):
        h = (h * 131 + byte) % (1 << 44)
    return f"{h:012x}"


def record_state(fields: Mapping[bytes, bytes]) -> str:
    """A record's state from its hash fields (``HGETALL``): ``"complete"``, ``"in_progress"``,
    ``"released"`` (only the fence, and the fingerprint with the steps, left) or ``""`` (none).

    A completed record has no state field (only ``resp`` and ``fp``); one written before 0.2
    says ``state = "complete"``, and has ``resp`` too; reading 0.1 records: remove in 0.4.
    """
    if b"resp" in fields:
        return "complete"
    if fields.get(b"state") == b"in_progress":
        return "in_progress"
    return "released" if fields else ""


# Owner tokens waiting to be handed out: 16 bytes of os.urandom each, as secrets.token_hex(16)
# gives, read 64 at a time (a getrandom system call per claim cost more than the rest of
# new_owner). list.pop is atomic, so two threads never get one token. A forked child must never
# hand out its parent's tokens (two executors with one owner would both own a record): the
# list is emptied in the child at fork, as the random module reseeds itself.
_OWNERS_PER_READ: Final = 64
_owners: list[str] = []
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_owners.clear)


def new_owner() -> str:
    """A fresh, unguessable owner token for one claim (32 hex digits)."""
    try:
        return _owners.pop()
    except IndexError:
        block = os.urandom(16 * _OWNERS_PER_READ).hex()
        _owners.extend([block[i : i + 32] for i in range(32, len(block), 32)])
        return block[:32]


class Claimed(NamedTuple):
    """We own the record: run the work. ``fence`` is above every fence the key had before,
    even when Redis lost the record (the server's clock in µs at least: docs/guarantees.md).

    ``steps``: the finished steps of an earlier executor (name, encoded result), which a
    resumed call returns instead of running them again; empty on a first claim.
    """

    owner: str
    fence: int
    takeover: bool
    steps: tuple[tuple[str, bytes], ...] = ()


class Replay(NamedTuple):
    """The record is complete and the request matches: ``response`` is the stored value."""

    response: bytes


#: The longest a duplicate that found its call in flight is told to wait before it tries
#: again, in seconds. The lease bounds how long the first call can hold the key, but the call
#: usually ends far sooner: a caller told to wait out a 30 s lease would wait for nothing.
IN_FLIGHT_RETRY_AFTER: Final = 1.0
#: The shortest such wait: a lease that lapses now is retried soon, never in a busy loop.
_IN_FLIGHT_RETRY_MIN: Final = 0.05


def in_flight_retry_after(lease_remaining: float) -> float:
    """How long a duplicate that found its call in flight should wait before trying again.

    The one definition of ``retry_after`` that every integration uses (HTTP's ``Retry-After``,
    :class:`~idemkey.RequestInFlightError`, the Celery countdown, the job-queue recipes): the
    time left on the running call's lease, at most :data:`IN_FLIGHT_RETRY_AFTER` and at
    least 50 ms.
    """
    return max(_IN_FLIGHT_RETRY_MIN, min(lease_remaining, IN_FLIGHT_RETRY_AFTER))


@dataclass(frozen=True, slots=True)
class InFlight:
    """Another executor holds the lease; it lapses in ``lease_remaining`` seconds at the latest.

    ``retry_after`` is how long the caller should wait before it tries again
    (:func:`in_flight_retry_after`); ``lease_remaining`` only bounds the wait.
    """

    lease_remaining: float

    @property
    def retry_after(self) -> float:
        return in_flight_retry_after(self.lease_remaining)


@dataclass(frozen=True, slots=True)
class Mismatch:
    """The key was used with another request; the stored record is untouched."""


@dataclass(frozen=True, slots=True)
class Expired:
    """The record expired, and its tombstone says this request completed once, at
    ``completed_at`` (Unix time, seconds): the answer is ``key_expired``, never a second run
    (``Policy.expired_grace``)."""

    completed_at: float


Decision = Claimed | Replay | InFlight | Mismatch
#: What a claim that reads tombstones (``store.claim(..., expired=True)``) may answer.
ExpiringDecision = Decision | Expired

#: What renew.lua and complete.lua answer, besides 1 (ours) and 0 (another owner's), when the
#: caller's fence shows its record was lost under the claim (evicted or deleted): the hash is
#: gone, or a claim made it afresh (a fence not above the caller's; a takeover raises it).
RECORD_LOST: Final = -1

# Reply tags of claim.lua; integers decode faster than strings.
_CLAIMED: Final = 1
_REPLAY: Final = 2
_IN_FLIGHT: Final = 3
_MISMATCH: Final = 4
_EXPIRED: Final = 5
_FOREIGN: Final = 6
_MISMATCH_DECISION: Final = Mismatch()


class NotARecordError(RecordFormatError):
    """The record's name holds a key of another type (claim.lua's ``{6, type}``): nothing was
    claimed, so the store has no claim to give back (release.lua would fail on it too)."""


def decode_claim_reply(reply: object, owner: str) -> ExpiringDecision:
    """Turn claim.lua's reply into a decision; anything unexpected is a :class:`StoreError`,
    a key of another type at the record's name a :class:`NotARecordError`."""
    if isinstance(reply, list) and reply:
        tag = reply[0]
        if tag == _REPLAY and len(reply) == 2 and isinstance(reply[1], bytes):
            return _new_tuple(Replay, (reply[1],))  # Replay(reply[1])
        # Only an int is a fence or a lease time (one ``type() is`` test): RESP3 has replies of
        # its own for a number that is none (a double, which int() truncated: ``,1.5`` ran the
        # handler on fence 1; a null, a map; a boolean, an int to isinstance). No script sends
        # one: a hostile proxy or a broken server does, and gets the StoreError below.
        if tag == _CLAIMED and len(reply) == 3 and type(fence := reply[1]) is int:
            return _new_tuple(Claimed, (owner, fence, reply[2] == 1, ()))
        # The try costs no bytecode but its NOP, and none on the claim above; what it catches
        # is a lease or tombstone time past a float (a RESP3 big number of 400 digits) divided.
        try:
            if tag == _CLAIMED and len(reply) > 3 and len(reply) % 2 and type(reply[1]) is int:
                return Claimed(owner, reply[1], reply[2] == 1, _steps_of(reply))
            if tag == _IN_FLIGHT and len(reply) == 2 and type(reply[1]) is int:
                return InFlight(max(reply[1], 0) / 1000)
            if tag == _MISMATCH:
                return _MISMATCH_DECISION
            if tag == _EXPIRED and len(reply) == 2 and type(reply[1]) is int:
                return Expired(reply[1] / 1000)
        except OverflowError:
            pass
        if tag == _FOREIGN and len(reply) == 2 and isinstance(reply[1], bytes):
            # Redis answered: a record idemkey cannot read, never a store failure to run beside.
            kind = reply[1].decode("utf-8", "replace")
            raise NotARecordError(f"not an idemkey record: a {kind}")
    raise StoreError(f"unexpected reply from the claim script: {reply!r:.200}")


def _steps_of(reply: list[object]) -> tuple[tuple[str, bytes], ...]:
    """The (name, result) pairs after a claimed reply's first three elements."""
    names, results = reply[3::2], reply[4::2]
    if not all(isinstance(item, bytes) for item in (*names, *results)):
        raise StoreError(f"unexpected steps in a claim reply: {reply!r:.200}")
    try:
        return tuple(
            (cast(bytes, name).decode("utf-8", "surrogatepass"), cast(bytes, result))
            for name, result in zip(names, results, strict=True)
        )
    except UnicodeDecodeError as exc:  # idemkey writes every name from a str
        raise RecordFormatError(f"a step's name in the record is not UTF-8: {exc}") from exc


def decode_checkpoint_reply(reply: object, result: bytes) -> bytes | None:
    """checkpoint.lua's reply: the step's stored result (``result`` if ours was stored), or
    None when the record was not ours. Anything else is a :class:`StoreError`."""
    if reply == 1:
        return result
    if reply == 0:
        return None
    if isinstance(reply, bytes):
        return reply
    raise StoreError(f"unexpected reply from the checkpoint script: {reply!r:.200}")


def retry_after_seconds(retry_after: float) -> int:
    """The ``Retry-After`` header value: whole seconds, at least 1."""
    whole = int(retry_after)
    return max(1, whole + (whole < retry_after))


_FIRST_POLL: Final = 0.005
_MAX_POLL: Final = 0.25


def next_poll_delay(previous: float, remaining: float) -> float:
    """Backoff for a duplicate polling the first request (where the store cannot block on
    its end, or was woken while it is still in flight): 5 ms doubling to 250 ms.

    Never sleeps past the caller's remaining wait budget.
    """
    delay = _FIRST_POLL if previous <= 0 else min(previous * 2, _MAX_POLL)
    return max(0.0, min(delay, remaining))
