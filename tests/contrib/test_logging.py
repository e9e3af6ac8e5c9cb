"""The ``idemkey`` logger: silent at INFO on the hot path; one WARNING, with structured
``extra`` fields, per store error and per lost lease."""

from __future__ import annotations

import logging

import pytest
import redis

from idemkey import (
    KeyReuseError,
    LeaseLostError,
    Policy,
    RedisStore,
    RequestInFlightError,
    guard,
)
from idemkey._core import record_for
from idemkey.cli.demo_app import DEFAULT_ACCOUNT, account_scope, create_app
from idemkey.guard import GUARD_METHOD
from tests._lease import lapse
from tests._servers import free_port, no_retry, wait_until


def _ours(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "idemkey" or r.name.startswith("idemkey.")]


def test_hot_path_is_silent_at_info(
    real_client: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="idemkey")
    store = RedisStore(real_client, Policy(prefix=prefix))
    try:
        with guard(store, "job", payload=1) as call:
            with pytest.raises(RequestInFlightError), guard(store, "job", payload=1):
                pass
            call.save("ok")
        with guard(store, "job", payload=1) as call:
            assert call.replayed
        with pytest.raises(KeyReuseError), guard(store, "job", payload=2):
            pass
        with guard(store, "released"):
            pass
        app = create_app(RedisStore(real_client, Policy(prefix=prefix, scope=account_scope)))
        client = app.test_client()
        body = {"amount": 5, "currency": "eur"}
        for status in (201, 201):
            assert (
                client.post("/charges", json=body, headers={"Idempotency-Key": "k"}).status_code
                == status
            )
        assert (
            client.post(
                "/charges", json={**body, "amount": 6}, headers={"Idempotency-Key": "k"}
            ).status_code
            == 422
        )
        assert client.post("/charges", json=body).status_code == 400
    finally:
        store.close()
    assert _ours(caplog) == []


def test_one_warning_per_store_error(prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    dead = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=no_retry())
    app = create_app(RedisStore(dead, Policy(prefix=prefix, scope=account_scope)))
    caplog.set_level(logging.INFO, logger="idemkey")
    answer = app.test_client().post(
        "/charges", json={"amount": 5, "currency": "eur"}, headers={"Idempotency-Key": "secret-k"}
    )
    assert answer.status_code == 503
    (warning,) = _ours(caplog)
    assert warning.levelno == logging.WARNING
    assert warning.idemkey_event == "store_error"  # type: ignore[attr-defined]
    digest = record_for(prefix, DEFAULT_ACCOUNT, "POST", "/charges", "secret-k").digest
    assert warning.idemkey_record == digest  # type: ignore[attr-defined]
    assert "secret-k" not in warning.getMessage()  # raw keys stay out of logs
    dead.close()


def test_one_warning_per_lost_lease(
    real_client: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="idemkey")
    policy = Policy(prefix=prefix, lease=0.3)
    store, rival = RedisStore(real_client, policy), RedisStore(real_client, policy)
    record = record_for(prefix, "", GUARD_METHOD, "", "job")
    try:
        with pytest.raises(LeaseLostError), guard(store, "job") as call:  # noqa: PT012 - the scenario
            # Our lease is taken from us: it lapses and another executor claims.
            assert lapse(real_client, record) == 1
            taken = rival.claim(record, _fingerprint(real_client, record), heartbeat=False)
            assert type(taken).__name__ == "Claimed"
            # The heartbeat (every lease/3) notices before we finish.
            wait_until(lambda: _ours(caplog), 5, "the heartbeat to notice the lost lease")
            call.save("too late")
    finally:
        store.close()
        rival.close()
    warnings = [r for r in _ours(caplog) if r.levelno == logging.WARNING]
    assert [w.idemkey_event for w in warnings] == ["lease_lost"]  # type: ignore[attr-defined]
    assert warnings[0].idemkey_record == record.digest  # type: ignore[attr-defined]


def _fingerprint(client: redis.Redis, record: object) -> bytes:
    fp = client.hget(record.key, "fp")  # type: ignore[attr-defined]
    assert isinstance(fp, bytes)
    return fp


def test_debug_turned_on_later_is_heard(caplog: pytest.LogCaptureFixture) -> None:
    """Events skip themselves through logging's memo of enabled levels: a level set after
    many silent calls must still be heard on the next one (logging clears the memo)."""
    from benchmarks.fakes import FakeClient, first_call_replies

    store = RedisStore(FakeClient(first_call_replies()), Policy(prefix="memo"))  # type: ignore[arg-type]
    try:
        caplog.set_level(logging.INFO, logger="idemkey")
        for i in range(3):
            with guard(store, f"quiet-{i}") as call:
                call.save(i)
        assert _ours(caplog) == []
        caplog.set_level(logging.DEBUG, logger="idemkey")
        with guard(store, "heard") as call:
            call.save(1)
        kinds = [r.idemkey_event for r in _ours(caplog)]  # type: ignore[attr-defined]
        assert kinds == ["claimed", "completed"]
        caplog.set_level(logging.INFO, logger="idemkey")
        caplog.clear()
        with guard(store, "quiet-again") as call:
            call.save(1)
        assert _ours(caplog) == []
    finally:
        store.close()
