"""``idemkey forget`` removes a record with its finished steps: the key then runs afresh."""

from __future__ import annotations

import pytest
import redis

from idemkey import Policy, RedisStore, guard
from idemkey._core import record_for
from idemkey.cli import main
from idemkey.guard import GUARD_METHOD


class Boom(Exception):
    pass


def test_forget_removes_the_finished_steps_and_frees_the_key(
    real_client: redis.Redis, redis_url: str, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix, lease=10))
    record = record_for(prefix, "", GUARD_METHOD, "", "order-1")
    runs: list[str] = []
    try:
        with pytest.raises(Boom), guard(store, "order-1", payload="A") as call:  # noqa: PT012
            call.step("charge", runs.append, "A")
            raise Boom
        assert real_client.hget(record.key, "s:charge") is not None

        argv = ["forget", "--digest", record.digest, "--yes"]
        assert main([*argv, "--redis-url", redis_url, "--prefix", prefix]) == 0, capsys.readouterr()
        assert real_client.exists(record.key) == 0  # one key: the lease went with the record

        with guard(store, "order-1", payload="B") as call:  # no longer bound to payload A
            assert call.resumed_steps == ()
            call.step("charge", runs.append, "B")
            call.save(None)
    finally:
        store.close()
    assert runs == ["A", "B"]
