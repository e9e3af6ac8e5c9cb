"""An on_event hook interrupted (Ctrl-C, an exit, a cancel) finds the decision already made.

The sans-IO exchange and the guards' state move first and report last: a hook that raises a
BaseException finds a claimed exchange RUNNING with its call current (what the driver then
releases, or abandons as an app cancelled before its head when it took over), and an
uncertain outcome already handed to the store's stream (``keep``) before the event that
announces it. Before, the event went
first: the state stayed CLAIMING with no call, and the entry was never kept.
"""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest

from idemkey import Event, Policy, RedisStore, StoreError, current_call, guard
from idemkey.http import Exchange, Headers, Release, Request, begin
from idemkey.http._transitions import State
from idemkey.records import Claimed

KEY = "k1"


class Timeout(BaseException):
    """What gevent's Timeout is: a BaseException, raised wherever the greenlet was."""


class RaiseOn:
    """An on_event hook that raises ``error`` on every event of ``kind``."""

    def __init__(self, kind: str, error: type[BaseException] = KeyboardInterrupt) -> None:
        self.kind, self.error = kind, error

    def __call__(self, event: Event) -> None:
        if event.kind == self.kind:
            raise self.error()


class Kept(list[tuple[str, int | None]]):
    """A store's ``keep_uncertain``: the (kind, fence) of each entry handed to it."""

    def __call__(self, kind: str, source: Any, fence: int | None, detail: str, steps: Any) -> None:
        self.append((kind, fence))


def exchange(hook: RaiseOn, **policy: Any) -> tuple[Exchange, Kept]:
    request = Request("POST", "/charges", "", Headers([("Idempotency-Key", KEY)]))
    step = begin(Policy(on_event=hook, **policy), request)
    assert isinstance(step, Exchange)
    step.keep = kept = Kept()
    assert step.received(b"{}") is None
    step.claiming()
    return step, kept


@pytest.mark.parametrize("takeover", [False, True], ids=["claimed", "takeover"])
@pytest.mark.parametrize(
    "interruption", [KeyboardInterrupt, SystemExit, Timeout], ids=lambda e: e.__name__
)
def test_a_claim_is_running_with_its_call_current_before_its_hook_runs(
    takeover: bool, interruption: type[BaseException]
) -> None:
    step, kept = exchange(RaiseOn("takeover" if takeover else "claimed", interruption))
    with pytest.raises(interruption):
        step.decide(Claimed("owner", 7, takeover))
    assert step.state is State.RUNNING
    assert step.call is not None
    assert current_call() is step.call
    assert kept == ([("takeover", 7)] if takeover else [])
    plan = step.hook_interrupted()  # what the driver asks next
    with pytest.raises(LookupError):
        current_call()
    if takeover:  # the earlier executor's work is unknown: kept to lapse, an entry says so
        assert plan is None
        assert step.state is State.DONE
        assert kept == [("takeover", 7), ("cancelled", 7)]
    else:  # the app never ran: released at once, as a claim whose reply was cut off
        assert isinstance(plan, Release)
        assert step.state is State.SETTLING
        assert kept == []


def test_an_unprotected_run_is_kept_before_its_hook_runs() -> None:
    step, kept = exchange(RaiseOn("unprotected"), on_store_error="open")
    with pytest.raises(KeyboardInterrupt):
        step.store_failed(StoreError("connection refused"))
    assert kept == [("unprotected", None)]


def test_a_lost_lease_is_kept_before_its_hook_runs() -> None:
    step, kept = exchange(RaiseOn("lease_lost"))
    step.decide(Claimed("owner", 7, False))
    step.started(201, [])
    step.finish(b"charged")
    with pytest.raises(KeyboardInterrupt):
        step.settled(False)
    assert kept == [("lease_lost", 7)]
    assert step.state is State.DONE


def test_a_failed_completion_is_kept_before_its_hook_runs() -> None:
    step, kept = exchange(RaiseOn("store_error"))
    step.decide(Claimed("owner", 7, False))
    step.started(201, [])
    step.finish(b"charged")
    with pytest.raises(KeyboardInterrupt):
        step.settle_failed(StoreError("timeout"))
    assert kept == [("completion_failed", 7)]
    assert step.state is State.DONE


# ---- the guards' state -----------------------------------------------------------------------


def guard_state(hook: RaiseOn, **policy: Any) -> tuple[Any, Kept]:
    store = RedisStore(fakeredis.FakeRedis(), Policy(on_event=hook, **policy))
    state = guard(store, KEY)
    state.keep = kept = Kept()
    return state, kept


@pytest.mark.parametrize("takeover", [False, True], ids=["claimed", "takeover"])
def test_a_guard_claim_has_its_call_current_before_its_hook_runs(takeover: bool) -> None:
    state, kept = guard_state(RaiseOn("takeover" if takeover else "claimed"))
    with pytest.raises(KeyboardInterrupt):
        state.enter(Claimed("owner", 7, takeover), 0.001)
    assert state.call is not None
    assert current_call() is state.call
    assert kept == ([("takeover", 7)] if takeover else [])
    state.leave()
    with pytest.raises(LookupError):
        current_call()


def test_a_guard_unprotected_run_is_kept_before_its_hook_runs() -> None:
    state, kept = guard_state(RaiseOn("unprotected"), on_store_error="open")
    with pytest.raises(KeyboardInterrupt):
        state.claim_failed(StoreError("connection refused"))
    assert kept == [("unprotected", None)]
    with pytest.raises(LookupError):  # nothing is current: the block never ran
        current_call()


def test_a_guard_lost_lease_and_failed_completion_are_kept_before_their_hooks_run() -> None:
    state, kept = guard_state(RaiseOn("lease_lost"))
    state.enter(Claimed("owner", 7, False), 0.001)
    state.leave()
    with pytest.raises(KeyboardInterrupt):
        state.exited(False, True, None, 0.001)
    assert kept == [("lease_lost", 7)]
    state, kept = guard_state(RaiseOn("store_error"))
    state.enter(Claimed("owner", 8, False), 0.001)
    state.leave()
    with pytest.raises(KeyboardInterrupt):
        state.store_failed(StoreError("timeout"), None, completing=True)
    assert kept == [("completion_failed", 8)]
