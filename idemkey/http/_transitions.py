"""The order of one keyed HTTP exchange, as an explicit state machine (no I/O).

:class:`~idemkey.http.Exchange` makes every HTTP decision and owns the order in which they are
asked, by this table, so no adapter can run the app before the claim, settle twice, or release
a response that already went out. The drivers (``_async_driver``, ``_sync_driver``) do the
store I/O around it and adapters only move bytes. Like h11's connection states, each transition is
one entry of a table, and a transition asked in the wrong state raises
:class:`~idemkey.errors.ProtocolError` without changing anything::

    READING --received(ok)--> READY --claiming--> CLAIMING --decide(Claimed)--> RUNNING
       |  received(413/400), unreadable, client_left |  decide(replay, 409, 422)     |
       +--------------------------------------> DONE <-- response_lost, store_failed (closed)
                                                     |  store_failed (open) -> UNPROTECTED
    RUNNING --started--> SENDING --finish--> SETTLING --settled/settle_failed--> DONE
    RUNNING, SENDING --fail--> SETTLING;   CLAIMING --interrupted--> SETTLING (a release)
    RUNNING --cancelled--> DONE (the app cancelled before its head: the claim is kept to lapse)
    READING --announced--> READING (the declared length is within the limit; over it: 413, DONE)

The table alone says what is allowed: no method compares its state by hand. A step that only
checks (``announced``) is an entry back to its own state, and one whose next state depends on
the policy (``store_failed``: a 503, or running unprotected) names its transition first.

The one rule of order rather than of content: once the response's status and
headers went out (``started``), the key is never released by a failure. ``fail`` then completes
the record without its body, as ``finish`` would with an incomplete body, so a retry gets the
first answer's status and headers (``Idempotent-Body-Not-Kept``) instead of a second run.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = ["TRANSITIONS", "State"]


class State(enum.Enum):
    READING = "reading the body"
    READY = "ready to claim"
    CLAIMING = "claiming"
    RUNNING = "running the app"
    SENDING = "sending the response"
    SETTLING = "settling the record"
    UNPROTECTED = "running unprotected"
    DONE = "done"

    # Members are singletons: hash them by identity, in C. Enum's own __hash__ is a Python call,
    # and every transition hashes its (state, transition) key.
    __hash__ = object.__hash__


_S = State
# (state, transition) -> next state. A transition missing here is out of order.
TRANSITIONS: Final[dict[tuple[State, str], State]] = {
    (_S.READING, "announce"): _S.READING,  # the declared length, checked before reading
    (_S.READING, "receive"): _S.READY,
    (_S.READING, "reject"): _S.DONE,
    (_S.READING, "client_left"): _S.DONE,
    (_S.READY, "claim"): _S.CLAIMING,
    (_S.CLAIMING, "claimed"): _S.RUNNING,
    (_S.CLAIMING, "answer"): _S.DONE,
    (_S.CLAIMING, "run_unprotected"): _S.UNPROTECTED,
    (_S.CLAIMING, "interrupted"): _S.SETTLING,
    (_S.RUNNING, "start"): _S.SENDING,
    (_S.RUNNING, "fail"): _S.SETTLING,
    (_S.RUNNING, "cancelled"): _S.DONE,
    (_S.SENDING, "finish"): _S.SETTLING,
    (_S.SENDING, "fail"): _S.SETTLING,
    (_S.SETTLING, "settle"): _S.DONE,
}
