"""The exchange's state machine (idemkey/http/_transitions.py), without Redis or a server.

Every adapter runs its transitions through one :class:`Exchange`; these tests walk every state and
ask it every step: the allowed ones move it on, every other one raises ProtocolError and leaves
the exchange as it was (h11's rule), so an integration that calls a step out of order fails
loudly in its own tests instead of running an app twice or settling a record twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from idemkey import Event, IdemkeyError, Policy, StoreError
from idemkey._codec import decode_response
from idemkey._core import Claimed, InFlight, Replay
from idemkey.errors import ProtocolError
from idemkey.http import Complete, Exchange, Headers, Release, Request, Response, begin
from idemkey.http._transitions import TRANSITIONS, State

BODY = b'{"amount": 1}'


def lifecycle(policy: Policy | None = None, length: int | None = len(BODY)) -> Exchange:
    headers = [("Idempotency-Key", "k1"), ("Content-Type", "application/json")]
    if length is not None:
        headers.append(("Content-Length", str(length)))
    step = begin(policy or Policy(), Request("POST", "/charges", "", Headers(headers)))
    assert isinstance(step, Exchange)
    return step


# Every step an adapter or driver can ask, with arguments that are valid in its own state.
STEPS: dict[str, Callable[[Exchange], Any]] = {
    "announced": lambda lc: lc.announced(),
    "received": lambda lc: lc.received(BODY),
    "reject_too_large": lambda lc: lc.reject_too_large(),
    "client_left": lambda lc: lc.client_left(),
    "unreadable": lambda lc: lc.unreadable(400, "invalid_body", "the body could not be read"),
    "claiming": lambda lc: lc.claiming(),
    "decide": lambda lc: lc.decide(Claimed(lc.owner, 1, False)),
    "store_failed": lambda lc: lc.store_failed(StoreError("down")),
    "response_lost": lambda lc: lc.response_lost(),
    "interrupted": lambda lc: lc.interrupted(),
    "started": lambda lc: lc.started(201, [("Content-Type", "application/json")]),
    "finish": lambda lc: lc.finish(b"{}"),
    "fail": lambda lc: lc.fail("the handler raised"),
    "settled": lambda lc: lc.settled(True),
    "settle_failed": lambda lc: lc.settle_failed(StoreError("down")),
}

# The path to each state, as steps from a new lifecycle.
PATHS: dict[State, list[str]] = {
    State.READING: [],
    State.READY: ["received"],
    State.CLAIMING: ["received", "claiming"],
    State.RUNNING: ["received", "claiming", "decide"],
    State.SENDING: ["received", "claiming", "decide", "started"],
    State.SETTLING: ["received", "claiming", "decide", "started", "finish"],
    State.DONE: ["received", "claiming", "decide", "started", "finish", "settled"],
    State.UNPROTECTED: ["received", "claiming", "store_failed"],
}

ALLOWED: dict[State, set[str]] = {
    State.READING: {"announced", "received", "reject_too_large", "client_left", "unreadable"},
    State.READY: {"claiming"},
    State.CLAIMING: {"decide", "store_failed", "interrupted", "response_lost"},
    State.RUNNING: {"started", "fail"},
    State.SENDING: {"finish", "fail"},
    State.SETTLING: {"settled", "settle_failed"},
    State.DONE: set(),
    State.UNPROTECTED: set(),
}


def reach(state: State, policy: Policy | None = None) -> Exchange:
    lc = lifecycle(policy or Policy(on_store_error="open"))
    for step in PATHS[state]:
        STEPS[step](lc)
    assert lc.state is state
    return lc


def test_every_state_is_reachable_and_tested() -> None:
    assert set(PATHS) == set(ALLOWED) == set(State)


@pytest.mark.parametrize("state", list(State), ids=lambda s: s.name)
@pytest.mark.parametrize("step", list(STEPS))
def test_a_step_out_of_order_raises_and_changes_nothing(state: State, step: str) -> None:
    lc = reach(state)
    if step in ALLOWED[state]:
        STEPS[step](lc)  # allowed: it runs
        return
    before = (lc.state, lc.owner, lc.plan)
    with pytest.raises(ProtocolError) as raised:
        STEPS[step](lc)
    assert (lc.state, lc.owner, lc.plan) == before
    assert raised.value.state == state.value
    assert isinstance(raised.value, IdemkeyError)


@pytest.mark.parametrize("state", list(State), ids=lambda s: s.name)
def test_the_table_alone_decides_what_is_allowed(state: State) -> None:
    """With the transition table emptied, every step in every state is refused before it
    reports anything: no method checks its state by hand beside the table."""
    events: list[Event] = []
    kept: list[tuple[Any, ...]] = []
    table = dict(TRANSITIONS)
    try:
        for step in STEPS:
            lc = reach(state, Policy(on_store_error="open", on_event=events.append))
            lc.keep = lambda *entry: kept.append(entry)
            events.clear()
            TRANSITIONS.clear()
            try:
                with pytest.raises(ProtocolError):
                    STEPS[step](lc)
            finally:
                TRANSITIONS.update(table)
            assert (events, kept) == ([], []), step
    finally:
        TRANSITIONS.update(table)


def test_a_committed_effect_without_its_response_is_a_final_409() -> None:
    """The claim found the key's fenced row committed with no response recorded
    (EffectCommittedError): a 409 ``response_lost`` the client must not retry, and done."""
    lc = reach(State.CLAIMING)
    answer = lc.response_lost()
    assert answer.status == 409
    assert lc.state is State.DONE
    assert not any(name == "Retry-After" for name, _ in answer.headers)
    problem = json.loads(answer.body)
    assert (problem["code"], problem["retry"]) == ("response_lost", "never")


def test_the_whole_order_of_a_first_request_and_its_events() -> None:
    events: list[Event] = []
    lc = lifecycle(Policy(on_event=events.append))
    assert lc.announced() is None
    assert lc.received(BODY) is None
    fingerprint = lc.claiming()
    assert fingerprint == lc.fingerprint(BODY)
    assert len(lc.owner) == 32
    assert lc.decide(Claimed(lc.owner, 7, False), 0.001) is None
    assert lc.state is State.RUNNING
    lc.started(201, [("Content-Type", "application/json")])
    plan = lc.finish(b'{"id": 1}')
    assert isinstance(plan, Complete)
    assert decode_response(plan.stored).body == b'{"id": 1}'
    lc.settled(True, 0.002)
    assert lc.state is State.DONE
    assert [(e.kind, e.fence) for e in events] == [("claimed", 7), ("completed", 7)]


def test_a_retry_is_answered_and_done() -> None:
    lc = reach(State.CLAIMING)
    answer = lc.decide(InFlight(3.0))
    assert isinstance(answer, Response)
    assert answer.status == 409
    assert lc.state is State.DONE
    lc = reach(State.CLAIMING)
    unreadable = lc.decide(Replay(b"\x7fgarbage"))
    assert isinstance(unreadable, Response)
    assert unreadable.status == 503
    assert lc.state is State.DONE


def test_a_body_over_the_limit_or_shorter_than_declared_is_refused_before_the_claim() -> None:
    declared_too_large = lifecycle(Policy(max_request_bytes=4))
    answer = declared_too_large.announced()
    assert isinstance(answer, Response)
    assert answer.status == 413
    assert declared_too_large.state is State.DONE

    read_too_large = lifecycle(Policy(max_request_bytes=4), length=None)
    assert read_too_large.announced() is None
    answer = read_too_large.received(b"12345")
    assert isinstance(answer, Response)
    assert answer.status == 413

    short = lifecycle(length=len(BODY) + 5)
    answer = short.received(BODY)
    assert isinstance(answer, Response)
    assert (answer.status, short.state) == (400, State.DONE)
    assert b"incomplete_body" in answer.body
    with pytest.raises(ProtocolError):
        short.claiming()  # never run on half a body


def test_the_store_failing_closed_is_a_503_and_open_runs_unprotected() -> None:
    closed = reach(State.CLAIMING, Policy(on_store_error="closed"))
    answer = closed.store_failed(StoreError("down"))
    assert isinstance(answer, Response)
    assert (answer.status, closed.state) == (503, State.DONE)
    opened = reach(State.CLAIMING, Policy(on_store_error="open"))
    assert opened.store_failed(StoreError("down")) is None
    assert opened.unprotected


def test_an_unreadable_body_is_answered_and_nothing_is_claimed() -> None:
    lc = lifecycle()
    answer = lc.unreadable(400, "invalid_body", "the body could not be read (OSError)")
    assert (answer.status, lc.state, lc.owner) == (400, State.DONE, "")
    assert b'"invalid_body"' in answer.body


def test_the_reason_phrase_is_stored_with_the_response() -> None:
    lc = reach(State.RUNNING)
    lc.started(201, [("Content-Type", "application/json")], "Charged OK")
    plan = lc.finish(b"{}")
    assert isinstance(plan, Complete)
    assert decode_response(plan.stored).reason == "Charged OK"


def test_a_failure_before_the_response_started_releases_the_key() -> None:
    lc = reach(State.RUNNING)
    plan = lc.fail("the handler raised")
    assert plan == Release("the handler raised")


@pytest.mark.parametrize(("status", "kept"), [(201, True), (402, True), (500, False), (404, False)])
def test_a_failure_after_the_response_started_keeps_a_stored_status(
    status: int, kept: bool
) -> None:
    """The head went out: the work is done, so the record completes without its body (or is
    released when its status is one the policy never stores)."""
    lc = reach(State.RUNNING)
    lc.started(status, [("Content-Type", "text/plain"), ("X-Id", "7")])
    plan = lc.fail("the client left mid-body")
    if not kept:
        assert isinstance(plan, Release)
        return
    assert isinstance(plan, Complete)
    stored = decode_response(plan.stored)
    assert (stored.status, stored.body, stored.body_kept) == (status, b"", False)
    assert stored.headers == (("Content-Type", "text/plain"), ("X-Id", "7"))


@pytest.mark.parametrize("end", ["finish", "fail"])
def test_an_unreadable_head_is_never_stored(end: str) -> None:
    # finish() inlines what fail() asks _outcome: both must release an unreadable head.
    lc = reach(State.RUNNING)
    lc.started(201, None)
    plan = lc.finish(b"{}") if end == "finish" else lc.fail("the client left mid-body")
    assert isinstance(plan, Release)
    assert plan.reason == "the app's status or headers are not valid: nothing to replay"


def test_an_interrupted_claim_is_released_and_reported() -> None:
    events: list[Event] = []
    lc = reach(State.CLAIMING, Policy(on_event=events.append))
    assert lc.interrupted() == Release("cancelled while claiming")
    lc.settled(False)  # the claim never reached Redis: the release found nothing of ours
    assert [e.kind for e in events] == ["lease_lost"]


@pytest.mark.parametrize(
    ("finished", "detail"), [(True, "response not stored"), (False, "key not released")]
)
def test_a_store_failure_while_settling_is_reported_not_raised(finished: bool, detail: str) -> None:
    events: list[Event] = []
    lc = reach(State.RUNNING, Policy(on_event=events.append))
    if finished:
        lc.started(201, [])
        lc.finish(b"{}")
    else:
        lc.fail("the handler raised")
    lc.settle_failed(StoreError("Redis went away"))
    assert lc.state is State.DONE
    assert events[-1].kind == "store_error"
    assert events[-1].detail.startswith(detail)
    assert events[-1].fence == 1
