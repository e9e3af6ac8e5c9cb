"""The code of docs/steps.md, run as printed (:mod:`tests._pages`) against a real Redis.

The services the page imports from ``shop`` (inventory, PSP, shipping) are fakes that count
their side effects and can crash on demand (docs/queues.md's samples, in
tests/contrib/test_queues_page.py, import the same ones). A crash between two steps, then a
retry, must leave every side effect done exactly once; a crash inside the charge, after the
PSP charged, is deduplicated by the PSP through ``call.step_key``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import redis

from idemkey import Policy, RedisStore
from tests._pages import fake_modules, run_page

ORDER = {"id": "o-1", "items": ["book"], "amount": 1200}


class Crash(Exception):
    """The process dies here (in-process: the guard releases, the retry resumes)."""


class Services:
    """Fake inventory, PSP and shipping: side effects counted, crashes on demand."""

    def __init__(self) -> None:
        self.effects: Counter[str] = Counter()
        self.crash_before: set[str] = set()
        self.crash_after_charge = False
        self.charges: dict[str, dict[str, Any]] = {}  # the PSP's own idempotency records

    def _enter(self, name: str) -> None:
        if name in self.crash_before:
            self.crash_before.discard(name)
            raise Crash(name)

    def reserve(self, order_id: str, items: list[str]) -> dict[str, str]:
        self._enter("reserve")
        self.effects["reserve"] += 1
        return {"hold_id": f"hold-{order_id}"}

    def charge(self, amount: int, idempotency_key: str, fence: int | None = None) -> Any:
        self._enter("charge")
        if idempotency_key not in self.charges:  # a PSP answers a known key with the same charge
            self.effects["charge"] += 1
            self.charges[idempotency_key] = {"charge_id": f"ch_{len(self.charges) + 1}"}
        if self.crash_after_charge:
            self.crash_after_charge = False
            raise Crash("after the PSP charged, before the checkpoint")
        return self.charges[idempotency_key]

    def enqueue(self, order_id: str, hold_id: str) -> None:
        self._enter("ship")
        self.effects["ship"] += 1

    async def areserve(self, order_id: str, items: list[str]) -> dict[str, str]:
        return self.reserve(order_id, items)

    async def acharge(self, amount: int, idempotency_key: str) -> Any:
        return self.charge(amount, idempotency_key)


class ArqRetry(Exception):
    """Stands in for ``arq.Retry`` (arq is not a dependency)."""

    def __init__(self, defer: float) -> None:
        super().__init__(defer)
        self.defer = defer


def shop(services: Services) -> dict[str, dict[str, Any]]:
    """The ``shop`` module the pages import their services from, faked."""

    class Inventory:
        reserve = staticmethod(services.reserve)

    class PSP:
        charge = staticmethod(services.charge)

    class Shipping:
        enqueue = staticmethod(services.enqueue)

    class AInventory:
        reserve = staticmethod(services.areserve)

    class APSP:
        charge = staticmethod(services.acharge)

    return {
        "shop": {
            "inventory": Inventory,
            "psp": PSP,
            "shipping": Shipping,
            "ainventory": AInventory,
            "apsp": APSP,
        }
    }


@pytest.fixture
def store(real_client: redis.Redis, prefix: str) -> Any:
    store = RedisStore(real_client, Policy(prefix=prefix, lease=10))
    yield store
    store.close()


def place_order_of(services: Services) -> Any:
    with fake_modules(shop(services)):
        (block,) = run_page("docs/steps.md")
    return block["place_order"]


@pytest.mark.parametrize("crash_before", ["reserve", "charge", "ship"])
def test_the_order_flow_survives_a_crash_before_any_step(
    store: RedisStore, crash_before: str
) -> None:
    services = Services()
    place_order = place_order_of(services)
    services.crash_before.add(crash_before)
    with pytest.raises(Crash):
        place_order(store, ORDER)
    result = place_order(store, ORDER)
    assert result == {"order": "o-1", "charge": "ch_1"}
    assert services.effects == {"reserve": 1, "charge": 1, "ship": 1}
    assert place_order(store, ORDER) == result  # a duplicate: the stored result
    assert services.effects == {"reserve": 1, "charge": 1, "ship": 1}


def test_a_crash_inside_the_charge_is_deduplicated_by_the_step_key(store: RedisStore) -> None:
    services = Services()
    place_order = place_order_of(services)
    services.crash_after_charge = True  # charged, but the checkpoint never written
    with pytest.raises(Crash):
        place_order(store, ORDER)
    assert place_order(store, ORDER) == {"order": "o-1", "charge": "ch_1"}
    assert services.effects == {"reserve": 1, "charge": 1, "ship": 1}
