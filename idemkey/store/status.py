"""What ``store.records()`` and ``store.record()`` answer: one record's status, decoded.

Sans-IO: the store reads a page of records (per record ``HMGET`` of :data:`FIELDS` and the
``PTTL`` of its hash, and the server's ``TIME`` once: the lease is a deadline on that clock),
then, only where needed, ``HKEYS`` of records with finished steps and the ``PTTL`` of 0.2's lock
string for a claim 0.2 wrote; :func:`status_fields` names the ``HMGET`` reply and
:func:`decode_status` turns it into a :class:`RecordStatus`. A record's name is a
one-way digest of scope, method, route and key, so the route, method, scope and the client's key
come from the origin a claim keeps in fields ``"i"``, ``"i1"`` ... (claim.lua,
:mod:`idemkey._core._origin`) until the record completes (complete.lua drops it unless
``Policy.keep_key_after_completion``: a completed record stays within its memory goal). A
completed record, or one claimed before idemkey kept an origin, has them empty and no age.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple

from .._core import parse_record_name, record_pattern
from .._core._origin import ORIGIN_FIELDS, decode_origin, escape_lines, printable_text
from .._core._stored import stored_int
from ..errors import ConfigurationError
from ._durable import _REDIRECTS
from .diagnostics import _text as text

__all__ = [
    "FIELDS",
    "NAMED_FIELDS",
    "STATES",
    "WIRE_FIELDS",
    "RecordState",
    "RecordStatus",
    "StatusFields",
    "decode_status",
    "lease_left_ms",
    "pttl_ms",
    "record_pattern",
    "redirected",
    "server_ms",
    "status_fields",
    "wanted",
]

#: ``in_progress``: a live claim holds the lease; ``lapsed``: in progress, but the lease ran
#: out (a crashed or stalled owner; the next claim takes it over); ``complete``: the answer is
#: stored and replayed; ``released``: the claim gave up (the work failed), a retry runs afresh
#: (after the finished steps, if any).
RecordState = Literal["in_progress", "lapsed", "complete", "released"]
STATES: Final[tuple[RecordState, ...]] = ("in_progress", "lapsed", "complete", "released")


def _states(state: str | Collection[str] | None) -> frozenset[str] | None:
    """``records(state=...)`` as a set, every name checked: a typo must not list nothing."""
    if state is None:
        return None
    states = frozenset((state,) if isinstance(state, str) else state)
    unknown = sorted(states.difference(STATES))
    if unknown:
        raise ConfigurationError(f"unknown record state {unknown}: use one of {list(STATES)}")
    return states


class StatusFields(NamedTuple):
    """The hash fields a status reads of one record, by name (values as ``HMGET`` answers
    them: bytes, or None for a field the record lacks). Not the stored answer (it may be
    large): a record with neither state nor fence is complete."""

    state: object
    fence: object
    owner: object
    #: ``tk``: 1 after a takeover.
    takeover: object
    #: ``ns``: how many steps finished (checkpoint.lua), named by their ``s:<name>`` fields.
    steps: object
    #: The lease's deadline on the server's clock (claim.lua); none for a claim 0.2 wrote.
    lease: object
    #: ``fp``: the fingerprint (a completed record's only field besides ``resp``).
    fingerprint: object
    #: The values of ``ORIGIN_FIELDS`` (empty when not read).
    origin: tuple[object, ...] = ()


#: The hash field behind each of :class:`StatusFields`' names, in its order, but the origin.
NAMED_FIELDS: Final = ("state", "fence", "owner", "tk", "ns", "lease", "fp")
#: What a status reads (``HMGET key *FIELDS``): :data:`NAMED_FIELDS`, then the origin's pieces.
FIELDS: Final = (*NAMED_FIELDS, *ORIGIN_FIELDS)
#: :data:`FIELDS` as a page's pipeline sends them: redis-py passes bytes on without encoding
#: each again (23 per record, and a listing may read 100 000 records).
WIRE_FIELDS: Final = tuple(name.encode() for name in FIELDS)
_NAMED: Final = len(NAMED_FIELDS)


def status_fields(reply: Sequence[object]) -> StatusFields:
    """The reply of ``HMGET key *FIELDS`` (or ``*NAMED_FIELDS``: no origin), by name."""
    return StatusFields._make((*reply[:_NAMED], tuple(reply[_NAMED:])))


@dataclass(frozen=True, slots=True)
class RecordStatus:
    """One record as an operator sees it.

    ``lease_left``, ``ttl_left`` and ``age`` are seconds (``None``: no lease, no TTL, or no
    origin kept); ``age`` counts from the claim behind the record's present state, and
    ``claimed_at`` is that claim's Unix time; both are ``None`` for a completed record.
    ``steps`` names the finished steps of a record in progress, lapsed or released (a completed
    record drops them). ``fence`` is the last claim's
    fencing token (a completed record drops it: ``None``). ``method``, ``route`` and ``scope``
    are ``""`` for a completed record and for one whose claim kept no origin (idemkey before
    0.3, or a caller of ``store.claim`` that passed none): a ``route`` or ``scope`` filter
    never matches them. ``client_key`` is the key the client sent, escaped
    (:func:`idemkey._core._origin.escape_key`: printable, no white space; ``""`` when not kept:
    ``Policy(keep_keys=False)``, a completed record without
    ``Policy(keep_key_after_completion=True)``, or a record claimed before 0.3.1);
    ``key_cut``: only its beginning was kept (the origin is cut after 1 KiB).
    """

    key: str
    digest: str
    state: RecordState
    fence: int | None = None
    lease_left: float | None = None
    ttl_left: float | None = None
    age: float | None = None
    claimed_at: float | None = None
    steps: tuple[str, ...] = ()
    takeover: bool = False
    owner: str = ""
    method: str = ""
    route: str = ""
    scope: str = ""
    client_key: str = ""
    key_cut: bool = False


def decode_status(
    key: bytes | str,
    fields: StatusFields | Sequence[object],
    ttl_ms: int,
    lease_ms: int,
    hash_keys: Sequence[bytes] = (),
    now: float | None = None,
) -> RecordStatus | None:
    """The status of the record at ``key`` from its :class:`StatusFields` (or the reply of
    ``HMGET key *FIELDS``), its ``PTTL``, what is left of its lease (:func:`lease_left_ms`)
    and (when it has steps) ``HKEYS``; ``None`` when there is no record (it expired since the
    SCAN, or the key is not an idemkey record's hash)."""
    name = parse_record_name(key)
    if ttl_ms == -2 or name is None or name.hint:
        return None
    if not isinstance(fields, StatusFields):
        fields = status_fields(fields)
    state: RecordState
    if fields.state == b"in_progress":
        state = "in_progress" if lease_ms > 0 else "lapsed"
    elif fields.fence is not None and fields.state is None:
        state = "released"  # a released record keeps its fence; complete.lua drops it
    else:
        state = "complete"  # "resp" and "fp" only (state "complete": written before 0.2)
    origin = decode_origin(fields.origin)
    # A completed record kept its origin only when told (keep_key_after_completion): its
    # claim's time is not its age.
    at = origin.at if state != "complete" else None
    now = time.time() if now is None else now
    return RecordStatus(
        key=text(key),
        digest=name.digest,
        state=state,
        fence=stored_int(text(fields.fence)),
        lease_left=lease_ms / 1000 if lease_ms > 0 else None,
        ttl_left=ttl_ms / 1000 if ttl_ms >= 0 else None,
        age=max(0.0, now - at) if at is not None else None,
        claimed_at=at,
        steps=tuple(sorted(text(k)[2:] for k in hash_keys if k[:2] == b"s:")),
        takeover=fields.takeover == b"1",
        owner=text(fields.owner) if state in ("in_progress", "lapsed") else "",
        method=origin.method,
        route=origin.route,
        scope=origin.scope,
        client_key=origin.key,
        key_cut=origin.cut,
    )


def server_ms(time_reply: object) -> int | None:
    """The server's clock in Unix ms from a ``TIME`` reply, None when the reply is not one
    (a part that is not ASCII digits: ``str.isdigit`` passes ``"²"``, which ``int`` refuses)."""
    if isinstance(time_reply, (list, tuple)) and len(time_reply) == 2:
        seconds, micros = (stored_int(text(part)) for part in time_reply)
        if seconds is not None and micros is not None:
            return seconds * 1000 + micros // 1000
    return None


def pttl_ms(reply: object) -> int:
    """A ``PTTL`` reply: ms left, -1 for no TTL, -2 for no key. Redis answers an integer;
    anything else (a server that is not Redis) is a TTL not known, -1: the record is still
    listed, never a ValueError."""
    return reply if isinstance(reply, int) else -1


def redirected(*replies: object) -> bool:
    """Whether a cluster node answered "not here (now)" to any of ``replies`` (MOVED, ASK
    and the like: ``_durable._REDIRECTS``): the keys are read again through the cluster."""
    return any(type(reply).__name__ in _REDIRECTS for reply in replies)


def lease_left_ms(deadline: object, legacy_pttl: object, now_ms: int | None) -> int:
    """Milliseconds left of a record's lease, -2 when it has none or it lapsed, from its field
    "lease" (the deadline on the server's clock, claim.lua) and the server's clock. A claim
    written by 0.2 has no such field and keeps its lease in the lock string instead, whose
    ``PTTL`` is ``legacy_pttl`` (reading 0.2 claims: remove in 0.4)."""
    at = stored_int(text(deadline))
    if at is not None and now_ms is not None:
        left = at - now_ms
    else:
        left = int(legacy_pttl) if isinstance(legacy_pttl, int) else -2
    return left if left > 0 else -2


def wanted(
    status: RecordStatus,
    states: Collection[str] | None,
    route: str | None,
    scope: str | None,
    method: str | None,
) -> bool:
    """Whether ``status`` passes the filters of ``store.records()`` (``None``: any)."""
    return (
        (states is None or status.state in states)
        and (route is None or _named(status.route, route))
        and (scope is None or _named(status.scope, scope))
        and (method is None or status.method == method)
    )


def _named(kept: str, wanted: str) -> bool:
    """Whether a record's route or scope is the one a filter names: as given, or as
    ``idemkey list`` prints it (``acme%20corp`` for a scope with a space)."""
    return kept == escape_lines(wanted) or printable_text(kept) == wanted
