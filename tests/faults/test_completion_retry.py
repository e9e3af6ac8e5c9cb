"""A completion whose write fails for a moment is retried: the work is done, and a completion
that never lands lets a retry run the work again once the lease lapses.

Found by the soak (tests/soak): with the client's pool full ("Too many connections"), a failed
complete left the record in progress, and after the lease another racer ran the job again.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.asyncio

from idemkey import AsyncRedisStore, Policy, RedisStore, StoreError, aguard, guard
from idemkey._core import record_for
from idemkey.guard import GUARD_METHOD

pytestmark = pytest.mark.redis


class FlakyCompletions:
    """Mixin: the first ``failures`` complete writes fail as a full pool would."""

    failures = 2

    def _fail_complete(self, name: str) -> None:
        if name == "complete" and self.failures > 0:
            self.failures -= 1
            raise StoreError("Redis failed during complete: MaxConnectionsError")


class FlakySyncStore(FlakyCompletions, RedisStore):
    def _eval(self, name: str, *args: Any) -> Any:
        self._fail_complete(name)
        return super()._eval(name, *args)


class FlakyAsyncStore(FlakyCompletions, AsyncRedisStore):
    async def _eval(self, name: str, *args: Any) -> Any:
        self._fail_complete(name)
        return await super()._eval(name, *args)


def test_a_completion_that_fails_for_a_moment_still_lands(
    real_client: redis.Redis, prefix: str
) -> None:
    store = FlakySyncStore(real_client, Policy(prefix=prefix))
    try:
        with guard(store, "job") as call:
            call.save("done")
        assert store.failures == 0
        # complete: the record holds the response
        assert real_client.hexists(record_for(prefix, "", GUARD_METHOD, "", "job").key, "resp")
        with guard(store, "job") as again:
            assert again.replayed
            assert again.result == "done"
    finally:
        store.close()


async def test_an_async_completion_that_fails_for_a_moment_still_lands(
    real_async_client: redis.asyncio.Redis, prefix: str
) -> None:
    store = FlakyAsyncStore(real_async_client, Policy(prefix=prefix))
    try:
        async with aguard(store, "job") as call:
            call.save("done")
        assert store.failures == 0
        async with aguard(store, "job") as again:
            assert again.replayed
            assert again.result == "done"
    finally:
        await store.aclose()


def test_a_completion_that_keeps_failing_raises_after_the_retry_budget(
    real_client: redis.Redis, prefix: str
) -> None:
    store = FlakySyncStore(real_client, Policy(prefix=prefix))
    store.failures = 10**6
    store.completion_retry = 0.2
    try:
        with pytest.raises(StoreError), guard(store, "job") as call:
            call.save("done")
    finally:
        store.close()
