"""The records and decisions behind the store's methods: the extension surface.

The adapters and guards are built on four store methods, and a custom integration (another
framework, a queue consumer, a CLI) can use them the same way::

    from idemkey.records import Claimed, InFlight, Mismatch, Replay, payload_fingerprint
    from idemkey.records import new_owner, record_for

    record = record_for(store.policy.prefix, "tenant-7", "JOB", "send-invoice", key)
    decision = store.claim(record, payload_fingerprint(body), owner=new_owner())
    if type(decision) is Claimed:        # ours: do the work, then store its answer
        try:
            answer = work()
        except BaseException:
            store.release(record, decision.owner)  # nothing happened: a retry runs afresh
            raise
        store.complete(record, decision.owner, answer)  # False: taken over, or evicted
    elif type(decision) is Replay:       # done before: decision.response is the stored bytes
        ...
    elif type(decision) is InFlight:     # running elsewhere: retry in decision.retry_after s
        ...
    else:                                # Mismatch: the key was used with another request
        ...

``store.claim(record, fingerprint, *, owner, lease_ms, ttl_ms, wait, heartbeat)`` returns a
:data:`Decision`; ``store.complete(record, owner, response: bytes)``,
``store.release(record, owner)`` and ``store.renew(record, owner)`` return whether the record
was still ours. A claim is renewed by the store's heartbeat until it is completed or released;
a renewal that finds the record lost from Redis (evicted) is reported as a ``record_lost``
event and WARNING, and the claim's ``complete`` then answers False, writing nothing.

What is stored is bytes of your choosing; :class:`StoredResponse` with
:func:`encode_response` / :func:`decode_response` is the HTTP adapters' format, and
:func:`encode_value` / :func:`decode_value` the guards' (MessagePack behind a format byte).

Names:

* :class:`Record`, :func:`record_for`: the Redis name of one record (and, as a property,
  0.2's lock string beside it), named from ``(prefix, scope, method, route, key)``;
  ``method="GUARD"`` (:data:`GUARD_METHOD`) with ``route=""`` is what
  ``guard(store, key, scope=scope)`` uses.
* :func:`request_fingerprint` (an HTTP request) and :func:`payload_fingerprint` (bytes): what
  must match for a retry to be the same request, as 16 bytes (``claim`` takes any str or bytes).
* :func:`parse_key`, :data:`MAX_KEY_LENGTH`: the ``Idempotency-Key`` header's rules.
* :func:`new_owner`: a fresh owner token for a claim. A completed record keeps 12 characters of
  its owner to answer a re-sent ``complete``: the first 12 of a ``new_owner()`` token (any
  32-character owner must be random there), a hash of any other.
"""

from __future__ import annotations

from ._codec import (
    StoredResponse,
    decode_response,
    decode_value,
    encode_response,
    encode_value,
)
from ._core import (
    MAX_KEY_LENGTH,
    Claimed,
    Decision,
    Expired,
    ExpiringDecision,
    InFlight,
    Mismatch,
    Record,
    Replay,
    new_owner,
    parse_key,
    payload_fingerprint,
    record_for,
)
from ._core import fingerprint as request_fingerprint
from .guard._call import GUARD_METHOD

__all__ = [
    "GUARD_METHOD",
    "MAX_KEY_LENGTH",
    "Claimed",
    "Decision",
    "Expired",
    "ExpiringDecision",
    "InFlight",
    "Mismatch",
    "Record",
    "Replay",
    "StoredResponse",
    "decode_response",
    "decode_value",
    "encode_response",
    "encode_value",
    "new_owner",
    "parse_key",
    "payload_fingerprint",
    "record_for",
    "request_fingerprint",
]
