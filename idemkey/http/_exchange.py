"""The exchange's decisions: one :class:`Exchange` per keyed request (no I/O).

It makes every HTTP decision of docs/design.md#http-decisions and owns their order, one
transition at a time as an h11 connection does (the table is in ``_transitions``): whether the
body may be claimed, what the claim's answer means, what the record is settled with, and what
each step reports (events, uncertain outcomes). The answers it sends are built in ``_answers``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import msgspec

from .._codec import decode_response
from .._core import (
    Claimed,
    Expired,
    ExpiringDecision,
    InFlight,
    Mismatch,
    Replay,
    new_owner,
    record_origin,
)
from ..errors import ProtocolError, RecordFormatError, StoreError
from ..events import DEBUG, Reporting, enabled_memo, lease_lost_detail
from ..guard._call import Call, leave_current, run_as_current
from ._answers import (
    RESPONSE_LOST,
    UNREADABLE_HEAD,
    first_headers,
    in_flight,
    key_expired,
    key_reused,
    plan_for,
    record_unreadable,
    replayed,
    response_lost,
    store_unavailable,
    too_large,
)
from ._fingerprint import request_fingerprint
from ._messages import Complete, Release, Request, Response
from ._problems import render
from ._transitions import TRANSITIONS, State

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._core import Record
    from ..events import Event, Keep
    from ..policy import Policy

__all__ = ["Exchange"]


class Exchange(msgspec.Struct, Reporting, eq=False):
    """One keyed request, from its body to its settled record. No I/O: the driver does that.

    One object in h11's shape: it makes every decision and owns their order. Each public
    method is a transition of :data:`~._transitions.TRANSITIONS`; one asked in the wrong state
    raises :class:`~idemkey.errors.ProtocolError` and changes nothing. ``state`` is where the
    request is, ``owner`` the claim's owner token (set by :meth:`claiming`), ``declared`` the
    request's Content-Length, ``origin`` what the claim keeps of where its record comes from
    (set by :meth:`claiming`), ``call`` the claimed call while the app runs (what
    ``idemkey.current_call()`` returns; when the app runs unprotected, a call with no fence
    until the adapter calls :meth:`unprotected_ended`), ``unprotected`` whether the store
    failed and the policy said run anyway, ``plan`` what the record is settled with. As a
    :class:`~idemkey.events.Reporting`, it reports its events and uncertain outcomes
    (``keep``: the driver's ``store.keep_uncertain``).

    Built by :func:`~idemkey.http.begin`, which works its fields out of the request: a Struct
    (compared by identity), so its fields are set in C, the defaults included, where an
    ``__init__`` would set each one in a Python step on every keyed request.
    """

    policy: Policy
    request: Request
    _key: str
    scope: str
    method: str
    #: The route the record is named by: the template, else the concrete path.
    route: str
    #: The template, never the concrete path: a metric label must stay bounded.
    label: str
    record: Record
    hook: Callable[[Event], None] | None
    declared: int | None
    keep: Keep | None = None  # the driver's store.keep_uncertain, once it claims
    state: State = State.READING
    claim: Claimed | None = None
    unprotected: bool = False
    owner: str = ""
    origin: str = ""
    plan: Complete | Release | None = None
    call: Call[Any] | None = None
    _fingerprint: bytes = b""
    _head: tuple[int, list[tuple[str, str]], str] | None = None

    def __repr__(self) -> str:
        # Not the Struct's field-by-field repr: the key and the request's headers (credentials
        # among them) are client input, and never leave idemkey in a log line.
        return f"<Exchange {self.method} {self.label} {self.record.digest}: {self.state.value}>"

    # Each transition looks up its (state, transition) pair once: ``TRANSITIONS.get(...) or
    # self._refuse(transition)`` gives the next state or raises, and the state moves only once
    # the transition's work succeeded.

    def _refuse(self, transition: str) -> NoReturn:
        raise ProtocolError(self.state.value, transition)

    def _move(self, transition: str) -> None:
        self.state = TRANSITIONS.get((self.state, transition)) or self._refuse(transition)

    # READING: the request body.

    def announced(self) -> Response | None:
        """Before reading: the 413 to send when the declared length is over the limit."""
        if (self.state, "announce") not in TRANSITIONS:  # READING stays READING
            self._refuse("announce")
        if self.declared is not None and self.declared > self.policy.max_request_bytes:
            return self.reject_too_large()
        return None

    def received(self, body: bytes) -> Response | None:
        """The body as read (at most ``max_request_bytes + 1`` bytes): None to claim next, or
        the 413 (over the limit) or 400 (shorter than its Content-Length) to send instead.
        Never run on half a body: its fingerprint would match no honest retry."""
        ready = TRANSITIONS.get((self.state, "receive")) or self._refuse("receive")
        if len(body) > self.policy.max_request_bytes:
            return self.reject_too_large()
        declared = self.declared
        if declared is not None and len(body) < declared:
            self._move("reject")
            detail = f"the body ended after {len(body)} of {declared} bytes"
            return render(self.policy, 400, "incomplete_body", detail)
        self._fingerprint = request_fingerprint(self.policy, self.request, body)
        self.state = ready
        return None

    def reject_too_large(self) -> Response:
        """The 413 for a body over ``max_request_bytes`` (however the adapter found out)."""
        self._move("reject")
        self.notify("too_large", detail="request body over max_request_bytes")
        return too_large(self.policy)

    def unreadable(self, status: int, code: str, detail: str) -> Response:
        """The body cannot be fingerprinted (the server could not read it, or something read
        it before idemkey could): the problem to send; nothing is claimed."""
        self._move("reject")
        return render(self.policy, status, code, detail)

    def client_left(self) -> None:
        """The client went away before its body was complete: nothing was claimed."""
        self._move("client_left")

    def fingerprint(self, body: bytes) -> bytes:
        """The request's fingerprint, its body compared as ``Policy.fingerprint`` says."""
        return request_fingerprint(self.policy, self.request, body)

    # READY, CLAIMING: the claim and what it means.

    def claiming(self) -> bytes:
        """The claim goes out now: returns the request's fingerprint; sets :attr:`owner` and
        :attr:`origin` (where the record comes from, kept in it for ``store.records()``)."""
        self.state = TRANSITIONS.get((self.state, "claim")) or self._refuse("claim")
        self.owner = new_owner()
        key = self._key if self.policy.keep_keys else None
        self.origin = record_origin(self.scope, self.method, self.route, key)
        return self._fingerprint

    def decide(self, decision: ExpiringDecision, seconds: float | None = None) -> Response | None:
        """The claim's answer: None to run the app (RUNNING), or the Response to send.

        ``seconds``: how long the claim took in Redis, for the events. The state moves once
        the answer is built. A replay and a claim are decided here, without another frame
        (one of them is every keyed request's answer); the refusals in :meth:`_refusal`. A
        claim is RUNNING, its call current, before its event goes out: a hook interrupted
        there (Ctrl-C in a slow export) leaves it for the driver (:meth:`hook_interrupted`).
        """
        kind = type(decision)
        transition = "claimed" if kind is Claimed else "answer"
        target = TRANSITIONS.get((self.state, transition)) or self._refuse(transition)
        if kind is Replay:
            assert isinstance(decision, Replay)
            try:
                response = decode_response(decision.response)
            except RecordFormatError as exc:
                self.notify("store_error", detail=str(exc))
                self.state = target
                return record_unreadable(self.policy, str(exc))
            if self.hook is not None or enabled_memo.get(DEBUG) is not False:  # events.quiet
                self.notify("replayed", seconds=seconds)
            answer = replayed(self.policy, response)
            self.state = target
            return answer
        if kind is not Claimed:
            answer = self._refusal(decision, seconds)
            self.state = target
            return answer
        assert isinstance(decision, Claimed)
        self.claim = decision
        self.state = target
        # The handler reaches its fence through idemkey.current_call() (a fenced SQL
        # transaction, a downstream write); no longer current once the response settles.
        self.call = Call(
            replayed=False,
            fence=decision.fence,
            takeover=decision.takeover,
            record=self.record,
            ttl_ms=self.policy.ttl_ms,
            fingerprint=self._fingerprint,
        )
        run_as_current(self.call)
        if decision.takeover:
            self.uncertain("takeover", decision.fence)  # kept before the hook hears of it
            self.notify("takeover", decision.fence, seconds=seconds)
        elif self.hook is not None or enabled_memo.get(DEBUG) is not False:
            self.notify("claimed", decision.fence, seconds=seconds)
        return None

    def store_failed(self, exc: StoreError) -> Response | None:
        """The claim failed in Redis: the 503 to send, or None to run the app unprotected."""
        transition = "run_unprotected" if self.policy.on_store_error == "open" else "answer"
        target = TRANSITIONS.get((self.state, transition)) or self._refuse(transition)
        answer = self._failed(exc)
        self.state = target
        self.unprotected = answer is None
        if answer is None:
            # The app's current_call() is a call with no fence, whose fenced work refuses to
            # run (UnprotectedCallError), until the adapter says the app ended (unprotected_ended).
            self.call = Call(replayed=False)
            run_as_current(self.call)
        return answer

    def unprotected_ended(self) -> None:
        """The app that ran unprotected returned or raised: its call is no longer current (a
        thread that serves the next request must not see it)."""
        if self.call is not None:
            leave_current(self.call)

    def response_lost(self) -> Response:
        """The key's fenced transaction committed, but its response was never recorded (the
        process stopped between the COMMIT and the write): the handler does not run again, and
        every retry gets this 409 (no Retry-After: retrying cannot help)."""
        self._move("answer")
        self.notify("store_error", detail=RESPONSE_LOST)
        return response_lost(self.policy)

    def interrupted(self) -> Release:
        """The claim was cut off (a cancellation) after it may have reached Redis: release it,
        or retries get 409 until the lease lapses (a release that is not ours changes nothing)."""
        self._move("interrupted")
        plan = self.plan = Release("cancelled while claiming")
        return plan

    def _failed(self, exc: StoreError) -> Response | None:
        """Redis failed before the handler ran: 503 (fail closed) or ``None`` to run it open."""
        if isinstance(exc, RecordFormatError):
            # Redis answered, with a record idemkey cannot read (the claim gave it back): as a
            # replay's unreadable record, never a run beside it, whatever on_store_error says.
            self.notify("store_error", detail=str(exc))
            return record_unreadable(self.policy, str(exc))
        if self.policy.on_store_error == "open":
            self.uncertain("unprotected", None, str(exc))  # kept before the hook hears of it
            self.notify("unprotected", detail=str(exc))
            return None
        self.notify("store_error", detail=str(exc))
        return store_unavailable(self.policy)

    def _refusal(self, decision: ExpiringDecision, seconds: float | None) -> Response:
        """What an expired, reused or in-flight key answers: 410, 422 (``mismatch_status``), 409."""
        kind = type(decision)
        if kind is Expired:
            assert isinstance(decision, Expired)
            self.notify("expired")
            return key_expired(self.policy, decision.completed_at)
        if kind is Mismatch:
            self.notify("mismatch", seconds=seconds)
            return key_reused(self.policy)
        assert isinstance(decision, InFlight)
        self.notify("in_flight", seconds=seconds)
        return in_flight(self.policy, decision.retry_after)

    def first_headers(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]] | None:
        """The headers to send on the app's own answer instead of ``headers``, when the policy
        adds some (``mark_first_responses``, ``retention_header``); None: send them as they
        are. ``headers`` is not changed: what is stored and replayed is the app's answer."""
        policy = self.policy
        if not policy.mark_first_responses and policy.retention_header is None:
            return None
        return first_headers(policy, headers)

    # RUNNING, SENDING: the app's answer.

    def started(self, status: int, headers: list[tuple[str, str]] | None, reason: str = "") -> None:
        """The response's status and headers went out; ``headers`` None: they were not valid
        (not latin-1 text), so the record is never completed with them. ``reason``: the status
        line's reason phrase (WSGI, Flask), stored to be replayed as it was sent."""
        self.state = TRANSITIONS.get((self.state, "start")) or self._refuse("start")
        self._head = (status, headers, reason) if headers is not None else None

    def finish(self, body: bytes | None) -> Complete | Release:
        """The response is complete: store it (``body`` None: without its body) or release."""
        settling = TRANSITIONS.get((self.state, "finish")) or self._refuse("finish")
        if self.call is not None:
            leave_current(self.call)
        head = self._head
        plan = self.plan = (
            plan_for(self.policy, head[0], head[1], body, head[2])
            if head is not None
            else UNREADABLE_HEAD
        )
        self.state = settling
        return plan

    def fail(self, reason: str) -> Complete | Release:
        """The app raised, was cancelled, or stopped before its response was complete.

        Before ``started``: release, so a retry runs again. After: the client may have the
        answer, and the work is done; complete without the body (or release, when the status
        is one the policy never stores).
        """
        settling = TRANSITIONS.get((self.state, "fail")) or self._refuse("fail")
        if self.call is not None:
            leave_current(self.call)
        head = self._head
        if self.state is not State.SENDING:
            plan: Complete | Release = Release(reason)
        elif head is None:
            plan = UNREADABLE_HEAD
        else:
            plan = plan_for(self.policy, head[0], head[1], None, head[2])
        self.plan = plan
        self.state = settling
        return plan

    def hook_interrupted(self) -> Release | None:
        """The claim's on_event hook was interrupted (Ctrl-C, an exit, a cancel), the app not
        run: the Release to send at once, as for a claim whose reply was cut off (a retry runs
        the app, no entry). None for a takeover, kept to lapse as :meth:`cancelled` says: the
        earlier executor's work is unknown, and a release would let the retry run unwarned."""
        if self.claim is not None and self.claim.takeover:
            self.cancelled()
            return None
        plan = self.fail("on_event hook interrupted before the app ran")
        assert isinstance(plan, Release)  # RUNNING: nothing was sent
        return plan

    def cancelled(self) -> None:
        """The app was cancelled before its response started (a server that cancels the
        request when its client leaves): what it did is unknown, so the key is not released.
        The driver stops renewing the claim, which holds retries off (409 or a wait) until its
        lease lapses; the retry after it takes it over. An ``uncertain`` entry says so."""
        self._move("cancelled")
        if self.call is not None:
            leave_current(self.call)
        fence = self.claim.fence if self.claim else None
        detail = f"the key is held until its lease lapses ({self.policy.lease_ms} ms)"
        self.uncertain("cancelled", fence, detail)

    # SETTLING: what the store said.

    def settled(self, ok: bool, seconds: float | None = None, record_lost: bool = False) -> None:
        """The complete or release script answered (``ok`` False: the record was not ours;
        ``record_lost``: it vanished under the claim, evicted, rather than taken over)."""
        plan = self.plan
        self.state = TRANSITIONS.get((self.state, "settle")) or self._refuse("settle")
        fence = self.claim.fence if self.claim else None
        if not ok:
            # A committed fenced row holds the handler's effect all the same (and its response,
            # once the driver recorded it there): a retry does not run it again.
            committed = self.call.committed_row() if self.call is not None else None
            why = lease_lost_detail(record_lost, committed)
            self.uncertain("lease_lost", fence, why)  # kept before the hook hears of it
            self.notify("lease_lost", fence, why)
        elif isinstance(plan, Complete):
            if self.hook is not None or enabled_memo.get(DEBUG) is not False:  # events.quiet
                self.notify("completed", fence, seconds=seconds)
        else:
            assert plan is not None
            self.notify("released", fence, plan.reason, seconds)

    def settle_failed(self, exc: StoreError) -> None:
        """Redis failed while settling: reported, never raised (the client has its answer)."""
        self._move("settle")
        fence = self.claim.fence if self.claim else None
        if isinstance(self.plan, Complete):
            detail = f"response not stored: {exc}"
            self.uncertain("completion_failed", fence, detail)  # kept before the hook hears
        else:
            detail = f"key not released (its lease will lapse): {exc}"
        self.notify("store_error", fence, detail)
