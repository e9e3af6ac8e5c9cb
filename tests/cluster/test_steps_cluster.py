"""Recovery points on the real Redis Cluster: checkpoint.lua touches only its record's slot,
and a released call resumes from its finished steps on whichever master holds the record."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from idemkey import AsyncRedisStore, LeaseLostError, Policy, RedisStore, aguard, guard
from idemkey._core import record_for
from idemkey.guard import GUARD_METHOD
from idemkey.store import Cancelled

if TYPE_CHECKING:
    import redis.asyncio.cluster
    import redis.cluster

pytestmark = [pytest.mark.cluster, pytest.mark.redis]


class Boom(Exception):
    pass


def test_steps_resume_on_the_cluster(cluster_client: redis.cluster.RedisCluster) -> None:
    prefix = "st" + uuid.uuid4().hex[:8]
    store = RedisStore(cluster_client, Policy(prefix=prefix, lease=10))
    runs: list[str] = []
    masters: set[str] = set()

    def work(name: str) -> str:
        runs.append(name)
        return name.upper()

    try:
        # Many keys, so the records land on every master.
        for index in range(12):
            key = f"order-{index}"
            with pytest.raises(Boom), guard(store, key, payload=key) as call:  # noqa: PT012
                call.step("reserve", work, f"reserve-{index}")
                raise Boom
            with guard(store, key, payload=key) as call:
                assert call.resumed_steps == ("reserve",)
                assert call.step("reserve", work, "again") == f"RESERVE-{index}"
                assert call.step("charge", work, f"charge-{index}") == f"CHARGE-{index}"
                call.save(index)
            record = record_for(prefix, "", GUARD_METHOD, "", key)
            assert cluster_client.hget(record.key, "s:reserve") is None  # dropped on completion
            masters.add(cluster_client.get_node_from_key(record.key).name)
    finally:
        store.close()
    assert runs == [name for i in range(12) for name in (f"reserve-{i}", f"charge-{i}")]
    assert len(masters) == 3


async def test_async_steps_resume_on_the_cluster(
    async_cluster_client: redis.asyncio.cluster.RedisCluster,
) -> None:
    prefix = "st" + uuid.uuid4().hex[:8]
    store = AsyncRedisStore(async_cluster_client, Policy(prefix=prefix, lease=10))
    runs: list[str] = []

    async def work(name: str) -> str:
        runs.append(name)
        return name

    try:
        for index in range(6):
            key = f"order-{index}"
            with pytest.raises(Boom):  # noqa: PT012
                async with aguard(store, key) as call:
                    await call.step("reserve", work, f"reserve-{index}")
                    raise Boom
            async with aguard(store, key) as call:
                assert await call.step("reserve", work, "again") == f"reserve-{index}"
                await call.step("charge", work, f"charge-{index}")
                call.save(index)
    finally:
        await store.aclose()
    assert runs == [name for i in range(6) for name in (f"reserve-{i}", f"charge-{i}")]


def test_retried_steps_remembered_failures_and_cancel_on_the_cluster(
    cluster_client: redis.cluster.RedisCluster,
) -> None:
    from idemkey import StepRetry

    prefix = "sr" + uuid.uuid4().hex[:8]
    store = RedisStore(cluster_client, Policy(prefix=prefix, lease=10))
    masters: set[str] = set()
    try:
        for index in range(12):
            key = f"order-{index}"
            record = record_for(prefix, "", GUARD_METHOD, "", key)
            tries: list[int] = []

            def flaky(tries: list[int] = tries) -> int:
                tries.append(1)
                if len(tries) < 3:
                    raise ConnectionError("try again")
                return len(tries)

            with pytest.raises(LeaseLostError), guard(store, key) as call:  # noqa: PT012
                assert call.step("charge", flaky, retry=StepRetry(backoff=0)) == 3
                assert cluster_client.hget(record.key, "a:charge") == b"3"
                # The operator: this owner can store nothing, and its fence is passed.
                assert store.cancel(record) == Cancelled("in_progress", (call.fence or 0) + 1)
                call.step("ship", int)  # refused
            remembers = guard(store, key, cache_exceptions=(LookupError,))
            with pytest.raises(LookupError, match="gone"), remembers as call:  # noqa: PT012
                assert call.resumed_steps == ("charge",)
                raise LookupError("gone")
            # The retry declares it too: a stored failure is raised only as a declared class.
            again = guard(store, key, cache_exceptions=(LookupError,))
            with pytest.raises(LookupError, match="gone"), again:
                pytest.fail("a remembered failure ran again")
            masters.add(cluster_client.get_node_from_key(record.key).name)
    finally:
        store.close()
    assert len(masters) == 3
