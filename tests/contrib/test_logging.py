"""The ``idemkey`` logger: silent at INFO on the hot path; one WARNING, with structured
``extra`` fields, per store error and per lost lease."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import redis
import redis.asyncio

from idemkey import (
    AsyncRedisStore,
    KeyReuseError,
    LeaseLostError,
    Policy,
    RedisStore,
    RequestInFlightError,
    aguard,
    guard,
)
from idemkey._core import record_for
from idemkey.cli.demo_app import DEFAULT_ACCOUNT, account_scope, create_app
from idemkey.guard import GUARD_METHOD
from tests._lease import lapse
from tests._servers import (
    RedisServer,
    async_wait_until,
    free_port,
    no_async_retry,
    no_retry,
    wait_until,
)


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


# ---- Redis down under running claims: one WARNING per lease, not one per failed renewal ----

RENEW_FAILED, RENEWED = "could not renew", "renewed a lease again"


def _renewals(caplog: pytest.LogCaptureFixture, digest: str, words: str) -> list[int]:
    """The levels of the heartbeat's ``words`` lines about the record ``digest``."""
    return [
        r.levelno
        for r in _ours(caplog)
        if words in r.getMessage() and getattr(r, "idemkey_record", None) == digest
    ]


def _check_renewal_lines(caplog: pytest.LogCaptureFixture, digests: list[str]) -> None:
    for digest in digests:
        failed = _renewals(caplog, digest, RENEW_FAILED)
        # The first failure of each lease at WARNING, the ones after it at DEBUG...
        assert failed[0] == logging.WARNING
        assert set(failed[1:]) == {logging.DEBUG}
        # ...and one INFO line once it is renewed again.
        assert _renewals(caplog, digest, RENEWED) == [logging.INFO]
    warnings = [r for r in _ours(caplog) if r.levelno == logging.WARNING]
    assert len(warnings) == len(digests)
    assert {w.idemkey_event for w in warnings} == {"store_error"}  # type: ignore[attr-defined]


def _failing(caplog: pytest.LogCaptureFixture, digests: list[str]) -> Callable[[], bool]:
    """Whether every lease has failed three renewals in a row (retried every lease/10)."""
    return lambda: all(len(_renewals(caplog, d, RENEW_FAILED)) >= 3 for d in digests)


def test_one_warning_per_lease_while_redis_is_down(
    redis_server_factory: Callable[..., RedisServer],
    prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, each failed renewal of each running claim logged a WARNING, with no record
    named: 190 lines for 10 claims and 6 s of outage."""
    server = redis_server_factory()
    client = server.client(socket_timeout=0.2, retry=no_retry())
    caplog.set_level(logging.DEBUG, logger="idemkey")
    store = RedisStore(client, Policy(prefix=prefix, lease=1.0))
    digests = [record_for(prefix, "", GUARD_METHOD, "", key).digest for key in ("a", "b")]
    try:
        with guard(store, "a") as first, guard(store, "b") as second:
            caplog.clear()
            server.pause()
            try:
                wait_until(_failing(caplog, digests), 10, "three failed renewals per lease")
            finally:
                server.resume()
            wait_until(
                lambda: all(_renewals(caplog, d, RENEWED) for d in digests),
                10,
                "the leases to be renewed again",
            )
            first.save(1)
            second.save(2)
    finally:
        store.close()
        client.close()
    _check_renewal_lines(caplog, digests)


async def test_one_warning_per_lease_while_redis_is_down_async(
    redis_server_factory: Callable[..., RedisServer],
    prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = redis_server_factory()
    client = server.async_client(socket_timeout=0.2, retry=no_async_retry())
    caplog.set_level(logging.DEBUG, logger="idemkey")
    store = AsyncRedisStore(client, Policy(prefix=prefix, lease=1.0))
    digests = [record_for(prefix, "", GUARD_METHOD, "", key).digest for key in ("a", "b")]
    try:
        async with aguard(store, "a") as first, aguard(store, "b") as second:
            caplog.clear()
            server.pause()
            try:
                await async_wait_until(_failing(caplog, digests), 10, "three failures per lease")
            finally:
                server.resume()
            await async_wait_until(
                lambda: all(_renewals(caplog, d, RENEWED) for d in digests),
                10,
                "the leases to be renewed again",
            )
            first.save(1)
            second.save(2)
    finally:
        await store.aclose()
        await client.aclose()
    _check_renewal_lines(caplog, digests)


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
