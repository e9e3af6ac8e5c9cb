"""The probe's sequence as a sans-IO state machine: it says what to send, is told what came
back, and decides; a driver only moves bytes.

::

    session = ProbeSession(plan, first_key, concurrent_key)
    while (batch := session.next_batch()) is not None:
        session.receive(send(batch))        # one answer per request, in order
    session.results

A batch is one request, or ``plan.concurrency`` requests to send at once (check 5); it may ask
the driver to wait first (a ``Retry-After``). A replay answered with the first request's bytes
and no replay header is judged once checks 4 and 5 show whether this endpoint's answers differ
per execution (:func:`~.verdicts.executions_differ`): until then its verdict, and those after
it, are held back, so results still come out in check order. Asking for a batch while one is
out, or answering when none is, raises :class:`ProbeStateError` (h11's habit: misuse is loud).
The number of requests never exceeds :attr:`Plan.max_requests`.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from .verdicts import (
    Answer,
    Response,
    Result,
    executions_differ,
    judge_concurrent,
    judge_edited,
    judge_first,
    judge_keyless,
    judge_other_tenant,
    judge_replay,
)

__all__ = [
    "CHECK_NAMES",
    "Batch",
    "Outgoing",
    "Plan",
    "ProbeSession",
    "ProbeStateError",
    "derive_edit",
]

Headers = tuple[tuple[str, str], ...]

CHECK_NAMES: Final = {
    1: "first request",
    2: "same key again",
    3: "edited retry",
    4: "no key",
    5: "concurrent duplicates",
    6: "other tenant",
}


class ProbeStateError(Exception):
    """The session was driven out of order (a bug in the driver, not in the endpoint)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What to probe with: the request, its edited twin, and the limits."""

    method: str
    headers: Headers  # the caller's headers, never the key
    body: bytes
    edited: bytes
    concurrency: int = 5
    replay_header: str = "Idempotent-Replayed"
    other_tenant: tuple[str, str] | None = None
    key_header: str = "Idempotency-Key"
    #: 409s answered by waiting Retry-After and sending check 2 again (the first request's
    #: record may settle a moment after its answer reaches us).
    replay_retries: int = 3
    #: The longest Retry-After honoured, in seconds.
    max_wait: float = 5.0

    @property
    def max_requests(self) -> int:
        """The most requests one run sends: checks 1, 2 (with its retries), 3, 4, 5 and 6."""
        tenant = 1 if self.other_tenant is not None else 0
        return 1 + (1 + self.replay_retries) + 1 + 1 + self.concurrency + tenant


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One request to send: the plan's method and URL, these headers and body."""

    headers: Headers
    body: bytes


@dataclass(frozen=True, slots=True)
class Batch:
    """Requests for one check, sent at once when there are several, after ``wait`` seconds."""

    check: int
    requests: tuple[Outgoing, ...]
    wait: float = 0.0


class _Stage(enum.Enum):
    FIRST = 1
    REPLAY = 2
    EDITED = 3
    KEYLESS = 4
    CONCURRENT = 5
    OTHER_TENANT = 6
    DONE = 7


class ProbeSession:
    """Checks 1 to 6 against one endpoint, in order, with two fresh keys."""

    def __init__(self, plan: Plan, first_key: str, concurrent_key: str) -> None:
        if first_key == concurrent_key:
            raise ValueError("the concurrent check needs a key of its own")
        self.plan = plan
        self.first_key = first_key
        self.concurrent_key = concurrent_key
        self.results: list[Result] = []
        self.sent = 0
        self._stage = _Stage.FIRST
        self._out: Batch | None = None
        self._first: Response | None = None
        self._waits = 0
        self._wait = 0.0
        # Answers to the same request that surely ran apart from check 1 (checks 4 and 5).
        self._others: list[Answer] = []
        # Check 2's answer while its verdict waits for them (see the module docstring).
        self._held: Answer | None = None
        self._released = 0

    @property
    def done(self) -> bool:
        return self._stage is _Stage.DONE

    def next_batch(self) -> Batch | None:
        """The requests to send now, or None when every check has a verdict."""
        if self._out is not None:
            raise ProbeStateError("the previous batch has not been answered")
        if self._stage is _Stage.DONE:
            return None
        batch = self._batch(self._stage)
        if self.sent + len(batch.requests) > self.plan.max_requests:  # pragma: no cover
            raise ProbeStateError("the request budget would be exceeded")
        self.sent += len(batch.requests)
        self._out = batch
        return batch

    def receive(self, answers: Sequence[Answer]) -> list[Result]:
        """The answers to the last batch, in order; returns the verdicts this settled."""
        batch = self._out
        if batch is None:
            raise ProbeStateError("no batch is waiting for answers")
        if len(answers) != len(batch.requests):
            raise ProbeStateError(f"expected {len(batch.requests)} answers, got {len(answers)}")
        self._out = None
        self._decide(answers)
        # Everything before a held verdict is settled; the held one and those after it wait.
        ready = len(self.results)
        if self._held is not None:
            ready = sum(1 for r in self.results if r.number < 2)
        settled = self.results[self._released : ready]
        self._released = max(self._released, ready)
        return settled

    # The sequence.

    def _headers(self, key: str | None, tenant: tuple[str, str] | None = None) -> Headers:
        headers = self.plan.headers
        if tenant is not None:  # the other tenant's credentials replace the first one's
            kept = tuple(h for h in headers if h[0].lower() != tenant[0].lower())
            headers = (*kept, tenant)
        return headers + (((self.plan.key_header, key),) if key is not None else ())

    def _batch(self, stage: _Stage) -> Batch:
        plan, key = self.plan, self.first_key
        if stage in (_Stage.FIRST, _Stage.REPLAY):
            return Batch(stage.value, (Outgoing(self._headers(key), plan.body),), self._wait)
        if stage is _Stage.EDITED:
            return Batch(stage.value, (Outgoing(self._headers(key), plan.edited),))
        if stage is _Stage.KEYLESS:
            return Batch(stage.value, (Outgoing(self._headers(None), plan.body),))
        if stage is _Stage.CONCURRENT:
            one = Outgoing(self._headers(self.concurrent_key), plan.body)
            return Batch(stage.value, (one,) * plan.concurrency)
        assert stage is _Stage.OTHER_TENANT
        assert plan.other_tenant is not None
        return Batch(stage.value, (Outgoing(self._headers(key, plan.other_tenant), plan.body),))

    def _decide(self, answers: Sequence[Answer]) -> None:
        stage, replay_header = self._stage, self.plan.replay_header
        answer = answers[0]
        if stage is _Stage.FIRST:
            result = judge_first(answer, replay_header)
            self.results.append(result)
            if result.verdict != "PASS" or not isinstance(answer, Response):
                self._skip_rest("needs a successful first request")
                return
            self._first = answer
            self._stage = _Stage.REPLAY
            return
        first = self._first
        assert first is not None
        if stage is _Stage.REPLAY:
            if (
                isinstance(answer, Response)
                and answer.status == 409
                and self._waits < self.plan.replay_retries
            ):
                self._waits += 1
                self._wait = _retry_after(answer, self.plan.max_wait)
                return  # the same check again, after the wait
            self._wait = 0.0
            if (
                isinstance(answer, Response)
                and answer.same_as(first)
                and answer.header(replay_header) is None
            ):
                self._held = answer  # a replay, or a second run with the same answer: see 4, 5
            else:
                self.results.append(judge_replay(first, answer, replay_header, self._waits))
            self._stage = _Stage.EDITED
        elif stage is _Stage.EDITED:
            self.results.append(judge_edited(first, answer, replay_header))
            self._stage = _Stage.KEYLESS
        elif stage is _Stage.KEYLESS:
            self.results.append(judge_keyless(answer, replay_header))
            self._others.append(answer)
            self._stage = _Stage.CONCURRENT
        elif stage is _Stage.CONCURRENT:
            self._others.extend(answers)
            distinct = self._distinct()
            self.results.append(judge_concurrent(answers, replay_header, distinct))
            if self._held is not None:
                held = judge_replay(first, self._held, replay_header, self._waits, distinct)
                self.results.insert(1, held)
                self._held = None
            self._stage = _Stage.OTHER_TENANT
            if self.plan.other_tenant is None:
                self.results.append(
                    Result(
                        6,
                        CHECK_NAMES[6],
                        "SKIP",
                        "not run: give --other-tenant-header 'Authorization: Bearer <other>'",
                    )
                )
                self._stage = _Stage.DONE
        else:
            distinct = self._distinct()
            self.results.append(judge_other_tenant(first, answer, replay_header, distinct))
            self._stage = _Stage.DONE

    def _distinct(self) -> bool | None:
        assert self._first is not None
        return executions_differ(self._first, self._others)

    def _skip_rest(self, why: str) -> None:
        for number in range(len(self.results) + 1, 7):
            self.results.append(Result(number, CHECK_NAMES[number], "SKIP", f"not run: {why}"))
        self._stage = _Stage.DONE


def _retry_after(answer: Response, cap: float) -> float:
    """The wait a 409 asks for (delta-seconds), 1 s when it gives none, at most ``cap``."""
    value = (answer.header("Retry-After") or "").strip()
    # isdigit() alone passes "²" (a latin-1 byte), which float() refuses.
    seconds = float(value) if value.isascii() and value.isdigit() else 1.0
    return min(seconds, cap)


def derive_edit(body: bytes) -> tuple[bytes, str] | None:
    """An edited twin of a JSON object body and what changed, or None when none is obvious.

    The first top-level integer (not a boolean) gains 1, else the first number, else the first
    string gets ``-edited``: a change a real client could make, and one that a request
    fingerprint must notice.
    """
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # nested deeper than Python parses: none derived
        return None
    if not isinstance(data, dict):
        return None
    for kinds in ((int,), (float,), (str,)):
        for name, value in data.items():
            if isinstance(value, bool) or not isinstance(value, kinds):
                continue
            changed = value + "-edited" if isinstance(value, str) else value + 1
            edited = {**data, name: changed}
            return json.dumps(
                edited
            ).encode(), f"{name}: {json.dumps(value)} -> {json.dumps(changed)}"
    return None
