"""The order of one keyed HTTP exchange, as an explicit state machine (no I/O).

:class:`~idemkey.http.Exchange` makes every HTTP decision; :class:`Lifecycle` owns the order in
which they are asked, so no adapter can run the app before the claim, settle twice, or release a
response that already went out. The drivers (``_async_driver``, ``_sync_driver``) do the store
I/O around it and adapters only move bytes. Like h11's connection states, each transition is
one entry of a table, and a transition asked in the wrong state raises
:class:`~idemkey.errors.ProtocolError` without changing anything::

    READING --received(ok)--> READY --claiming--> CLAIMING --decide(Claimed)--> RUNNING
       |  received(413/400), unreadable, client_left |  decide(replay, 409, 422)     |
       +--------------------------------------> DONE <-- store_failed (closed)       |
                                                     |  store_failed (open) -> UNPROTECTED
    RUNNING --started--> SENDING --finish--> SETTLING --settled/settle_failed--> DONE
    RUNNING, SENDING --fail--> SETTLING;   CLAIMING --interrupted--> SETTLING (a release)

The one rule that lives here rather than in ``Exchange``: once the response's status and
headers went out (``started``), the key is never released by a failure. ``fail`` then completes
the record without its body, as ``finish`` would with an incomplete body, so a retry gets the
first answer's status and headers (``Idempotent-Body-Not-Kept``) instead of a second run.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Final, NoReturn

from .._core import Claimed, Decision, new_owner
from ..errors import ProtocolError
from ..guard._call import Call, leave_current, run_as_current
from . import Complete, Release, parse_content_length, render

if TYPE_CHECKING:
    from ..errors import StoreError
    from . import Exchange, Response

__all__ = ["Lifecycle", "State"]


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
_NEXT: Final[dict[tuple[State, str], State]] = {
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
    (_S.SENDING, "finish"): _S.SETTLING,
    (_S.SENDING, "fail"): _S.SETTLING,
    (_S.SETTLING, "settle"): _S.DONE,
}

_UNREADABLE_HEAD: Final = Release("the app's status or headers are not valid: nothing to replay")


class Lifecycle:
    """One keyed request, from its body to its settled record; see the module docstring.

    ``exchange`` makes the decisions, ``state`` is where the request is, ``owner`` the claim's
    owner token (set by :meth:`claiming`), ``declared`` the request's Content-Length.
    """

    __slots__ = (
        "_fingerprint",
        "_head",
        "_limit",
        "call",
        "declared",
        "exchange",
        "owner",
        "plan",
        "state",
        "unprotected",
    )

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.state = State.READING
        # content_length(headers), without its call
        values = exchange.request.headers.get_all("content-length")
        self.declared = parse_content_length(values[0]) if values else None
        #: The store failed and the policy said run anyway: the app runs without a record.
        self.unprotected = False
        # Exchange.too_large's limit, read once: the body is checked against it twice.
        self._limit = exchange.policy.max_request_bytes
        self.owner = ""
        self.plan: Complete | Release | None = None
        #: The claimed call while the app runs (``idemkey.current_call()``), else None.
        self.call: Call[Any] | None = None
        self._fingerprint = b""
        self._head: tuple[int, list[tuple[str, str]], str] | None = None

    # Each method looks up its (state, transition) pair once: ``_NEXT.get(...) or
    # self._refuse(transition)`` gives the next state or raises, and the state moves only once
    # the method's work succeeded.

    def _refuse(self, transition: str) -> NoReturn:
        raise ProtocolError(self.state.value, transition)

    def _move(self, transition: str) -> None:
        self.state = _NEXT.get((self.state, transition)) or self._refuse(transition)

    # READING: the request body.

    def announced(self) -> Response | None:
        """Before reading: the 413 to send when the declared length is over the limit."""
        if self.state is not State.READING:
            self._refuse("reject")
        if self.declared is not None and self.declared > self._limit:
            return self.reject_too_large()
        return None

    def received(self, body: bytes) -> Response | None:
        """The body as read (at most ``max_request_bytes + 1`` bytes): None to claim next, or
        the 413 (over the limit) or 400 (shorter than its Content-Length) to send instead.
        Never run on half a body: its fingerprint would match no honest retry."""
        ready = _NEXT.get((self.state, "receive")) or self._refuse("receive")
        exchange = self.exchange
        if len(body) > self._limit:
            return self.reject_too_large()
        declared = self.declared
        if declared is not None and len(body) < declared:
            self._move("reject")
            detail = f"the body ended after {len(body)} of {declared} bytes"
            return render(exchange.policy, 400, "incomplete_body", detail)
        self._fingerprint = exchange.fingerprint(body)
        self.state = ready
        return None

    def reject_too_large(self) -> Response:
        """The 413 for a body over ``max_request_bytes`` (however the adapter found out)."""
        self._move("reject")
        return self.exchange.too_large_response()

    def unreadable(self, status: int, code: str, detail: str) -> Response:
        """The body cannot be fingerprinted (the server could not read it, or something read
        it before idemkey could): the problem to send; nothing is claimed."""
        self._move("reject")
        return render(self.exchange.policy, status, code, detail)

    def client_left(self) -> None:
        """The client went away before its body was complete: nothing was claimed."""
        self._move("client_left")

    # READY, CLAIMING: the claim and what it means.

    def claiming(self) -> bytes:
        """The claim goes out now: returns the request's fingerprint; sets :attr:`owner`."""
        self.state = _NEXT.get((self.state, "claim")) or self._refuse("claim")
        self.owner = new_owner()
        return self._fingerprint

    def decide(self, decision: Decision, seconds: float | None = None) -> Response | None:
        """The claim's answer: None to run the app (RUNNING), or the Response to send."""
        transition = "claimed" if type(decision) is Claimed else "answer"
        target = _NEXT.get((self.state, transition)) or self._refuse(transition)
        answer = self.exchange.decide(decision, seconds)
        self.state = target
        if type(answer) is Claimed:
            # The handler reaches its fence through idemkey.current_call() (a fenced SQL
            # transaction, a downstream write); no longer current once the response settles.
            self.call = Call(
                replayed=False,
                fence=answer.fence,
                takeover=answer.takeover,
                record=self.exchange.record,
                ttl_ms=self.exchange.policy.ttl_ms,
            )
            run_as_current(self.call)
            return None
        assert not isinstance(answer, Claimed)
        return answer

    def store_failed(self, exc: StoreError) -> Response | None:
        """The claim failed in Redis: the 503 to send, or None to run the app unprotected."""
        if self.state is not State.CLAIMING:
            self._refuse("answer")
        answer = self.exchange.store_failed(exc)
        self._move("answer" if answer is not None else "run_unprotected")
        self.unprotected = answer is None
        return answer

    def interrupted(self) -> Release:
        """The claim was cut off (a cancellation) after it may have reached Redis: release it,
        or retries get 409 until the lease lapses (a release that is not ours changes nothing)."""
        self._move("interrupted")
        plan = self.plan = Release("cancelled while claiming")
        return plan

    # RUNNING, SENDING: the app's answer.

    def started(self, status: int, headers: list[tuple[str, str]] | None, reason: str = "") -> None:
        """The response's status and headers went out; ``headers`` None: they were not valid
        (not latin-1 text), so the record is never completed with them. ``reason``: the status
        line's reason phrase (WSGI, Flask), stored to be replayed as it was sent."""
        self.state = _NEXT.get((self.state, "start")) or self._refuse("start")
        self._head = (status, headers, reason) if headers is not None else None

    def finish(self, body: bytes | None) -> Complete | Release:
        """The response is complete: store it (``body`` None: without its body) or release."""
        settling = _NEXT.get((self.state, "finish")) or self._refuse("finish")
        if self.call is not None:
            leave_current(self.call)
        head = self._head
        plan = self.plan = (
            self.exchange.finish(head[0], head[1], body, head[2])
            if head is not None
            else _UNREADABLE_HEAD
        )
        self.state = settling
        return plan

    def fail(self, reason: str) -> Complete | Release:
        """The app raised, was cancelled, or stopped before its response was complete.

        Before ``started``: release, so a retry runs again. After: the client may have the
        answer, and the work is done; complete without the body (or release, when the status
        is one the policy never stores).
        """
        settling = _NEXT.get((self.state, "fail")) or self._refuse("fail")
        if self.call is not None:
            leave_current(self.call)
        plan = self._outcome(None) if self.state is State.SENDING else Release(reason)
        self.plan = plan
        self.state = settling
        return plan

    def _outcome(self, body: bytes | None) -> Complete | Release:
        head = self._head
        if head is None:
            return _UNREADABLE_HEAD
        return self.exchange.finish(head[0], head[1], body, head[2])

    # SETTLING: what the store said.

    def settled(self, ok: bool, seconds: float | None = None, record_lost: bool = False) -> None:
        """The complete or release script answered (``ok`` False: the record was not ours;
        ``record_lost``: it vanished under the claim, evicted, rather than taken over)."""
        plan = self.plan
        self.state = _NEXT.get((self.state, "settle")) or self._refuse("settle")
        if isinstance(plan, Complete):
            self.exchange.completed(ok, seconds, record_lost)
        else:
            assert plan is not None
            self.exchange.released(plan.reason, ok, seconds, record_lost)

    def settle_failed(self, exc: StoreError) -> None:
        """Redis failed while settling: reported, never raised (the client has its answer)."""
        self._move("settle")
        exchange = self.exchange
        fence = exchange.claim.fence if exchange.claim else None
        if isinstance(self.plan, Complete):
            detail = f"response not stored: {exc}"
        else:
            detail = f"key not released (its lease will lapse): {exc}"
        exchange.notify("store_error", fence, detail)
