"""``retry_after`` means one thing everywhere: how long a duplicate that found its call in
flight should wait before trying again (``idemkey._core.in_flight_retry_after``: the lease
left, at most 1 s). An HTTP duplicate gets it as ``Retry-After`` (whole seconds), a guard's
duplicate as ``RequestInFlightError.retry_after``; ``lease_remaining`` is only the bound.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import pytest
import redis
from werkzeug.test import Client

from idemkey import Policy, RedisStore, RequestInFlightError, guard
from idemkey._core import InFlight, retry_after_seconds
from idemkey.adapters.wsgi import IdempotencyMiddleware
from tests._servers import wait_until

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

pytestmark = pytest.mark.redis


def _in_progress(client: redis.Redis, prefix: str) -> int:
    """How many records under ``prefix`` a claim holds (their lease is a field, claim.lua)."""
    names = client.scan_iter(f"{prefix}:*", count=100)
    return sum(client.hget(name, "state") == b"in_progress" for name in names)


@pytest.mark.parametrize("left", [29.9, 1.0, 0.4, 0.0])
def test_in_flight_retry_after_is_the_lease_left_at_most_one_second(left: float) -> None:
    from idemkey._core import IN_FLIGHT_RETRY_AFTER, in_flight_retry_after

    decision = InFlight(left)
    assert decision.lease_remaining == left
    assert decision.retry_after == in_flight_retry_after(left)
    assert decision.retry_after == max(0.05, min(left, IN_FLIGHT_RETRY_AFTER))


def test_the_http_retry_after_and_the_guard_error_agree_on_a_call_in_flight(
    real_client: redis.Redis, prefix: str
) -> None:
    # The defaults: a 30 s lease, no wait.
    store = RedisStore(real_client, Policy(prefix=prefix))
    release = threading.Event()

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        release.wait(20)
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [b"made"]

    http = Client(IdempotencyMiddleware(app, store))

    def post() -> tuple[int, str | None]:
        reply = http.post("/orders", data=b"{}", headers={"Idempotency-Key": "k-1"})
        return reply.status_code, reply.headers.get("Retry-After")

    try:
        with ThreadPoolExecutor(1) as pool, guard(store, "job", payload=1):
            first = pool.submit(post)
            wait_until(
                lambda: _in_progress(real_client, prefix) == 2,
                timeout=10,
                message="the request and the guard in flight",
            )
            status, header = post()  # the HTTP duplicate
            with pytest.raises(RequestInFlightError) as duplicate, guard(store, "job", payload=1):
                pass  # pragma: no cover - the guard's duplicate never runs
            release.set()
            assert first.result(timeout=20) == (201, None)
        error = duplicate.value
        assert status == 409
        assert header == str(retry_after_seconds(error.retry_after)) == "1"
        assert error.retry_after == 1.0  # not the 30 s lease
        assert 20 < error.lease_remaining <= 30
        assert "retry in 1 s" in str(error)
    finally:
        release.set()
        store.close()
