"""A hypothesis state machine drives claim/complete/release/renew/expiry against a model.

The model is the contract of the four scripts (docs/design.md#the-scripts) in a few lines of Python;
after every step the record hash and the lock in Redis must equal the model, field by field.
Runs on the real server and on fakeredis (``sync_client``), with a bounded example count.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from idemkey import Policy, RedisStore
from idemkey._core import owner_tag
from idemkey.records import Claimed, Decision, InFlight, Mismatch, Record, Replay, record_for
from tests._lease import lapse, lease_holder

OWNERS = st.sampled_from(["o1", "o2", "o3"])
FINGERPRINTS = st.sampled_from(["fp1", "fp2"])
LEASE_MS = 60_000  # leases only lapse when a rule says so
#: What the model answers for a claim's new fence: the script's comes from the server clock,
#: so the machine checks it is above every fence before it and then keeps it (Model.fenced).
NEW_FENCE = -1


@dataclass
class Model:
    """What the record should hold: the hash fields and the lock's holder."""

    state: str | None = None  # None, "in_progress", "complete"
    fp: str | None = None
    owner: str | None = None
    fence: int = 0
    f0: int = 0  # the fence the record was created with
    ro: str | None = None  # the owner that released it last
    resp: bytes | None = None
    lock: str | None = None
    takeover: bool = False

    def fenced(self, fence: int) -> None:
        """A new claim got ``fence``: above every fence the record handed out before."""
        assert fence > self.fence
        self.fence = fence
        self.f0 = self.f0 or fence

    def claim(self, fp: str, owner: str) -> Decision:
        if self.state is not None and fp != self.fp:
            return Mismatch()
        if self.state == "complete":
            assert self.resp is not None
            return Replay(self.resp)
        if self.state == "in_progress" and self.owner == owner:  # our claim, sent again
            self.lock = owner
            return Claimed(owner, self.fence, self.takeover)
        if self.lock is not None:
            return InFlight(0)  # retry_after is checked separately
        self.takeover = self.state == "in_progress"
        self.state, self.fp, self.owner, self.lock = "in_progress", fp, owner, owner
        return Claimed(owner, NEW_FENCE, self.takeover)

    def complete(self, owner: str, resp: bytes) -> bool:
        if self.owner != owner:
            return False
        if self.state != "complete":
            self.state, self.resp, self.ro = "complete", resp, None
            if self.lock == owner:
                self.lock = None
        return True

    def release(self, owner: str) -> bool:
        if self.owner != owner or self.state != "in_progress":
            return self.ro == owner  # a re-sent release: released by this owner already
        if self.lock == owner:
            self.lock = None
        self.state = self.fp = self.owner = self.resp = None
        self.ro = owner
        return True

    def renew(self, owner: str) -> bool:
        if self.lock is not None:
            return self.lock == owner
        if self.owner == owner and self.state == "in_progress":
            self.lock = owner
            return True
        return False


class ScriptMachine(RuleBasedStateMachine):
    """The set-up every record machine shares (tests/steps/test_state_machine.py extends it):
    a store on ``client``, a fresh record per example, a model, the rules on an owner that
    need no more than the base model, lease lapses, and Redis compared with the model."""

    client: redis.Redis
    prefix: str
    method = "POST"
    path = "/r"

    def __init__(self) -> None:
        super().__init__()
        self.store = RedisStore(self.client, Policy(prefix=self.prefix))
        # A fresh record per example, so examples never see each other's leftovers.
        self.record: Record = record_for(self.prefix, "", self.method, self.path, uuid.uuid4().hex)
        self.model = self.new_model()
        self.writes = 0

    def new_model(self) -> Model:
        return Model()

    @rule(fp=FINGERPRINTS, owner=OWNERS)
    def claim(self, fp: str, owner: str) -> None:
        expected = self.model.claim(fp, owner)
        actual = self.store.claim(self.record, fp, owner=owner, lease_ms=LEASE_MS, heartbeat=False)
        if isinstance(expected, InFlight):
            assert isinstance(actual, InFlight)
            assert 0 < actual.retry_after <= LEASE_MS / 1000
        elif isinstance(expected, Claimed) and expected.fence == NEW_FENCE:
            assert isinstance(actual, Claimed)
            self.model.fenced(actual.fence)
            assert actual == expected._replace(fence=actual.fence)
        else:
            assert actual == expected

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
        """The lease's owner stalls or dies: its lease runs out (its deadline is moved to the
        past, tests._lease.lapse; there is a lease only while a claim is in progress)."""
        lapse(self.client, self.record)
        self.model.lock = None

    def expected_fields(self) -> dict[bytes, bytes]:
        """The record hash the model stands for."""
        expected: dict[bytes, bytes] = {}
        model = self.model
        if model.state == "complete":
            # Only the response, and the fingerprint followed by the owner's 12-character tag.
            assert model.fp is not None
            assert model.owner is not None
            assert model.resp is not None
            tag = owner_tag(model.owner)
            expected = {b"fp": (model.fp + tag).encode(), b"resp": model.resp}
        else:
            if model.fence:
                expected[b"fence"] = str(model.fence).encode()
                expected[b"f0"] = str(model.f0).encode()
            if model.ro is not None:
                expected[b"ro"] = model.ro.encode()
            for name in ("state", "fp", "owner"):
                value = getattr(model, name)
                if value is not None:
                    expected[name.encode()] = value.encode()
            if model.state is not None and model.takeover:
                expected[b"tk"] = b"1"
        return expected

    @invariant()
    def redis_matches_the_model(self) -> None:
        fields = self.client.hgetall(self.record.key)
        # The lease: a deadline (server clock) while a claim is in progress, and only then.
        deadline = fields.pop(b"lease", None)
        assert fields == self.expected_fields()
        assert (deadline is not None) == (self.model.state == "in_progress")
        holder = lease_holder(self.client, self.record)
        assert holder == (self.model.lock.encode() if self.model.lock else None)

    def teardown(self) -> None:
        self.store.close()


def run_machine(
    base: type[ScriptMachine], client: redis.Redis, prefix: str, *, max_examples: int
) -> None:
    """Run ``base`` on ``client`` under ``prefix``, with a bounded example count."""
    machine = type("Machine", (base,), {"client": client, "prefix": prefix})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
            database=None,
        ),
    )


def test_the_scripts_follow_the_model(sync_client: redis.Redis, prefix: str) -> None:
    run_machine(ScriptMachine, sync_client, prefix, max_examples=40)
