"""A hypothesis state machine mixes claims, checkpoints, completions, releases, renewals and
lease lapses against the real scripts, and compares Redis with a model after every step.

The model is the recovery-point contract: a checkpoint is written only by the owner of a
record in progress, and only once per name; a claim hands every finished step to its owner;
a release keeps the steps (and the payload binding), a completion drops them.
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
from idemkey.guard._steps import step_field
from tests.store.test_state_machine import Model, ScriptMachine, run_machine

OWNERS = st.sampled_from(["o1", "o2"])  # two: a rule often hits the owner
FINGERPRINTS = st.sampled_from(["fp1", "fp2"])
STEP_NAMES = st.sampled_from(["reserve", "charge", "ship"])
LEASE_MS = 60_000  # leases only lapse when a rule says so


@dataclass
class StepModel(Model):
    """The record model plus its finished steps."""

    steps: dict[str, bytes] = field(default_factory=dict)

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
        self.fence += 1
        self.state, self.fp, self.owner, self.lock = "in_progress", fp, owner, owner
        return Claimed(owner, self.fence, self.takeover, tuple(self.steps.items()))

    def checkpoint(self, owner: str, name: str, result: bytes) -> bytes | None:
        if self.owner != owner or self.state != "in_progress":
            return None
        return self.steps.setdefault(name, result)  # the first result of a step stays

    def complete(self, owner: str, resp: bytes) -> bool:
        done = super().complete(owner, resp)
        if done:
            self.steps.clear()
        return done

    def release(self, owner: str) -> bool:
        if self.owner != owner or self.state != "in_progress":
            return False
        if self.lock == owner:
            self.lock = None
        self.state = self.owner = self.resp = None
        if not self.steps:  # finished steps keep the key bound to their payload
            self.fp = None
        return True


class StepMachine(ScriptMachine):
    method = "GUARD"
    path = ""
    model: StepModel

    def new_model(self) -> StepModel:
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
            assert (actual.owner, actual.fence, actual.takeover) == (
                expected.owner,
                expected.fence,
                expected.takeover,
            )
            assert dict(actual.steps) == dict(expected.steps)  # any order
        else:
            assert actual == expected

    @rule(owner=OWNERS, name=STEP_NAMES)
    def checkpoint(self, owner: str, name: str) -> None:
        self.writes += 1
        result = b"%s-%d" % (name.encode(), self.writes)
        actual = self.store.checkpoint(self.record, owner, step_field(name), result)
        assert actual == self.model.checkpoint(owner, name, result)

    # The same rules by the record's current owner: random owners alone rarely line up a
    # claim, a checkpoint and a completion by one owner within hypothesis's short examples.

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
        names=st.lists(STEP_NAMES, max_size=3),
        end=st.sampled_from(["complete", "release", "crash"]),
    )
    def job(self, fp: str, owner: str, names: list[str], end: str) -> None:
        """A whole executor in one rule: claim, some steps, then complete, release or crash
        (nothing: its lease lapses later, or not). Each part is checked like its own rule."""
        self.claim(fp, owner)
        for name in names:
            self.checkpoint(owner, name)
        if end == "complete":
            self.complete(owner)
        elif end == "release":
            self.release(owner)

    def expected_fields(self) -> dict[bytes, bytes]:
        # A completed record: as the base model says, the fence and the steps gone.
        expected = super().expected_fields()
        if self.model.state != "complete":
            if self.model.steps:
                expected[b"ns"] = str(len(self.model.steps)).encode()
            for name, result in self.model.steps.items():
                expected[step_field(name).encode()] = result
        return expected


def test_the_scripts_with_steps_follow_the_model(sync_client: redis.Redis, prefix: str) -> None:
    run_machine(StepMachine, sync_client, prefix, max_examples=60)
