"""A hypothesis state machine mixes claims, checkpoints, step attempts, remembered failures,
completions, releases, cancels, renewals and lease lapses against the real scripts, and
compares Redis with a model after every step.

The model is the recovery-point contract: a checkpoint is written only by the owner of a
record in progress, and only once per name; a claim hands every finished step to its owner;
a release keeps the steps (and the payload binding), a completion drops them. A retried step's
attempts are counted only by the owner, carried over by a takeover, dropped by a release, a
completion or a cancel. A remembered failure (a step's or the call's) comes back from the
scripts as the same exception, same message and fields. A cancel removes the owner (whose
checkpoints, attempts and completion are then refused), raises the fence, and keeps or drops
the steps.
The set-up, the rules on an owner that need nothing new (complete, release, renew, lease
lapses) and the comparison of the record hash come from the record machine
(tests/store/test_state_machine.py); this one adds the steps. Runs on the real server and on
fakeredis (``sync_client``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import redis
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from idemkey._core import Claimed, Decision, InFlight, Mismatch, Replay
from idemkey.guard._failures import is_failure, raise_failure, rules_for
from idemkey.guard._steps import attempt_field, step_field
from tests.store.test_state_machine import NEW_FENCE, Model, ScriptMachine, run_machine

OWNERS = st.sampled_from(["o1", "o2"])  # two: a rule often hits the owner
FINGERPRINTS = st.sampled_from(["fp1", "fp2"])
STEP_NAMES = st.sampled_from(["reserve", "charge", "ship"])
LEASE_MS = 60_000  # leases only lapse when a rule says so


class Declined(Exception):
    """A remembered failure, with a declared field."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


REMEMBER = rules_for({Declined: ("code",)})


def check_remembered(stored: bytes, writes: int) -> None:
    """A stored failure comes back as the exception it was: class, message, declared field."""
    assert is_failure(stored)
    error = raise_failure(stored, REMEMBER)
    assert type(error) is Declined
    assert str(error) == f"declined {writes}"
    assert error.code == writes


@dataclass
class StepModel(Model):
    """The record model plus its finished steps."""

    steps: dict[str, bytes] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)

    def claim(self, fp: str, owner: str) -> Decision:
        if self.fp is not None and fp != self.fp:
            return Mismatch()
        if self.state == "complete":
            assert self.resp is not None
            return Replay(self.resp)
        if self.state == "in_progress" and self.owner == owner:  # our claim, sent again
            self.lock = owner
            return Claimed(owner, self.fence, self.takeover, tuple(self.steps.items()))
        if self.lock is not None:
            return InFlight(0)
        self.takeover = self.state == "in_progress"
        self.state, self.fp, self.owner, self.lock = "in_progress", fp, owner, owner
        return Claimed(owner, NEW_FENCE, self.takeover, tuple(self.steps.items()))

    def checkpoint(self, owner: str, name: str, result: bytes) -> bytes | None:
        if self.owner != owner or self.state != "in_progress":
            return None
        return self.steps.setdefault(name, result)  # the first result of a step stays

    def attempt(self, owner: str, name: str) -> int | None:
        if self.owner != owner or self.state != "in_progress":
            return None
        self.attempts[name] = self.attempts.get(name, 0) + 1
        return self.attempts[name]

    def cancel(self, abandon: bool) -> int | None:
        if self.state == "complete" or (self.state != "in_progress" and not self.steps):
            return None
        self.lock = self.state = self.owner = None
        self.fence += 1
        self.attempts.clear()
        if abandon or not self.steps:
            self.steps.clear()
            self.fp = None
        return self.fence

    def complete(self, owner: str, resp: bytes) -> bool:
        done = super().complete(owner, resp)
        if done:
            self.steps.clear()
            self.attempts.clear()
        return done

    def release(self, owner: str) -> bool:
        if self.owner != owner or self.state != "in_progress":
            return self.ro == owner  # a re-sent release: released by this owner already
        if self.lock == owner:
            self.lock = None
        self.ro = owner
        self.state = self.owner = self.resp = None
        self.attempts.clear()
        if not self.steps:  # finished steps keep the key bound to their payload
            self.fp = None
        return True


class StepMachine(ScriptMachine):
    method = "GUARD"
    path = ""
    model: StepModel

    def new_model(self) -> StepModel:
        self.failures: dict[bytes, int] = {}  # each stored failure: the write that made it
        return StepModel()

    @initialize()
    def first_claim(self) -> None:
        """Every example starts with a live claim, so steps land in most of them."""
        self.claim("fp1", "o1")

    @rule(fp=FINGERPRINTS, owner=OWNERS)
    def claim(self, fp: str, owner: str) -> None:
        expected = self.model.claim(fp, owner)
        actual = self.store.claim(self.record, fp, owner=owner, lease_ms=LEASE_MS, heartbeat=False)
        if isinstance(expected, InFlight):
            assert isinstance(actual, InFlight)
        elif isinstance(expected, Claimed):
            assert isinstance(actual, Claimed)
            if expected.fence == NEW_FENCE:
                self.model.fenced(actual.fence)
                expected = expected._replace(fence=actual.fence)
            assert (actual.owner, actual.fence, actual.takeover) == (
                expected.owner,
                expected.fence,
                expected.takeover,
            )
            assert dict(actual.steps) == dict(expected.steps)  # any order
            for stored in dict(actual.steps).values():
                if stored in self.failures:
                    check_remembered(stored, self.failures[stored])
                else:
                    assert not is_failure(stored)
        else:
            assert actual == expected
            if isinstance(actual, Replay):
                if actual.response in self.failures:
                    check_remembered(actual.response, self.failures[actual.response])
                else:
                    assert not is_failure(actual.response)

    @rule(owner=OWNERS, name=STEP_NAMES)
    def checkpoint(self, owner: str, name: str) -> None:
        self.writes += 1
        result = b"%s-%d" % (name.encode(), self.writes)
        actual = self.store.checkpoint(self.record, owner, step_field(name), result)
        assert actual == self.model.checkpoint(owner, name, result)

    @rule(owner=OWNERS, name=STEP_NAMES)
    def attempt(self, owner: str, name: str) -> None:
        actual = self.store.attempt(self.record, owner, attempt_field(name))
        assert actual == self.model.attempt(owner, name)

    @rule(owner=OWNERS, name=STEP_NAMES)
    def step_fails_for_good(self, owner: str, name: str) -> None:
        """A step raised a remembered failure: stored as its checkpoint."""
        self.writes += 1
        failure = self.failure()
        actual = self.store.checkpoint(self.record, owner, step_field(name), failure)
        assert actual == self.model.checkpoint(owner, name, failure)

    @rule(owner=OWNERS)
    def call_fails_for_good(self, owner: str) -> None:
        """The block raised a remembered failure: the record completes with it."""
        self.writes += 1
        failure = self.failure()
        done = self.store.complete(self.record, owner, failure)
        assert done == self.model.complete(owner, failure)

    @rule(abandon=st.booleans())
    def cancel(self, abandon: bool) -> None:
        found = self.store.cancel(self.record, abandon=abandon)
        assert (found.fence if found else None) == self.model.cancel(abandon)

    def failure(self) -> bytes:
        assert REMEMBER is not None
        encoded = REMEMBER.encode(Declined(f"declined {self.writes}", self.writes))
        assert encoded is not None
        self.failures[encoded] = self.writes
        return encoded

    # The same rules by the record's current owner: random owners alone rarely line up a
    # claim, a checkpoint and a completion by one owner within hypothesis's short examples.

    @rule(
        name=STEP_NAMES,
        times=st.integers(1, 3),
        end=st.sampled_from(["release", "complete", "cancel", "take over", "checkpoint"]),
    )
    def retried_by_owner(self, name: str, times: int, end: str) -> None:
        """The current owner's step fails ``times`` attempts, then the call ends some way."""
        owner = self.model.owner or "o1"
        for _ in range(times):
            self.attempt(owner, name)
        if end == "release":
            self.release(owner)
        elif end == "complete":
            self.complete(owner)
        elif end == "cancel":
            self.cancel(False)
        elif end == "take over":
            self.taken_over("o2" if owner == "o1" else "o1")
        else:
            self.checkpoint(owner, name)

    @rule(owner=OWNERS)
    def taken_over(self, owner: str) -> None:
        """The owner dies: its lease lapses, and ``owner`` (maybe itself, after a restart)
        claims the record with its payload: a takeover, which must keep steps and counts."""
        self.lease_lapses()
        self.claim(self.model.fp or "fp1", owner)

    @rule(name=STEP_NAMES)
    def attempt_by_owner(self, name: str) -> None:
        self.attempt(self.model.owner or "o1", name)

    @rule(name=STEP_NAMES)
    def step_fails_by_owner(self, name: str) -> None:
        self.step_fails_for_good(self.model.owner or "o1", name)

    @rule()
    def call_fails_by_owner(self) -> None:
        self.call_fails_for_good(self.model.owner or "o1")

    @rule(name=STEP_NAMES)
    def checkpoint_by_owner(self, name: str) -> None:
        self.checkpoint(self.model.owner or "o1", name)

    @rule()
    def complete_by_owner(self) -> None:
        self.complete(self.model.owner or "o1")

    @rule()
    def release_by_owner(self) -> None:
        self.release(self.model.owner or "o1")

    @rule(
        fp=FINGERPRINTS,
        owner=OWNERS,
        names=st.lists(st.tuples(STEP_NAMES, st.integers(0, 2)), max_size=3),
        end=st.sampled_from(["complete", "release", "crash", "fail"]),
    )
    def job(self, fp: str, owner: str, names: list[tuple[str, int]], end: str) -> None:
        """A whole executor in one rule: claim, some steps (each after some failed attempts
        of it), then complete, release, crash (nothing: its lease lapses later, or not) or
        fail for good. Each part is checked like its own rule."""
        self.claim(fp, owner)
        for name, failed in names:
            for _ in range(failed + 1 if failed else 0):
                self.attempt(owner, name)
            self.checkpoint(owner, name)
        if end == "complete":
            self.complete(owner)
        elif end == "release":
            self.release(owner)
        elif end == "fail":
            self.call_fails_for_good(owner)

    def expected_fields(self) -> dict[bytes, bytes]:
        # A completed record: as the base model says, the fence and the steps gone.
        expected = super().expected_fields()
        if self.model.state != "complete":
            if self.model.steps:
                expected[b"ns"] = str(len(self.model.steps)).encode()
            for name, result in self.model.steps.items():
                expected[step_field(name).encode()] = result
            if self.model.attempts:
                expected[b"na"] = b"1"
            for name, count in self.model.attempts.items():
                expected[attempt_field(name).encode()] = str(count).encode()
        return expected


def test_the_scripts_with_steps_follow_the_model(sync_client: redis.Redis, prefix: str) -> None:
    run_machine(StepMachine, sync_client, prefix, max_examples=80)
