"""The code of docs/steps.md, run as printed (:mod:`tests._pages`) against a real Redis.

Each block runs twice, as a reader runs it twice, and the second run is a replay that does
nothing. Then its stand-in services (``inventory``, ``psp``, ``shipping``: the names its
functions look up when called) are swapped for fakes that count their side effects and can
crash on demand (docs/queues.md's samples, in tests/contrib/test_queues_page.py, import the
same fakes from ``shop``). A crash between two steps, then a retry, must leave every side
effect done exactly once; a crash inside the charge, after the PSP charged, is deduplicated by
the PSP through ``call.step_key``. The page's ``idemkey cancel`` session runs as printed after
the sample that leaves order 1004 in progress, and again after a second run of the page.
"""

from __future__ import annotations

import re
import shlex
import sys
import types
from collections import Counter
from typing import Any

import pytest
import redis

from idemkey import Policy, RedisStore
from idemkey.cli import main
from tests._pages import ROOT, point_at, run_page, run_twice
from tests._servers import RedisServer

ORDER = {"id": "o-1", "items": ["book"], "amount": 1200}


class Crash(Exception):
    """The process dies here (in-process: the guard releases, the retry resumes)."""


class CardDeclined(Exception):
    """The fake PSP's deterministic failure (module level: a remembered failure is raised
    again by importing its class)."""

    def __init__(self, code: str) -> None:
        super().__init__(f"card declined: {code}")
        self.code = code


class PSPUnavailable(Exception):
    """The fake PSP's transient failure."""


class Services:
    """Fake inventory, PSP and shipping: side effects counted, crashes on demand."""

    def __init__(
        self,
        declined: type[Exception] = CardDeclined,
        unavailable: type[Exception] = PSPUnavailable,
    ) -> None:
        self.declined, self.unavailable_error = declined, unavailable
        self.effects: Counter[str] = Counter()
        self.crash_before: set[str] = set()
        self.crash_after_charge = False
        self.charges: dict[str, dict[str, Any]] = {}  # the PSP's own idempotency records
        self.unavailable = 0  # the next charges that fail with PSPUnavailable
        self.decline: str | None = None  # the decline code of every charge, if any
        self.calls = 0

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
        self.calls += 1
        if self.unavailable:
            self.unavailable -= 1
            raise self.unavailable_error("the PSP answered 503")
        if self.decline is not None:
            raise self.declined(self.decline)
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
            "CardDeclined": CardDeclined,
            "PSPUnavailable": PSPUnavailable,
            "inventory": Inventory,
            "psp": PSP,
            "shipping": Shipping,
            "ainventory": AInventory,
            "apsp": APSP,
        }
    }


@pytest.fixture
def url(private_redis_server: RedisServer) -> str:
    return private_redis_server.url


@pytest.fixture
def store(url: str, prefix: str) -> Any:
    store = RedisStore(redis.Redis.from_url(url), Policy(prefix=prefix, lease=10))
    yield store
    store.close()


def page_of(services: Services, url: str) -> list[dict[str, Any]]:
    """The page's blocks, run as printed, their stand-in services then replaced by ``services``
    (and ``services`` raising the page's own exception classes)."""
    namespaces = run_page("docs/steps.md", url)
    services.declined = namespaces[1]["CardDeclined"]
    services.unavailable_error = namespaces[1]["PSPUnavailable"]
    for namespace in namespaces:
        namespace.update(inventory=services, psp=services, shipping=services)
    return namespaces


def place_order_of(services: Services, url: str) -> Any:
    return page_of(services, url)[0]["place_order"]


@pytest.mark.redis
def test_the_page_run_twice_does_each_thing_once(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_twice("docs/steps.md", url)
    out = capsys.readouterr().out.splitlines()
    result, charged = out[3], out[6]
    assert re.fullmatch(r"\{'order': '1003', 'charge': 'ch_\w{6}'\}", result), result
    assert re.fullmatch(r"\{'order': '2001', 'charge': 'ch_\w{6}'\}", charged), charged
    assert out == [
        "reserved ['book']",
        "charged 1200",
        "shipping 1003",
        result,
        result,
        "charged 900",
        charged,
        "PSP calls by this run: 2",
        "reserved ['lamp']",
        "charged 4500",
        "stopped while shipping 1004",
        # Run again against the same Redis: both are replays, no service is called; order 1004
        # is still held by the stopped run (its lease has not lapsed, nothing cancelled it).
        result,
        result,
        charged,
        "PSP calls by this run: 0",
        "order 1004 is in progress: cancel it, or wait for its lease to lapse",
    ]


def cancel_session() -> list[tuple[str, str]]:
    """The page's ``idemkey cancel`` session: each command with the line the page shows."""
    text = (ROOT / "docs" / "steps.md").read_text("utf-8")
    (session,) = re.findall(r"```\n(\$ idemkey cancel .*?)```", text, re.S)
    lines = session.splitlines()
    assert all(line.startswith("$ ") for line in lines[0::2]), lines
    return list(zip(lines[0::2], lines[1::2], strict=True))


def elided(line: str) -> str:
    """A cancel line as the page prints it: the record's digest as ``...``, the fence as N."""
    line = re.sub(r"\{[0-9a-f]{32}\}", "{...}", line)
    return re.sub(r"fence now \d+", "fence now N", line)


@pytest.mark.redis
def test_the_pages_cancel_session_runs_as_printed_after_its_samples_twice(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("IDEMKEY_REDIS_URL", raising=False)  # the page's commands name the server
    session = cancel_session()
    for _ in range(2):  # the page, then the page again after its own session
        run_page("docs/steps.md", url)
        assert capsys.readouterr().out.splitlines()[-3:] == [
            "reserved ['lamp']",
            "charged 4500",
            "stopped while shipping 1004",
        ]
        fences = []
        for command, shown in session:
            argv = shlex.split(point_at(command.removeprefix("$ "), url))
            assert argv[0] == "idemkey", command
            assert main(argv[1:]) == 0, capsys.readouterr()
            out = capsys.readouterr().out.strip()
            assert elided(out) == elided(shown), out
            fences.append(int(re.findall(r"fence now (\d+)", out)[0]))
        shown_fences = [int(re.findall(r"fence now (\d+)", s)[0]) for _, s in session]
        assert fences[1] == fences[0] + 1  # the second command raised the first one's fence
        assert shown_fences[1] == shown_fences[0] + 1  # and the page shows it so


@pytest.mark.parametrize("crash_before", ["reserve", "charge", "ship"])
def test_the_order_flow_survives_a_crash_before_any_step(
    store: RedisStore, url: str, crash_before: str
) -> None:
    services = Services()
    place_order = place_order_of(services, url)
    services.crash_before.add(crash_before)
    with pytest.raises(Crash):
        place_order(store, ORDER)
    result = place_order(store, ORDER)
    assert result == {"order": "o-1", "charge": "ch_1"}
    assert services.effects == {"reserve": 1, "charge": 1, "ship": 1}
    assert place_order(store, ORDER) == result  # a duplicate: the stored result
    assert services.effects == {"reserve": 1, "charge": 1, "ship": 1}


def test_a_crash_inside_the_charge_is_deduplicated_by_the_step_key(
    store: RedisStore, url: str
) -> None:
    services = Services()
    place_order = place_order_of(services, url)
    services.crash_after_charge = True  # charged, but the checkpoint never written
    with pytest.raises(Crash):
        place_order(store, ORDER)
    assert place_order(store, ORDER) == {"order": "o-1", "charge": "ch_1"}
    assert services.effects == {"reserve": 1, "charge": 1, "ship": 1}


def test_the_retried_charge_runs_until_the_psp_answers(
    store: RedisStore, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from idemkey.guard import _sync_steps

    monkeypatch.setattr(_sync_steps, "sleep", lambda seconds: None)  # the 0.5 s, 1 s waits
    services = Services()
    charge_order = page_of(services, url)[1]["charge_order"]
    services.unavailable = 2
    assert charge_order(store, ORDER) == {"order": "o-1", "charge": "ch_1"}
    assert services.calls == 3  # two failed attempts, one that charged
    assert services.effects == {"charge": 1}
    assert charge_order(store, ORDER) == {"order": "o-1", "charge": "ch_1"}  # replayed
    assert services.calls == 3


def test_a_declined_card_is_raised_again_without_calling_the_psp(
    store: RedisStore, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = Services()
    block = page_of(services, url)[1]
    charge_order, declined_class = block["charge_order"], block["CardDeclined"]
    # The page's CardDeclined, importable as a saved script's classes are while it runs.
    module = types.ModuleType(declined_class.__module__)
    module.__dict__.update(block)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    services.decline = "insufficient_funds"
    for _ in range(3):
        with pytest.raises(declined_class) as declined:
            charge_order(store, ORDER)
        assert str(declined.value) == "card declined: insufficient_funds"
        assert declined.value.code == "insufficient_funds"
    assert services.calls == 1  # not retried in place, not run again by later calls


def test_an_unavailable_psp_past_the_attempts_releases_the_key(
    store: RedisStore, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from idemkey.guard import _sync_steps

    monkeypatch.setattr(_sync_steps, "sleep", lambda seconds: None)
    services = Services()
    charge_order = page_of(services, url)[1]["charge_order"]
    services.unavailable = 4
    with pytest.raises(services.unavailable_error):
        charge_order(store, ORDER)
    assert services.calls == 4  # all four attempts
    assert charge_order(store, ORDER) == {"order": "o-1", "charge": "ch_1"}  # runs afresh
    assert services.calls == 5
