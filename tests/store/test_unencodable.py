"""A value msgspec cannot encode for a reason other than its type: a str with a lone surrogate
(what ``json.loads('"\\ud800"')`` gives for a client's JSON) or a container that holds itself.
``call.save()`` of one completes the record as "result not kept", as for any value that cannot
be stored (it released the key: the work ran again on the retry), and a step's is
``StepNotStorableError``, never a bare ``UnicodeEncodeError`` or ``RecursionError``."""

from __future__ import annotations

import inspect
import json

import pytest

from idemkey import ResultNotStorableError, StepNotStorableError
from idemkey._core import record_state
from tests.store._both import AsyncStore, Both, SyncStore


def hostile_values() -> list[object]:
    loop: list[object] = []
    loop.append(loop)
    return [json.loads('{"customer": "\\ud800"}'), loop]


IDS = ["lone-surrogate", "holds-itself"]


class UnencodableBehaviour:
    @pytest.mark.parametrize("index", [0, 1], ids=IDS)
    async def test_save_completes_the_record_as_not_kept(self, store: Both, index: int) -> None:
        value = hostile_values()[index]
        ran: list[str] = []

        async def charge() -> None:
            async with store.guard("job:1") as call:
                ran.append("charged")
                call.save(value)

        with pytest.raises(ResultNotStorableError):
            await charge()
        record = store.guard_record("job:1")
        assert record_state(await store.hash(record)) == "complete"
        with pytest.raises(ResultNotStorableError, match="job:1"):
            async with store.guard("job:1"):
                ran.append("again")
        assert ran == ["charged"]

    @pytest.mark.parametrize("index", [0, 1], ids=IDS)
    async def test_a_step_result_is_step_not_storable(self, store: Both, index: int) -> None:
        value = hostile_values()[index]

        async def job() -> None:
            async with store.guard("job:2") as call:
                ran = call.step("s", lambda: value)
                if inspect.isawaitable(ran):  # aguard's step
                    await ran

        with pytest.raises(StepNotStorableError):
            await job()


class TestRedisStoreUnencodable(SyncStore, UnencodableBehaviour):
    pass


class TestAsyncRedisStoreUnencodable(AsyncStore, UnencodableBehaviour):
    pass
