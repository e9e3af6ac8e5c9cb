"""Sans-IO verdicts: from the answers an endpoint gave to a verdict per check, no network.

Each ``judge_*`` function takes what was observed (:class:`Response` or :class:`NoResponse`)
and returns a :class:`Result`: the verdict, a one-line summary with the evidence (status, the
headers that matter, a body excerpt), and detail lines (a per-field comparison of two bodies).

Verdicts: ``PASS`` the check holds; ``WARN`` it holds with a caveat, or could not be settled;
``INCONCLUSIVE`` the answers cannot tell a replay from a second execution (byte-equal bodies,
no replay header, and an endpoint whose answers do not differ per execution), so the check
cannot vouch for it; ``FAIL`` the endpoint broke the contract; ``SKIP`` not run. ``FAIL``
fails the probe; ``INCONCLUSIVE`` makes its verdict INCONCLUSIVE, never PASS.

Whether an endpoint's answers tell its executions apart is learned from the run itself
(:func:`executions_differ`): checks 4 and 5 send the same request with no key and with another
key, so each of their successes surely ran apart from check 1; if every one of them answered
other bytes than check 1 (an id, a timestamp), byte-equal answers to one key are a replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from .answers import (
    Answer,
    NoResponse,
    Response,
    Result,
    Verdict,
    body_differences,
    evidence,
    excerpt,
    header_line,
    worst,
)

__all__ = [
    "Answer",
    "NoResponse",
    "Response",
    "Result",
    "Verdict",
    "body_differences",
    "excerpt",
    "executions_differ",
    "judge_concurrent",
    "judge_edited",
    "judge_first",
    "judge_keyless",
    "judge_other_tenant",
    "judge_replay",
    "worst",
]

#: Refusals of a key reused with another request: the IETF draft's 422, Stripe's 400.
REFUSED: Final = {422: "the IETF draft's status", 400: "Stripe's convention"}
#: Refusals of a request that carries no key at all.
KEY_REQUIRED: Final = frozenset({400, 422, 428})


#: Why bodies longer than the probe reads prove nothing equal (transport.MAX_BODY_BYTES).
PAST_CAP: Final = (
    "the bodies go on past the first 8 MiB, which alone were compared (equal): what follows "
    "may differ"
)


def _equal_start(a: Response, b: Response) -> bool:
    """Same status and first 8 MiB, one body going on past them: not shown to be equal."""
    return a.same_as(b) and (a.truncated or b.truncated)


def _no_answer(number: int, name: str, answer: NoResponse) -> Result:
    return Result(number, name, "FAIL", answer.reason)


def judge_first(answer: Answer, replay_header: str) -> Result:
    """Check 1: the first request with a key must succeed, to give the others a reference."""
    number, name = 1, "first request"
    if isinstance(answer, NoResponse):
        return _no_answer(number, name, answer)
    shown = evidence(answer, replay_header)
    if answer.ok:
        return Result(number, name, "PASS", shown)
    return Result(
        number,
        name,
        "FAIL",
        f"not a success: {shown}; fix --data or -H so the request succeeds (the other checks "
        "compare against it)",
    )


def executions_differ(first: Response, others: Sequence[Answer]) -> bool | None:
    """Whether the endpoint's answers tell its executions apart.

    ``others``: answers to the same request that surely ran apart from ``first`` (no key, or
    another key). True when every success among them answered other bytes, False when one
    answered ``first``'s bytes (a second execution looks like a replay), None when none
    succeeded (nothing to compare with).
    """
    bodies = [a.body for a in others if isinstance(a, Response) and a.ok]
    if not bodies:
        return None
    return first.body not in bodies


#: What the answers would need for the probe to tell a replay from a second execution.
WHAT_WOULD_TELL: Final = (
    "what would tell: a replay header (--replay-header NAME, if the server marks replays "
    "otherwise), or a body that differs per execution (an id, a timestamp)"
)


def _cannot_tell(distinct: bool | None) -> str:
    """Why byte-equal answers without a replay header prove nothing, for ``distinct``."""
    if distinct is False:
        return (
            "this endpoint answers the same bytes for two executions (checks 4/5 ran the same "
            "request with no key or another key, and got check 1's bytes)"
        )
    return "no other execution succeeded to show whether the body differs per execution"


def judge_replay(
    first: Response,
    replay: Answer,
    replay_header: str,
    waits: int = 0,
    distinct: bool | None = None,
) -> Result:
    """Check 2: the same request with the same key must answer the same status and bytes.

    ``distinct``: :func:`executions_differ` for this endpoint. Byte-equal answers without a
    replay header are a replay only when executions answer different bytes; else the check is
    INCONCLUSIVE, never PASS.
    """
    number, name = 2, "same key again"
    if isinstance(replay, NoResponse):
        return _no_answer(number, name, replay)
    waited = f" (after {waits} x 409, honouring Retry-After)" if waits else ""
    marker = replay.header(replay_header)
    if _equal_start(replay, first):
        summary = f"cannot tell a replay from a second execution: {replay.status}, {PAST_CAP}"
        return Result(number, name, "INCONCLUSIVE", summary + waited)
    if replay.same_as(first):
        bytes_equal = f"{replay.status}, byte-equal body ({len(replay.body)} bytes)"
        if marker is not None:
            retention = "".join(
                f", {header_line(n, v)}" for n, v in replay.headers if "retention" in n.lower()
            )
            summary = f"replayed: {bytes_equal}, {header_line(replay_header, marker)}{retention}"
            return Result(number, name, "PASS", summary + waited)
        if distinct:
            summary = (
                f"replayed: {bytes_equal}, no {replay_header} header (another execution "
                "answered other bytes, so this one is a replay)"
            )
            return Result(number, name, "PASS", summary + waited)
        summary = (
            f"cannot tell a replay from a second execution: {bytes_equal}, no {replay_header} "
            f"header, and {_cannot_tell(distinct)}{waited}"
        )
        return Result(number, name, "INCONCLUSIVE", summary, (WHAT_WOULD_TELL,))
    if replay.status == 409:
        return Result(
            number,
            name,
            "FAIL",
            f"still in progress after {waits} retries: {evidence(replay, replay_header)}",
        )
    if replay.status != first.status:
        summary = f"answered {replay.status}, the first request {first.status}: not a replay"
    else:
        summary = "the retry ran again: same status, a different body (a second execution)"
    details = body_differences(first.body, replay.body) if replay.body != first.body else ()
    return Result(number, name, "FAIL", f"{summary}{waited}; {excerpt(replay.body)}", details)


def judge_edited(first: Response, edited: Answer, replay_header: str) -> Result:
    """Check 3: the same key with an edited body must be refused, never replayed or run."""
    number, name = 3, "edited retry"
    if isinstance(edited, NoResponse):
        return _no_answer(number, name, edited)
    shown = evidence(edited, replay_header)
    if edited.status in REFUSED:
        return Result(number, name, "PASS", f"refused ({REFUSED[edited.status]}): {shown}")
    if edited.status == 409:
        return Result(
            number,
            name,
            "WARN",
            f"refused with 409: accepted, though 422 says what happened (the key was reused "
            f"with another request) and 409 tells clients to retry: {shown}",
        )
    if edited.ok:
        if _equal_start(edited, first):
            what = (
                "an edited retry succeeded, with the first request's status and first 8 MiB "
                "(the rest not compared): the key did not stop a different request"
            )
        elif edited.same_as(first) and edited.header(replay_header) is None:
            what = (
                "an edited retry was answered with the first request's bytes (replayed, or run "
                "again with the same answer): the key did not stop a different request"
            )
        elif edited.same_as(first):
            what = "an edited retry was replayed: the first request's answer, for another request"
        else:
            what = "an edited retry was executed: the key did not stop a different request"
        return Result(number, name, "FAIL", f"{what}: {shown}")
    return Result(number, name, "FAIL", f"expected 422 (or 400, 409), got {shown}")


def judge_keyless(answer: Answer, replay_header: str) -> Result:
    """Check 4: without a key, the endpoint either requires one or runs unprotected."""
    number, name = 4, "no key"
    if isinstance(answer, NoResponse):
        return _no_answer(number, name, answer)
    shown = evidence(answer, replay_header)
    if answer.status in KEY_REQUIRED:
        return Result(number, name, "PASS", f"the endpoint requires a key: {shown}")
    if answer.ok:
        return Result(
            number,
            name,
            "WARN",
            f"runs without a key, unprotected: a client that forgets the key can pay twice: "
            f"{shown}",
        )
    if answer.status >= 500:
        return Result(number, name, "FAIL", f"a server error for a request without a key: {shown}")
    return Result(number, name, "WARN", f"answered {shown}")


def _in_flight_together(answers: Sequence[Answer]) -> int:
    """How many requests were sent before the first answer began: the overlap achieved."""
    answered = [a.answered_at for a in answers if isinstance(a, Response)]
    if not answered:
        return 0
    first_answer = min(answered)
    return sum(1 for a in answers if a.sent_at and a.sent_at <= first_answer)


def judge_concurrent(
    answers: Sequence[Answer], replay_header: str, distinct: bool | None = None
) -> Result:
    """Check 5: N identical first requests at once: at most one execution.

    Every success must be the same (status, bytes); the rest 409 with ``Retry-After``.
    ``distinct`` as in :func:`judge_replay`: several byte-equal successes without a replay
    header are one execution only when executions answer different bytes.
    """
    number, name, n = 5, "concurrent duplicates", len(answers)
    lost = [a for a in answers if isinstance(a, NoResponse)]
    responses = [a for a in answers if isinstance(a, Response)]
    if lost:
        return Result(number, name, "FAIL", f"{len(lost)} of {n} got no answer: {lost[0].reason}")
    successes = [r for r in responses if r.ok]
    conflicts = [r for r in responses if r.status == 409]
    others = [r for r in responses if not r.ok and r.status != 409]
    counts: dict[int, int] = {}
    for r in responses:
        counts[r.status] = counts.get(r.status, 0) + 1
    tally = f"{n} at once: " + ", ".join(f"{c} x {s}" for s, c in sorted(counts.items()))
    if others:
        return Result(
            number, name, "FAIL", f"{tally}: unexpected {evidence(others[0], replay_header)}"
        )
    if not successes:
        return Result(number, name, "FAIL", f"{tally}: no request succeeded")
    different = list({(r.status, r.body): r for r in successes}.values())
    if len(different) > 1:
        return Result(
            number,
            name,
            "FAIL",
            f"{tally}: concurrent duplicates ran {len(different)} times "
            f"({len(different)} different answers for one key)",
            body_differences(different[0].body, different[1].body),
        )
    if any(r.truncated for r in successes):
        return Result(
            number,
            name,
            "INCONCLUSIVE",
            f"{tally}: cannot tell one execution from more: {PAST_CAP}",
        )
    replays = sum(1 for r in successes if r.header(replay_header) is not None)
    bare = [r for r in conflicts if r.header("Retry-After") is None]
    if conflicts and not bare:
        tally += f" ({header_line('Retry-After', conflicts[0].header('Retry-After') or '')})"
    unmarked = len(successes) - replays
    if unmarked > 1 and not distinct:
        return Result(
            number,
            name,
            "INCONCLUSIVE",
            f"{tally}: cannot tell one execution from {unmarked}: {unmarked} byte-equal "
            f"answers without {replay_header}, and {_cannot_tell(distinct)}",
            (WHAT_WOULD_TELL,),
        )
    shown = f"{tally}: one execution" + (f", {replays} replayed" if replays else "")
    together = _in_flight_together(answers)
    if bare:
        return Result(number, name, "WARN", f"{shown}, but {len(bare)} x 409 without Retry-After")
    if together < 2 and not conflicts:
        return Result(
            number,
            name,
            "WARN",
            f"{shown}, but inconclusive: each answer came before the next request was sent, "
            "so nothing ran concurrently (a slower endpoint, or more --concurrency, overlaps)",
        )
    return Result(number, name, "PASS", f"{shown}; {together} of {n} in flight together")


def judge_other_tenant(
    first: Response, other: Answer, replay_header: str, distinct: bool | None = None
) -> Result:
    """Check 6: the same key from another tenant must not see the first tenant's response.

    ``distinct`` as in :func:`judge_replay`: the first tenant's bytes without a replay header
    are its record only when executions answer different bytes.
    """
    number, name = 6, "other tenant"
    if isinstance(other, NoResponse):
        return _no_answer(number, name, other)
    shown = evidence(other, replay_header)
    if _equal_start(other, first):
        summary = f"cannot tell the first tenant's record from the other tenant's: {PAST_CAP}"
        return Result(number, name, "INCONCLUSIVE", f"{summary}: {shown}")
    if other.same_as(first) and other.header(replay_header) is None and not distinct:
        return Result(
            number,
            name,
            "INCONCLUSIVE",
            f"cannot tell the first tenant's record from the other tenant's own execution: "
            f"byte-equal answers, no {replay_header} header, and {_cannot_tell(distinct)}: "
            f"{shown}",
            (WHAT_WOULD_TELL,),
        )
    if other.same_as(first):
        return Result(
            number, name, "FAIL", f"another tenant was served the first tenant's response: {shown}"
        )
    if other.ok:
        return Result(number, name, "PASS", f"its own answer, not the first tenant's: {shown}")
    if other.status in (409, 422):
        return Result(
            number,
            name,
            "WARN",
            f"refused ({other.status}): keys are shared across tenants, so one tenant's key "
            f"blocks another's: {shown}",
        )
    if other.status in (401, 403):
        return Result(
            number,
            name,
            "WARN",
            f"inconclusive: the other tenant was not let in ({shown}); check --other-tenant-header",
        )
    if other.status >= 500:
        return Result(number, name, "FAIL", f"a server error for the other tenant: {shown}")
    return Result(number, name, "WARN", f"answered {shown}")
