"""Policy(durability=Replicas(...)): the value, and the decisions the stores make on WAIT's answer.

No Redis here: a fake client records what the store queues, so the one-connection rule (EVALSHA
and WAIT in one pipeline) is checked without a server. tests/faults/test_durability.py proves
the same against a real primary and replica.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import (
    ConnectionError as RedisConnectionError,
)
from redis.exceptions import (
    MovedError,
    NoScriptError,
    ResponseError,
    TryAgainError,
)

from idemkey import ConfigurationError, Policy, RedisStore, StoreError
from idemkey.policy import Replicas
from idemkey.records import Claimed, record_for
from idemkey.store._durable import (
    _DONE,
    _LOAD_SCRIPT,
    _SEND_AGAIN,
    _UNCONFIRMED,
    _durable_outcome,
    _durable_reply,
    _unconfirmed,
    _wrote,
)


def test_replicas_defaults_and_units() -> None:
    assert Replicas() == Replicas(1, 0.1)
    assert Replicas(2, 0.25).timeout_ms == 250
    assert Replicas(1, 0.0001).timeout_ms == 1  # never 0: WAIT 0 would block forever


@pytest.mark.parametrize(("count", "timeout"), [(0, 0.1), (-1, 0.1), (1, 0.0), (1, -1.0)])
def test_replicas_refuses_values_that_cannot_work(count: int, timeout: float) -> None:
    with pytest.raises(ConfigurationError):
        Replicas(count, timeout)


def test_policy_durability_is_off_by_default_and_typed() -> None:
    assert Policy().durability is None
    assert Policy(durability=Replicas(1, 0.05)).durability == Replicas(1, 0.05)
    with pytest.raises(ConfigurationError, match="durability"):
        Policy(durability=1)  # type: ignore[arg-type]


def test_replicas_is_frozen() -> None:
    with pytest.raises(AttributeError):
        Replicas().count = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "reply", "wrote"),
    [
        ("claim", [1, 3, 0], True),
        ("claim", [2, b"resp"], False),  # replay: nothing written
        ("claim", [3, 1200], False),  # in flight
        ("claim", [4], False),  # mismatch
        ("complete", 1, True),
        ("complete", 0, False),  # lease lost: nothing written
    ],
)
def test_which_replies_wrote(name: str, reply: Any, wrote: bool) -> None:
    assert _wrote(name, reply) is wrote


def test_the_unconfirmed_error_says_what_happened() -> None:
    error = _unconfirmed("claim", 0, Replicas(2, 0.05))
    assert isinstance(error, StoreError)
    assert "claim reached 0 of 2 replicas within 50 ms" in str(error)


def test_a_failed_wait_is_a_store_error() -> None:
    assert _durable_reply("complete", [1, 1]) == (1, 1)
    with pytest.raises(StoreError, match="WAIT"):
        _durable_reply("complete", [1, Exception("ERR WAIT cannot be used with replica")])


class FakePipeline:
    def __init__(self, owner: FakeClient) -> None:
        self.owner = owner
        self.queued: list[tuple[Any, ...]] = []

    def execute_command(self, *args: Any) -> None:
        self.queued.append(args)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        self.owner.pipelines.append(self.queued)
        return [self.owner.script_reply, self.owner.acked]


class FakeClient:
    """Just enough of redis.Redis for the store's durable path."""

    def __init__(self, script_reply: Any, acked: int) -> None:
        self.script_reply = script_reply
        self.acked = acked
        self.pipelines: list[list[tuple[Any, ...]]] = []
        self.plain: list[tuple[Any, ...]] = []

    def get_encoder(self) -> Any:
        return type("Encoder", (), {"decode_responses": False})()

    def register_script(self, text: str) -> Any:
        return type("Script", (), {"sha": f"sha-{len(text)}", "script": text})()

    def execute_command(self, *args: Any) -> Any:
        self.plain.append(args)
        return 1

    def pipeline(self, transaction: bool = True) -> FakePipeline:
        assert transaction is False  # no MULTI: a script is atomic already
        return FakePipeline(self)


def test_without_durability_the_plain_path_is_untouched() -> None:
    store = RedisStore(FakeClient([1, 1, 0], 0), Policy())
    assert store._eval.__func__ is RedisStore._eval  # type: ignore[attr-defined]


def test_a_durable_claim_queues_evalsha_and_wait_on_one_connection() -> None:
    client = FakeClient([1, 1, 0], 1)
    store = RedisStore(client, Policy(durability=Replicas(1, 0.05)))
    record = record_for("p", "", "POST", "/r", "k")
    decision = store.claim(record, "fp", heartbeat=False)
    assert isinstance(decision, Claimed)
    [queued] = client.pipelines
    assert [command[0] for command in queued] == ["EVALSHA", "WAIT"]
    assert queued[1] == ("WAIT", 1, 50)
    assert queued[0][2:4] == (1, record.key)  # one key: the record (its lease a field)


def test_a_durable_claim_without_enough_replicas_is_released_and_raises() -> None:
    client = FakeClient([1, 1, 0], 0)
    store = RedisStore(client, Policy(durability=Replicas(1, 0.05)))
    record = record_for("p", "", "POST", "/r", "k")
    with pytest.raises(StoreError, match="0 of 1 replicas"):
        store.claim(record, "fp", owner="me", heartbeat=False)
    # The release went out as a plain call, owner-checked.
    [release] = client.plain
    assert release[0] == "EVALSHA"
    assert release[2:] == (1, record.key, "me")


def test_renew_and_release_are_not_waited_for() -> None:
    client = FakeClient([1, 1, 0], 0)
    store = RedisStore(client, Policy(durability=Replicas(1, 0.05)))
    record = record_for("p", "", "POST", "/r", "k")
    assert store.renew(record, "me")
    assert store.release(record, "me")
    assert client.pipelines == []
    assert len(client.plain) == 2


def test_durable_outcomes() -> None:
    one = Replicas(1, 0.1)
    claimed = [1, 1, 0]
    assert _durable_outcome("claim", [claimed, 1], NoScriptError, one, True) == (_DONE, claimed)
    assert _durable_outcome("claim", [[3, 500], 0], NoScriptError, one, True) == (_DONE, [3, 500])
    outcome, error = _durable_outcome("claim", [claimed, 0], NoScriptError, one, True)
    assert outcome == _UNCONFIRMED
    assert isinstance(error, StoreError)
    noscript = NoScriptError("NOSCRIPT")
    assert _durable_outcome("complete", [noscript, 0], NoScriptError, one, True)[0] == _LOAD_SCRIPT
    moved = TryAgainError("TRYAGAIN")
    assert _durable_outcome("complete", [moved, 0], NoScriptError, one, True)[0] == _SEND_AGAIN
    with pytest.raises(StoreError):  # out of time: a failure, not another try
        _durable_outcome("complete", [noscript, 0], NoScriptError, one, False)
    outcome, error = _durable_outcome("complete", [moved, 0], NoScriptError, one, False)
    assert outcome == _SEND_AGAIN  # the shell learns the topology, then raises
    assert isinstance(error, StoreError)


def test_a_redirect_from_a_replica_is_read_before_the_wait_error() -> None:
    """A node map gone stale in a failover sends to the old master, back as a replica: MOVED to
    the script, an error to WAIT. That is a redirect (learn the topology, send again), not a
    failure that would repeat on every call to the slot."""
    one = Replicas(1, 0.1)
    moved = MovedError("3999 127.0.0.1:7001")
    on_replica = ResponseError("WAIT cannot be used with replica instances.")
    outcome, _ = _durable_outcome("claim", [moved, on_replica], NoScriptError, one, True)
    assert outcome == _SEND_AGAIN
    dropped = RedisConnectionError("Connection closed by server.")
    outcome, _ = _durable_outcome("claim", [dropped, dropped], NoScriptError, one, True)
    assert outcome == _SEND_AGAIN  # sent again: the scripts answer a re-send alike
    # A WAIT error after a claim that wrote is a failure that releases the claim (below).
    outcome, error = _durable_outcome("claim", [[1, 1, 0], on_replica], NoScriptError, one, True)
    assert (outcome, type(error)) == (_UNCONFIRMED, StoreError)
    with pytest.raises(StoreError, match="WAIT"):  # nothing written: nothing to release
        _durable_outcome("claim", [[3, 500], on_replica], NoScriptError, one, True)


def test_a_claim_whose_wait_fails_is_released() -> None:
    """On main a WAIT error (ERR value is out of range, for a count Redis cannot read) raised
    StoreError and left the claim it followed in progress: every retry got 409 until its lease
    lapsed. The claim is released as when too few replicas confirm."""
    client = FakeClient([1, 1, 0], ResponseError("ERR value is out of range"))  # type: ignore[arg-type]
    store = RedisStore(client, Policy(durability=Replicas(1, 0.05)))
    record = record_for("p", "", "POST", "/r", "k")
    with pytest.raises(StoreError, match=r"claim \(WAIT\): ERR value is out of range"):
        store.claim(record, "fp", owner="me", heartbeat=False)
    [release] = client.plain
    assert release[2:] == (1, record.key, "me")
