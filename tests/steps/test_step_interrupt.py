"""Ctrl-C inside a step function under a sync guard: the job is held, then resumed.

What a user relies on (docs/guard.md, docs/steps.md): a step function cut off by
``KeyboardInterrupt`` (or ``SystemExit`` from a signal handler) did work nobody can tell the
extent of. It is never retried in place (``retry=`` retries exceptions, not interruptions),
the key is not released for an immediate retry to run the step again: the claim is kept, no
longer renewed, until its lease lapses; a ``cancelled`` uncertain entry names the record and
the steps that did finish; the retry after the lease takes the record over, gets the finished
steps back without running them, and runs the interrupted step again. Real Redis.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from idemkey import Policy, RedisStore, RequestInFlightError, StepRetry, guard
from idemkey._core import record_for
from idemkey.guard import GUARD_METHOD
from tests._lease import lease_left
from tests._servers import wait_until

pytestmark = pytest.mark.redis

INTERRUPTIONS = [KeyboardInterrupt, SystemExit]


@pytest.mark.parametrize("retry", [None, StepRetry(attempts=3)], ids=["plain", "retried"])
@pytest.mark.parametrize("interruption", INTERRUPTIONS, ids=lambda kind: kind.__name__)
def test_an_interrupted_step_keeps_the_key_until_the_lease_lapses_then_resumes(
    real_client: redis.Redis,
    prefix: str,
    interruption: type[BaseException],
    retry: StepRetry | None,
) -> None:
    # A 5 s lease: a loaded box that stalls between the interruption and the immediate retry
    # still finds the claim held.
    store = RedisStore(real_client, Policy(prefix=prefix, lease=5, wait=0))
    record = record_for(prefix, "", GUARD_METHOD, "", "job")
    ran: list[str] = []

    def charge(amount: int) -> dict[str, int]:
        ran.append("charge")
        if ran.count("charge") == 1:
            raise interruption  # Ctrl-C while the charge is on the wire
        return {"charged": amount}

    def job() -> Any:
        with guard(store, "job", payload=b"p") as call:
            reserved = call.step("reserve", lambda: ran.append("reserve") or "held")
            charged = call.step("charge", charge, 1000, retry=retry)
            call.save({"reserved": reserved, **charged})
            return call, call.result

    try:
        with pytest.raises(interruption):
            job()
        assert ran == ["reserve", "charge"]  # not retried in place
        # Held, not released: a retry now would run the half-done charge again.
        with pytest.raises(RequestInFlightError), guard(store, "job", payload=b"p"):
            pytest.fail("the interrupted job's key was released")
        (entry,) = wait_until(store.uncertain, 10, "the cancelled entry")
        assert (entry.kind, entry.steps) == ("cancelled", ("reserve",))
        assert entry.fence is not None
        assert real_client.hget(record.record_key, "s:charge") is None  # not finished
        # No longer renewed: the lease lapses by itself.
        wait_until(lambda: lease_left(real_client, record) <= 0, 20, "the lease to lapse")
        call, result = job()
        assert call.takeover
        assert call.fence > entry.fence
        assert call.resumed_steps == ("reserve",)
        assert result == {"reserved": "held", "charged": 1000}
        assert ran == ["reserve", "charge", "charge"]  # the reservation is not made again
        with guard(store, "job", payload=b"p") as again:
            assert again.replayed
            assert again.result == result
    finally:
        store.close()
