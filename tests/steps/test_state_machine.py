"""A hypothesis state machine mixes claims, checkpoints, completions, releases, renewals and
lease lapses against the real scripts, and compares Redis with a model after every step.

The model is the recovery-point contract: a checkpoint is written only by the owner of a
record in progress, and only once per name; a claim hands every finished step to its owner;
a release keeps the steps (and the payload binding), a completion drops them.
Runs on the real server and on fakeredis (``sync_client``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from idemkey import Policy, RedisStore
from idemkey._core import (
    Claimed,
    Decision,
    InFlight,
    Mismatch,
    Record,
    Replay,
    owner_tag,
    record_for,
)
from idemkey.guard._steps import step_field
from tests._servers import wait_until

OWNERS = st.sampled_from(["o1", "o2"])  # two: a rule often hits the owner
FINGERPRINTS = st.sampled_from(["fp1", "fp2"])
STEP_NAMES = st.sampled_from(["reserve", "charge", "ship"])
LEASE_MS = 60_000  # leases only lapse when a rule says so


@dataclass
class Model:
    state: str | None = None  # None, "in_progress", "complete"
    fp: str | None = None
    owner: str | None = None
    fence: int = 0
    resp: bytes | None = None
    lock: str | None = None
    takeover: bool = False
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
        if self.owner != owner:
            return False
        if self.state != "complete":
            self.state, self.resp = "complete", resp
            self.steps.clear()
            if self.lock == owner:
                self.lock = None
        return True

    def release(self, owner: str) -> bool:
        if self.owner != owner or self.state != "in_progress":
            return False
        if self.lock == owner:
            self.lock = None
        self.state = self.owner = self.resp = None
        if not self.steps:  # finished steps keep the key bound to their payload
            self.fp = None
        return True

    def renew(self, owner: str) -> bool:
        if self.lock is not None:
            return self.lock == owner
        if self.owner == owner and self.state == "in_progress":
            self.lock = owner
            return True
        return False


class StepMachine(RuleBasedStateMachine):
    client: redis.Redis
    prefix: str

    def __init__(self) -> None:
        super().__init__()
        self.store = RedisStore(self.client, Policy(prefix=self.prefix))
        self.record: Record = record_for(self.prefix, "", "GUARD", "", uuid.uuid4().hex)
        self.model = Model()
        self.writes = 0

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

    @rule(owner=OWNERS)
    def complete(self, owner: str) -> None:
        self.writes += 1
        resp = b"resp-%d" % self.writes
        assert self.store.complete(self.record, owner, resp) == self.model.complete(owner, resp)

    @rule(owner=OWNERS)
    def release(self, owner: str) -> None:
        assert self.store.release(self.record, owner) == self.model.release(owner)

    @rule(owner=OWNERS)
    def renew(self, owner: str) -> None:
        assert self.store.renew(self.record, owner, lease_ms=LEASE_MS) == self.model.renew(owner)

    @rule()
    def lease_lapses(self) -> None:
        self.client.pexpire(self.record.lock, 1)
        wait_until(
            lambda: not self.client.exists(self.record.lock), timeout=5, message="lock expiry"
        )
        self.model.lock = None

    @invariant()
    def redis_matches_the_model(self) -> None:
        model = self.model
        fields = self.client.hgetall(self.record.key)
        expected: dict[bytes, bytes] = {}
        if model.state == "complete":
            # Only the response, and the fingerprint followed by the owner's 12-character tag;
            # the fence and the steps are gone.
            assert model.fp is not None
            assert model.owner is not None
            assert model.resp is not None
            tag = owner_tag(model.owner)
            expected = {b"fp": (model.fp + tag).encode(), b"resp": model.resp}
        else:
            if model.fence:
                expected[b"fence"] = str(model.fence).encode()
            for name in ("state", "fp", "owner"):
                value = getattr(model, name)
                if value is not None:
                    expected[name.encode()] = value.encode()
            if model.state is not None and model.takeover:
                expected[b"tk"] = b"1"
            if model.steps:
                expected[b"ns"] = str(len(model.steps)).encode()
            for name, result in model.steps.items():
                expected[step_field(name).encode()] = result
        assert fields == expected
        lock = self.client.get(self.record.lock)
        assert lock == (model.lock.encode() if model.lock else None)

    def teardown(self) -> None:
        self.store.close()


def test_the_scripts_with_steps_follow_the_model(sync_client: redis.Redis, prefix: str) -> None:
    machine = type("Machine", (StepMachine,), {"client": sync_client, "prefix": prefix})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=60,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
            database=None,
        ),
    )
