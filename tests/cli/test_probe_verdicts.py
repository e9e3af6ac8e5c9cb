"""The probe's sans-IO core: verdicts from observed answers, and the sequence as a state
machine driven by in-process fake endpoints. No network, no server."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

import pytest

from idemkey.cli.probing.session import (
    Batch,
    Outgoing,
    Plan,
    ProbeSession,
    ProbeStateError,
    derive_edit,
)
from idemkey.cli.probing.verdicts import (
    Answer,
    NoResponse,
    Response,
    Result,
    body_differences,
    judge_concurrent,
    judge_edited,
    judge_first,
    judge_keyless,
    judge_other_tenant,
    judge_replay,
)

RH = "Idempotent-Replayed"
BODY = b'{"amount": 1000, "currency": "eur"}'
EDITED = b'{"amount": 1001, "currency": "eur"}'
FIRST = Response(201, (("Content-Type", "application/json"),), b'{"id": "ch_1", "amount": 1000}')


def ok(body: bytes = FIRST.body, *headers: tuple[str, str], status: int = 201) -> Response:
    return Response(status, tuple(headers), body, sent_at=1.0, answered_at=2.0)


# ---- verdicts -----------------------------------------------------------------------------


def test_first_request_must_succeed() -> None:
    assert judge_first(ok(), RH).verdict == "PASS"
    refused = judge_first(ok(b'{"code": "bad_amount"}', status=400), RH)
    assert refused.verdict == "FAIL"
    assert "not a success: 400" in refused.summary
    assert judge_first(NoResponse("no answer within 1 s"), RH).verdict == "FAIL"


def test_replay_must_be_byte_equal() -> None:
    replay = judge_replay(FIRST, ok(FIRST.body, (RH, "true")), RH)
    assert (replay.verdict, replay.number) == ("PASS", 2)
    assert "Idempotent-Replayed: true" in replay.summary
    # Unmarked, byte-equal: a replay only when another execution answered other bytes.
    unmarked = judge_replay(FIRST, ok(), RH, distinct=True)
    assert unmarked.verdict == "PASS"
    assert "no Idempotent-Replayed header" in unmarked.summary
    waited = judge_replay(FIRST, ok(), RH, waits=1, distinct=True)
    assert "after 1 x 409" in waited.summary


@pytest.mark.parametrize("distinct", [False, None])
def test_an_unmarked_byte_equal_replay_is_inconclusive_unless_runs_differ(
    distinct: bool | None,
) -> None:
    result = judge_replay(FIRST, ok(), RH, distinct=distinct)
    assert result.verdict == "INCONCLUSIVE"
    assert "cannot tell a replay from a second execution" in result.summary
    assert "a replay header" in result.details[0]
    assert "a body that differs per execution" in result.details[0]
    conc = judge_concurrent([_at(FIRST.body), _at(FIRST.body)], RH, distinct)
    assert conc.verdict == "INCONCLUSIVE"
    assert "cannot tell one execution from 2" in conc.summary
    tenant = judge_other_tenant(FIRST, ok(), RH, distinct)
    assert tenant.verdict == "INCONCLUSIVE"
    # A replay header settles it either way.
    assert (
        judge_replay(FIRST, ok(FIRST.body, (RH, "true")), RH, distinct=distinct).verdict == "PASS"
    )
    leaked = judge_other_tenant(FIRST, ok(FIRST.body, (RH, "true")), RH, distinct)
    assert leaked.verdict == "FAIL"


def test_a_different_body_on_replay_is_a_second_execution_shown_field_by_field() -> None:
    again = judge_replay(FIRST, ok(b'{"id": "ch_2", "amount": 1000}'), RH)
    assert again.verdict == "FAIL"
    assert "ran again" in again.summary
    assert again.details == ('id: "ch_1" -> "ch_2"',)
    other_status = judge_replay(FIRST, ok(status=200), RH)
    assert other_status.verdict == "FAIL"
    assert "answered 200, the first request 201" in other_status.summary
    stuck = judge_replay(FIRST, ok(b"", ("Retry-After", "1"), status=409), RH, waits=3)
    assert stuck.verdict == "FAIL"
    assert "still in progress after 3 retries" in stuck.summary


@pytest.mark.parametrize(
    ("status", "verdict", "words"),
    [
        (422, "PASS", "IETF"),
        (400, "PASS", "Stripe"),
        (409, "WARN", "409"),
        (500, "FAIL", "expected 422"),
        (404, "FAIL", "expected 422"),
    ],
)
def test_edited_retry_must_be_refused(status: int, verdict: str, words: str) -> None:
    result = judge_edited(FIRST, ok(b"{}", status=status), RH)
    assert result.verdict == verdict
    assert words in result.summary


def test_edited_retry_replayed_or_executed_is_the_classic_failure() -> None:
    replayed = judge_edited(FIRST, ok(FIRST.body, (RH, "true")), RH)
    assert replayed.verdict == "FAIL"
    assert "an edited retry was replayed" in replayed.summary
    executed = judge_edited(FIRST, ok(b'{"id": "ch_9", "amount": 1001}'), RH)
    assert executed.verdict == "FAIL"
    assert "an edited retry was executed" in executed.summary


def test_no_key_reports_required_or_unprotected() -> None:
    assert judge_keyless(ok(b"", status=400), RH).verdict == "PASS"
    assert judge_keyless(ok(b"", status=428), RH).verdict == "PASS"
    unprotected = judge_keyless(ok(), RH)
    assert unprotected.verdict == "WARN"
    assert "runs without a key" in unprotected.summary
    assert judge_keyless(ok(b"", status=500), RH).verdict == "FAIL"


def _at(body: bytes, status: int = 201, sent: float = 1.0, *headers: tuple[str, str]) -> Response:
    return Response(status, tuple(headers), body, sent_at=sent, answered_at=2.0)


def test_concurrent_one_execution_passes() -> None:
    conflict = _at(b"", 409, 1.0, ("Retry-After", "1"))
    answers: list[Answer] = [
        _at(FIRST.body),
        conflict,
        conflict,
        _at(FIRST.body, 201, 1.0, (RH, "true")),
    ]
    result = judge_concurrent(answers, RH)
    assert result.verdict == "PASS", result
    assert (
        "4 at once: 2 x 201, 2 x 409 (Retry-After: 1): one execution, 1 replayed" in result.summary
    )
    assert "4 of 4 in flight together" in result.summary


def test_concurrent_duplicates_that_ran_twice_fail() -> None:
    answers: list[Answer] = [
        _at(FIRST.body),
        _at(b'{"id": "ch_2", "amount": 1000}'),
        _at(FIRST.body),
    ]
    result = judge_concurrent(answers, RH)
    assert result.verdict == "FAIL"
    assert "concurrent duplicates ran 2 times" in result.summary
    assert result.details == ('id: "ch_1" -> "ch_2"',)


def test_concurrent_409_without_retry_after_warns_and_no_overlap_is_inconclusive() -> None:
    bare = judge_concurrent([_at(FIRST.body), _at(b"", 409)], RH)
    assert bare.verdict == "WARN"
    assert "without Retry-After" in bare.summary
    # Each answer began before the next request was sent: nothing overlapped.
    serial = [
        Response(201, (), FIRST.body, sent_at=1.0, answered_at=1.5),
        Response(201, (), FIRST.body, sent_at=2.0, answered_at=2.5),
    ]
    inconclusive = judge_concurrent(serial, RH, distinct=True)  # the bodies tell runs apart
    assert inconclusive.verdict == "WARN"
    assert "inconclusive" in inconclusive.summary
    assert judge_concurrent([_at(b"", 500), _at(FIRST.body)], RH).verdict == "FAIL"
    assert judge_concurrent([_at(b"", 409, 1.0, ("Retry-After", "1"))] * 2, RH).verdict == "FAIL"


def test_other_tenant_must_not_see_the_first_response() -> None:
    leaked = judge_other_tenant(FIRST, ok(FIRST.body, (RH, "true"), status=201), RH)
    assert leaked.verdict == "FAIL"
    assert "another tenant was served the first tenant's response" in leaked.summary
    own = judge_other_tenant(FIRST, ok(b'{"id": "ch_3", "amount": 1000}'), RH)
    assert own.verdict == "PASS"
    assert judge_other_tenant(FIRST, ok(b"", status=422), RH).verdict == "WARN"
    assert judge_other_tenant(FIRST, ok(b"", status=401), RH).verdict == "WARN"


def test_body_differences_beyond_json() -> None:
    assert body_differences(b"abcdef", b"abcXef")[0] == "bytes differ from offset 3 (6 vs 6 bytes)"
    assert body_differences(b'{"a": 1}', b'{"a":1}') == (
        "same JSON fields, different bytes (key order or whitespace)",
    )
    nested = body_differences(b'{"a": {"b": 1}, "c": 2}', b'{"a": {"b": 2}}')
    assert nested == ("a.b: 1 -> 2", "c: 2 -> (absent)")


def test_derive_edit_changes_a_field_a_fingerprint_covers() -> None:
    edited, how = derive_edit(BODY) or (b"", "")
    assert json.loads(edited) == {"amount": 1001, "currency": "eur"}
    assert how == "amount: 1000 -> 1001"
    assert derive_edit(b'{"flag": true, "note": "x"}') == (
        b'{"flag": true, "note": "x-edited"}',
        'note: "x" -> "x-edited"',
    )
    assert derive_edit(b"amount=1000") is None
    assert derive_edit(b"[1, 2]") is None
    assert derive_edit(b"{}") is None


# ---- the session against fake endpoints ---------------------------------------------------

Endpoint = Callable[[Outgoing], Response]
PLAN = Plan("POST", (("Account", "acct_1"),), BODY, EDITED, other_tenant=("Account", "acct_2"))


def _headers(request: Outgoing) -> dict[str, str]:
    return {n.lower(): v for n, v in request.headers}


def correct_endpoint() -> Endpoint:
    """idemkey's contract, in miniature: per tenant and key, a fingerprint and a response."""
    ids = itertools.count(1)
    records: dict[tuple[str, str], tuple[bytes, Response]] = {}

    def answer(request: Outgoing) -> Response:
        headers = _headers(request)
        key = headers.get("idempotency-key")
        if key is None:
            return ok(b'{"code": "missing_key"}', status=400)
        record = records.get((headers["account"], key))
        if record is not None:
            fingerprint, stored = record
            if fingerprint != request.body:
                return ok(b'{"code": "key_reused"}', status=422)
            return Response(stored.status, (*stored.headers, (RH, "true")), stored.body, 1.0, 2.0)
        made = ok(json.dumps({"id": f"ch_{next(ids)}"}).encode())
        records[(headers["account"], key)] = (request.body, made)
        return made

    return answer


def naive_cache() -> Endpoint:
    """Replays by key alone: no fingerprint, no tenant."""
    ids = itertools.count(1)
    cache: dict[str, Response] = {}

    def answer(request: Outgoing) -> Response:
        key = _headers(request).get("idempotency-key", f"none-{next(ids)}")
        if key not in cache:
            cache[key] = ok(json.dumps({"id": f"ch_{next(ids)}"}).encode())
        return cache[key]

    return answer


def drive(session: ProbeSession, endpoint: Endpoint) -> list[Batch]:
    batches = []
    while (batch := session.next_batch()) is not None:
        batches.append(batch)
        session.receive([endpoint(request) for request in batch.requests])
    return batches


def _verdicts(results: list[Result]) -> dict[int, str]:
    return {r.number: r.verdict for r in results}


def test_a_correct_endpoint_passes_every_check() -> None:
    session = ProbeSession(PLAN, "k1", "k2")
    batches = drive(session, correct_endpoint())
    assert _verdicts(session.results) == dict.fromkeys(range(1, 7), "PASS")
    assert [b.check for b in batches] == [1, 2, 3, 4, 5, 6]
    assert len(batches[4].requests) == PLAN.concurrency
    assert session.sent == 5 + PLAN.concurrency <= PLAN.max_requests
    # The other tenant's credentials replace the first tenant's, and the key stays.
    # Exactly once: a server reading the first Authorization header would see tenant 1.
    assert batches[5].requests[0].headers == (("Account", "acct_2"), ("Idempotency-Key", "k1"))
    assert batches[2].requests[0].body == EDITED
    assert "idempotency-key" not in _headers(batches[3].requests[0])
    assert {_headers(r)["idempotency-key"] for r in batches[4].requests} == {"k2"}


def test_a_naive_cache_fails_the_edited_retry_and_the_tenant_check() -> None:
    session = ProbeSession(PLAN, "k1", "k2")
    drive(session, naive_cache())
    verdicts = _verdicts(session.results)
    assert (verdicts[3], verdicts[6]) == ("FAIL", "FAIL")
    assert (verdicts[1], verdicts[2]) == ("PASS", "PASS")


def test_a_409_on_replay_waits_retry_after_and_the_budget_holds() -> None:
    busy = ok(b"", ("Retry-After", "30"), status=409)
    session = ProbeSession(PLAN, "k1", "k2")
    first = session.next_batch()
    assert first is not None
    session.receive([ok()])
    waits = []
    while (batch := session.next_batch()) is not None and batch.check == 2:
        waits.append(batch.wait)
        session.receive([busy])
    assert waits == [0.0, PLAN.max_wait, PLAN.max_wait, PLAN.max_wait]  # Retry-After capped
    assert session.results[1].verdict == "FAIL"
    assert "still in progress after 3 retries" in session.results[1].summary
    assert batch is not None
    session.receive([ok(b"", status=422)])
    drive(session, correct_endpoint())
    assert session.sent <= PLAN.max_requests


def test_the_budget_is_exactly_the_worst_case() -> None:
    busy = ok(b"", ("Retry-After", "1"), status=409)
    session = ProbeSession(PLAN, "k1", "k2")
    calls = iter([ok()] + [busy] * 4)
    drive(session, lambda request: next(calls, ok(b"", status=422)))
    assert session.sent == PLAN.max_requests == 8 + PLAN.concurrency


def test_a_failed_first_request_skips_the_rest() -> None:
    session = ProbeSession(PLAN, "k1", "k2")
    drive(session, lambda request: ok(b'{"code": "unauthorized"}', status=401))
    assert _verdicts(session.results) == {1: "FAIL", **dict.fromkeys(range(2, 7), "SKIP")}
    assert session.sent == 1


def test_without_another_tenant_check_6_is_skipped() -> None:
    plan = Plan("POST", (("Account", "acct_1"),), BODY, EDITED)
    session = ProbeSession(plan, "k1", "k2")
    drive(session, correct_endpoint())
    assert session.results[5].verdict == "SKIP"
    assert "--other-tenant-header" in session.results[5].summary
    assert session.sent == 4 + plan.concurrency


def test_the_session_refuses_to_be_driven_out_of_order() -> None:
    session = ProbeSession(PLAN, "k1", "k2")
    with pytest.raises(ProbeStateError):
        session.receive([ok()])
    assert session.next_batch() is not None
    with pytest.raises(ProbeStateError):
        session.next_batch()
    with pytest.raises(ProbeStateError):
        session.receive([ok(), ok()])
    with pytest.raises(ValueError, match="key of its own"):
        ProbeSession(PLAN, "same", "same")


def test_an_unmarked_replay_is_judged_after_checks_4_and_5_and_shown_in_order() -> None:
    # The naive cache replays without a header, and each execution has its own id: check 2
    # waits for checks 4 and 5 to show that, then passes; results still come out 1 to 6.
    session = ProbeSession(PLAN, "k1", "k2")
    endpoint = naive_cache()
    shown: list[list[int]] = []
    while (batch := session.next_batch()) is not None:
        settled = session.receive([endpoint(request) for request in batch.requests])
        shown.append([r.number for r in settled])
    assert shown == [[1], [], [], [], [2, 3, 4, 5], [6]]
    assert [r.number for r in session.results] == [1, 2, 3, 4, 5, 6]
    assert session.results[1].verdict == "PASS"
    assert "another execution answered other bytes" in session.results[1].summary


def test_an_endpoint_with_one_answer_for_every_run_is_inconclusive() -> None:
    runs = itertools.count(1)

    def same_answer(request: Outgoing) -> Response:
        next(runs)
        return ok(b'{"ok": true}')

    session = ProbeSession(PLAN, "k1", "k2")
    drive(session, same_answer)
    verdicts = _verdicts(session.results)
    assert (verdicts[2], verdicts[5], verdicts[6]) == ("INCONCLUSIVE",) * 3
    assert verdicts[3] == "FAIL"  # an edited retry answered 2xx: wrong either way
    assert "replayed, or run again" in session.results[2].summary


def test_evidence_shows_the_retry_guidance_and_retention_a_server_gives() -> None:
    problem = json.dumps(
        {"type": "urn:idemkey:problem:key_reused", "code": "key_reused", "retry": "new_key",
         "retention": 86400, "status": 422, "title": "t", "detail": "d"}
    ).encode()  # fmt: skip
    refused = ok(problem, ("Content-Type", "application/problem+json"), status=422)
    assert (
        "422, retry: new_key, retention: 86400 s, body " in judge_edited(FIRST, refused, RH).summary
    )
    marked = ok(FIRST.body, (RH, "false"), ("Idempotency-Retention", "60"))
    assert "201, Idempotent-Replayed: false, Idempotency-Retention: 60, body" in (
        judge_first(marked, RH).summary
    )
    # Without them (a draft-07 server), nothing more is shown.
    plain = ok(b'{"code": "key_reused"}', ("Content-Type", "application/json"), status=422)
    assert "retry" not in judge_edited(FIRST, plain, RH).summary
