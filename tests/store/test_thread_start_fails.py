"""A thread that fails to start (RuntimeError "can't start new thread": a container's pids limit)
must not leave the store without its heartbeat, reporter or uncertain-outcome writer for good:
the next claim, report or entry starts one. The failure is injected once, by thread name."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from idemkey import Policy, RedisStore, guard
from idemkey.store._concurrency._sync_keeper import Keeper

_start = threading.Thread.start


@pytest.fixture
def fail_once(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], list[str]]:
    """Make the first start of a thread named ``name`` raise; returns the list of failures."""

    def arm(name: str) -> list[str]:
        failed: list[str] = []

        def start(self: threading.Thread) -> None:
            if self.name == name and not failed:
                failed.append(name)
                raise RuntimeError("can't start new thread")
            _start(self)

        monkeypatch.setattr(threading.Thread, "start", start)
        return failed

    return arm


def _wait(condition: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        time.sleep(0.01)


@pytest.fixture
def store(real_client: redis.Redis, prefix: str) -> Iterator[RedisStore]:
    store = RedisStore(real_client, Policy(prefix=prefix, lease=0.5))
    yield store
    store.close()


def test_next_claim_gets_a_heartbeat_after_a_failed_start(
    store: RedisStore, fail_once: Callable[[str], list[str]]
) -> None:
    failed = fail_once("idemkey-heartbeat")
    with (
        pytest.raises(RuntimeError, match="can't start new thread"),
        guard(store, "first", payload=1) as call,
    ):
        call.save(1)
    assert failed
    assert store._heartbeat is None
    with guard(store, "second", payload=1) as call:
        heartbeat = store._heartbeat
        assert heartbeat is not None
        assert heartbeat.is_alive()
        call.save(2)


def test_failed_reporter_start_keeps_the_heartbeat(
    store: RedisStore, fail_once: Callable[[str], list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    failed = fail_once("idemkey-reporter")
    reported: list[str] = []
    monkeypatch.setattr(store, "_renewal_news", lambda *args: lambda: reported.append("news"))
    with guard(store, "job", payload=1) as call:
        # Every renewal has news: the first report fails to start the reporter.
        _wait(lambda: failed)
        _wait(lambda: reported)  # a later report started one
        heartbeat = store._heartbeat
        assert heartbeat is not None
        assert heartbeat.is_alive()
        call.save(1)


def test_heartbeat_that_dies_clears_its_attribute(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    died = threading.Event()

    def renew(*args: Any) -> int:
        died.set()
        raise KeyError("a bug in a renewal")

    monkeypatch.setattr(store, "_renew", renew)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)
    with guard(store, "job", payload=1) as call:
        assert died.wait(10)
        _wait(lambda: store._heartbeat is None)
        call.save(1)


def test_keeper_writes_entries_after_a_failed_start(
    real_client: redis.Redis, prefix: str, fail_once: Callable[[str], list[str]]
) -> None:
    failed = fail_once("idemkey-uncertain")
    keeper = Keeper(real_client)
    stream = f"{prefix}:uncertain"
    keeper.keep(stream, {"n": "0"}, 60_000)  # never raises
    assert failed
    assert keeper._thread is None
    for n in range(1, 5):
        keeper.keep(stream, {"n": str(n)}, 60_000)
    _wait(lambda: real_client.xlen(stream) == 5)
