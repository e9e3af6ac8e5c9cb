"""The sans-IO retry schedule: which outcomes retry, how long to wait, when to stop."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from email.utils import format_datetime

import pytest

from idemkey.client import (
    ClientStateError,
    Done,
    GiveUp,
    Refused,
    Retry,
    RetryPolicy,
    Schedule,
    Step,
    parse_retry_after,
)
from idemkey.client._retry import read_problem
from idemkey.errors import ConfigurationError

WALL = 1_800_000_000.0  # a fixed Unix time for HTTP-dates
FAST = RetryPolicy(max_attempts=5, deadline=10.0, backoff=0.1, backoff_cap=0.5, jitter=0.0)


def problem(code: str, status: int) -> tuple[dict[str, str], bytes]:
    body = {"type": f"urn:idemkey:problem:{code}", "status": status, "code": code}
    return {"content-type": "application/problem+json"}, json.dumps(body).encode()


def answer(
    schedule: Schedule, status: int, headers: dict[str, str], body: bytes = b"", now: float = 0.0
) -> Step:
    schedule.send(now)
    return schedule.answered(status, headers, body, now, WALL)


# ---- Retry-After --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("2", 2.0), (" 120 ", 120.0), ("0", 0.0), (None, None), ("", None), ("-1", None),
     ("1.5", None), ("soon", None), ("Mon, 99 Foo 2026 25:00:00 GMT", None)],
)  # fmt: skip
def test_retry_after_delta_seconds(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value, WALL) == seconds


def test_retry_after_http_date_counts_from_the_wall_clock() -> None:
    later = format_datetime(datetime.fromtimestamp(WALL + 30, timezone.utc), usegmt=True)
    earlier = format_datetime(datetime.fromtimestamp(WALL - 30, timezone.utc), usegmt=True)
    assert parse_retry_after(later, WALL) == pytest.approx(30.0)
    assert parse_retry_after(earlier, WALL) == 0.0  # a date in the past means now


def test_retry_after_reads_all_three_http_date_forms() -> None:
    # RFC 9110 5.6.7: a recipient accepts IMF-fixdate, RFC 850 and asctime dates; the last
    # carries no zone (parsedate leaves it naive), and every HTTP-date is GMT.
    when = datetime.fromtimestamp(WALL + 30, timezone.utc)
    forms = [
        f"{when:%a, %d %b %Y %H:%M:%S} GMT",
        f"{when:%A, %d-%b-%y %H:%M:%S} GMT",
        f"{when:%a %b} {when.day:2d} {when:%H:%M:%S %Y}",
    ]
    assert [parse_retry_after(form, WALL) for form in forms] == [pytest.approx(30.0)] * 3
    assert parse_retry_after("Sun Nov  6 08:49:37 1994", WALL) == 0.0  # past: now


#: An HTTP-date whose year no datetime holds (parsedate_to_datetime raised OverflowError).
HUGE_YEAR = "Mon, 01 Jan 99999999999999999999 00:00:00 GMT"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("9" * 20, 1e20),  # a float: a wait past any deadline
     ("9" * 400, math.inf),  # past a float (float(int()) raised OverflowError)
     ("9" * 5000, math.inf),  # past int()'s 4 300 digits (ValueError)
     ("0" * 5000 + "2", 2.0),  # leading zeros are no digits of the number
     ("1e9", None),  # not delta-seconds
     ("Mon, 01 Jan 10000 00:00:00 GMT", None),  # a year past 9999: no datetime
     (HUGE_YEAR, None)],
)  # fmt: skip
def test_retry_after_of_any_length(value: str, seconds: float | None) -> None:
    assert parse_retry_after(value, WALL) == seconds


@pytest.mark.parametrize("value", ["9" * 20, "9" * 400, "9" * 5000])
def test_a_retry_after_past_the_deadline_gives_up_at_once(value: str) -> None:
    wait = parse_retry_after(value, WALL)
    step = answer(Schedule(FAST, 0.0), 503, {"retry-after": value})
    assert step == GiveUp("deadline", "503", 1, wait, 10.0)  # the server's wait, said


@pytest.mark.parametrize("value", ["1e9", "Mon, 01 Jan 10000 00:00:00 GMT", HUGE_YEAR])
def test_an_unreadable_retry_after_leaves_the_backoff(value: str) -> None:
    assert answer(Schedule(FAST, 0.0), 503, {"retry-after": value}) == Retry(0.1, "503", 1, None)


# ---- backoff ------------------------------------------------------------------------------


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [FAST.backoff_for(n, 0.0) for n in range(1, 6)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.5, 0.5]
    )


def test_jitter_takes_off_at_most_its_fraction() -> None:
    policy = RetryPolicy(backoff=1.0, backoff_cap=1.0, jitter=0.5)
    assert policy.backoff_for(1, 0.0) == 1.0
    assert policy.backoff_for(1, 0.999) == pytest.approx(0.5, abs=0.001)


def test_the_schedule_draws_its_jitter() -> None:
    draws = iter([0.0, 0.5])
    policy = RetryPolicy(backoff=1.0, backoff_cap=4.0, jitter=1.0)
    schedule = Schedule(policy, 0.0, draw=lambda: next(draws))
    schedule.send(0.0)
    first = schedule.failed("timeout", 0.0)
    schedule.send(1.0)
    second = schedule.failed("timeout", 1.0)
    assert isinstance(first, Retry)
    assert first.delay == 1.0
    assert isinstance(second, Retry)
    assert second.delay == pytest.approx(1.0)


def test_the_cap_comes_before_the_power() -> None:
    """2.0 ** 1024 overflows: retry 1 025 under a 1 ms cap raised OverflowError."""
    policy = RetryPolicy(max_attempts=5000, backoff=0.001, backoff_cap=0.001, jitter=0.0)
    assert [policy.backoff_for(n, 0.0) for n in (1, 1024, 1025, 5000, 10**6, 10**400)] == [
        0.001
    ] * 6
    # A float's whole range, doubling from the least backoff to the greatest cap.
    wide = RetryPolicy(backoff=5e-324, backoff_cap=1.7e308, jitter=0.0)
    waits = [wide.backoff_for(n, 0.0) for n in range(1, 2200)]
    assert waits == sorted(waits)
    assert (waits[0], waits[1074], waits[-1]) == (5e-324, 1.0, 1.7e308)  # 2**-1074 * 2**1074
    assert RetryPolicy(backoff=0.0, backoff_cap=0.0).backoff_for(10**6, 0.5) == 0.0


def test_a_schedule_retries_past_a_thousand_attempts() -> None:
    """What Client met against a server that answers 503 at once, without the network."""
    policy = RetryPolicy(max_attempts=5000, deadline=60.0, backoff=0.001, backoff_cap=0.001)
    schedule = Schedule(policy, 0.0, draw=lambda: 0.0)
    now = 0.0
    for _ in range(4999):
        schedule.send(now)
        step = schedule.answered(503, {}, b"", now, WALL)
        assert isinstance(step, Retry)
        now += step.delay
    schedule.send(now)
    assert schedule.answered(503, {}, b"", now, WALL) == GiveUp("attempts", "503", 5000)


@pytest.mark.parametrize(
    "bad",
    [dict(max_attempts=0), dict(deadline=0), dict(backoff=-1), dict(backoff=2, backoff_cap=1),
     dict(jitter=1.5), dict(retry_statuses=frozenset({503, 422})),
     dict(retry_statuses=frozenset({409}))],
)  # fmt: skip
def test_policy_refuses_what_cannot_work(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**bad)  # type: ignore[arg-type]


# ---- what retries -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["connect", "timeout", "network", "protocol"])
def test_every_failure_without_an_answer_retries(kind: str) -> None:
    schedule = Schedule(FAST, 0.0)
    schedule.send(0.0)
    step = schedule.failed(kind, 0.0)  # type: ignore[arg-type]
    assert step == Retry(0.1, kind, 1, None)


def test_in_flight_retries_after_its_retry_after() -> None:
    headers, body = problem("in_flight", 409)
    step = answer(Schedule(FAST, 0.0), 409, {**headers, "retry-after": "1"}, body)
    assert step == Retry(1.0, "409 in_flight", 1, 1.0)  # Retry-After is a floor on the wait


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_overload_statuses_retry(status: int) -> None:
    step = answer(Schedule(FAST, 0.0), status, {"retry-after": "2"})
    assert isinstance(step, Retry)
    assert step.delay == 2.0
    assert step.reason == str(status)


def test_store_unavailable_retries_with_its_code_in_the_reason() -> None:
    headers, body = problem("store_unavailable", 503)
    step = answer(Schedule(FAST, 0.0), 503, headers, body)
    assert isinstance(step, Retry)
    assert step.reason == "503 store_unavailable"
    assert step.delay == 0.1  # no Retry-After: the backoff


@pytest.mark.parametrize(
    ("code", "status"),
    [("key_reused", 422), ("key_reused", 400), ("missing_key", 400), ("invalid_key", 400),
     ("request_too_large", 413)],
)  # fmt: skip
def test_idemkey_refusals_never_retry(code: str, status: int) -> None:
    headers, body = problem(code, status)
    schedule = Schedule(FAST, 0.0)
    step = answer(schedule, status, headers, body)
    assert isinstance(step, Refused)
    assert step.code == code
    assert step.problem["status"] == status
    assert schedule.state == "finished"


@pytest.mark.parametrize(
    ("status", "headers", "body"),
    [(201, {}, b"{}"), (200, {"content-type": "application/json"}, b'{"code": "in_flight"}'),
     (402, {"content-type": "application/problem+json"}, b'{"type": "about:blank", "code": "x"}'),
     (404, {}, b""), (409, {"content-type": "application/json"}, b'{"code": "conflict"}'),
     (409, {}, b"not json"), (422, {"content-type": "application/json"}, b"[1]"),
     (500, {}, b""), (422, {"content-type": "application/problem+json"}, b"\xff")],
)  # fmt: skip
def test_other_answers_are_the_callers(status: int, headers: dict[str, str], body: bytes) -> None:
    """The app's own answers (even 4xx problems that are not idemkey's) are returned."""
    assert answer(Schedule(FAST, 0.0), status, headers, body) == Done()


#: JSON nested past the interpreter's recursion limit: json.loads raised RecursionError.
NESTED = [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 100_000 + b"1" + b"}" * 100_000]


@pytest.mark.parametrize("body", NESTED, ids=["arrays", "objects"])
@pytest.mark.parametrize(
    ("status", "step"), [(409, Done()), (422, Done()), (503, Retry(0.1, "503", 1, None))]
)
def test_a_body_nested_too_deep_is_no_problem_document(
    body: bytes, status: int, step: Step
) -> None:
    """Read as any other body that is not one: 409 and 422 returned, 503 retried."""
    headers = {"content-type": "application/problem+json"}
    assert read_problem(headers, body) is None
    assert answer(Schedule(FAST, 0.0), status, headers, body) == step


# ---- when to stop -------------------------------------------------------------------------


def test_attempt_budget() -> None:
    schedule = Schedule(RetryPolicy(max_attempts=2, backoff=0.0), 0.0)
    schedule.send(0.0)
    assert isinstance(schedule.failed("timeout", 0.0), Retry)
    schedule.send(0.0)
    assert schedule.failed("network", 0.0) == GiveUp("attempts", "network", 2)


def test_an_attempt_the_deadline_cut_off_gives_up_for_the_deadline() -> None:
    """Even on the last attempt allowed: the deadline is what stopped it."""
    schedule = Schedule(RetryPolicy(max_attempts=1, deadline=5.0), 0.0)
    schedule.send(0.0)
    assert schedule.failed("timeout", 5.0) == GiveUp("deadline", "timeout", 1)


def test_no_retry_that_would_start_after_the_deadline() -> None:
    schedule = Schedule(RetryPolicy(deadline=5.0), 100.0)
    assert schedule.send(101.0) == 4.0  # the attempt may take what is left
    step = schedule.answered(503, {"retry-after": "4"}, b"", 101.5, WALL)
    assert step == GiveUp("deadline", "503", 1, 4.0, 3.5)


def test_attempt_budget_is_what_is_left_of_the_deadline() -> None:
    schedule = Schedule(RetryPolicy(deadline=5.0, backoff=0.5, jitter=0.0), 0.0)
    assert schedule.send(0.0) == 5.0
    assert isinstance(schedule.failed("timeout", 3.0), Retry)
    assert schedule.send(3.5) == 1.5


# ---- misuse -------------------------------------------------------------------------------


def test_out_of_order_use_raises() -> None:
    schedule = Schedule(FAST, 0.0)
    with pytest.raises(ClientStateError):
        schedule.failed("timeout", 0.0)  # nothing was sent
    schedule.send(0.0)
    with pytest.raises(ClientStateError):
        schedule.send(0.0)  # two attempts at once
    assert schedule.answered(201, {}, b"", 0.0, WALL) == Done()
    with pytest.raises(ClientStateError):
        schedule.send(0.0)  # the call is over


# ---- whose replay: an earlier attempt that may have reached the handler -------------------
#
# on_replay="refuse" accepts a replay only as the answer of the call's own lost attempt: one
# that may have reached the handler and whose answer never came back. Done(after_lost=...)
# says whether the call had one.

REPLAYED = {"idempotent-replayed": "true", "content-type": "application/json"}


def replay_after(schedule: Schedule) -> Step:
    """The replay the call's next attempt gets."""
    return answer(schedule, 201, REPLAYED, b"{}")


def test_a_first_answer_follows_no_lost_attempt() -> None:
    assert replay_after(Schedule(FAST, 0.0)) == Done(after_lost=False)


@pytest.mark.parametrize(
    ("kind", "lost"),
    [("connect", False), ("timeout", True), ("network", True), ("protocol", True)],
)
def test_a_failure_is_lost_unless_nothing_was_sent(kind: str, lost: bool) -> None:
    """A refused connection sent nothing; a timeout, a reset or a dropped answer may have
    followed the whole request to the handler."""
    schedule = Schedule(FAST, 0.0)
    schedule.send(0.0)
    assert isinstance(schedule.failed(kind, 0.0), Retry)  # type: ignore[arg-type]
    assert replay_after(schedule) == Done(after_lost=lost)


WIDE = RetryPolicy(
    max_attempts=5, deadline=10.0, backoff=0.1, jitter=0.0,
    retry_statuses=frozenset({408, 425, 429, 500, 502, 503, 504}),
)  # fmt: skip


@pytest.mark.parametrize(
    ("status", "code", "lost"),
    [(409, "in_flight", False), (503, "store_unavailable", False), (503, None, False),
     (429, None, False), (408, None, False), (425, None, False),
     (502, None, True), (504, None, True), (500, None, True)],
)  # fmt: skip
def test_an_answer_is_lost_unless_it_says_nothing_ran(
    status: int, code: str | None, lost: bool
) -> None:
    """409 in_flight (another call holds the key), idemkey's own problems, 408, 425, 429 and 503
    answer before the handler; a 502 or 504 from a gateway may follow a handler that ran."""
    headers, body = problem(code, status) if code else ({}, b"")
    schedule = Schedule(WIDE, 0.0)
    assert isinstance(answer(schedule, status, headers, body), Retry)
    assert replay_after(schedule) == Done(after_lost=lost)


def test_a_lost_attempt_stays_lost() -> None:
    """A timeout, then 409 in_flight (the call's own first attempt still running): its replay."""
    schedule = Schedule(FAST, 0.0)
    schedule.send(0.0)
    schedule.failed("timeout", 0.0)
    headers, body = problem("in_flight", 409)
    assert isinstance(answer(schedule, 409, headers, body), Retry)
    assert replay_after(schedule) == Done(after_lost=True)


# ---- a hostile problem code ---------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    ["x)\nINFO:idemkey.client:charge refunded (ok", "A" * 1_000_000, "in flight", "in_flight\r",
     "\u202eyalp", "", "Z" * 65],
)  # fmt: skip
def test_a_code_that_is_no_short_token_is_shown_escaped_and_bounded(code: str) -> None:
    """The reason goes into a log line and into RetriesExhaustedError: a newline in it forged a
    log line, a megabyte code made a megabyte line per retry."""
    body = {"type": "urn:idemkey:problem:busy", "code": code}
    headers = {"content-type": "application/problem+json"}
    step = answer(Schedule(FAST, 0.0), 503, headers, json.dumps(body).encode())
    assert isinstance(step, Retry)
    shown = step.reason.startswith("503 '") and step.reason.isprintable() and len(step.reason) < 100
    assert shown, f"{len(step.reason)} characters: {step.reason[:100]!r}"


@pytest.mark.parametrize("code", ["in_flight", "key_reused", "store_unavailable", "x" * 64])
def test_a_short_token_code_is_shown_as_it_is(code: str) -> None:
    headers, body = problem(code, 503)
    step = answer(Schedule(FAST, 0.0), 503, headers, body)
    assert isinstance(step, Retry)
    assert step.reason == f"503 {code}"


def test_a_refusal_with_a_hostile_code_carries_it_escaped() -> None:
    body = {"type": "urn:idemkey:problem:x", "code": "bad\ncode" * 100_000}
    headers = {"content-type": "application/problem+json"}
    step = answer(Schedule(FAST, 0.0), 422, headers, json.dumps(body).encode())
    assert isinstance(step, Refused)
    shown = step.code.isprintable() and len(step.code) < 100
    assert shown, f"{len(step.code)} characters: {step.code[:100]!r}"
    assert step.problem["code"] == body["code"]  # the document itself, as it came
