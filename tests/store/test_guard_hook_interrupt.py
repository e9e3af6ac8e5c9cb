"""An on_event hook interrupted on ``claimed`` or ``takeover``: the claim is freed, at once when
nothing ran, or left to lapse as an interrupted block's when the work may have run before.

The hook runs once Redis granted the claim, before the block: a Ctrl-C landing while a slow
hook exports the event (a KeyboardInterrupt), an exit, a cancel, raise there. Before, the
claim stayed in Redis and the store's heartbeat went on renewing it: every retry raised
RequestInFlightError for as long as the process lived. Now a plain claim is released, as one
whose reply a Ctrl-C cut off is (the block never ran: a retry runs it at once, no entry), and
a takeover, whose work the previous executor may have done, takes the path of a block cut off
before saving (docs/guard.md, "one rule for both guards"): a ``cancelled`` entry, the key held
until its lease lapses, then a takeover, which still tells the retry ``call.takeover``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import redis.asyncio

from idemkey import (
    AsyncRedisStore,
    Event,
    Policy,
    RedisStore,
    RequestInFlightError,
    aguard,
    current_call,
    guard,
)
from idemkey._core import Record, record_for
from idemkey.guard import GUARD_METHOD
from tests._lease import lease_left
from tests._servers import async_wait_until, wait_until
from tests.store._hook_sigint_worker import KEY

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
#: Short, so a claim nobody renews lapses soon; one the heartbeat renews never does.
LEASE = 0.5
#: How long a test waits for the lease to lapse: ten leases, far past one unrenewed.
LAPSE_WAIT = 10 * LEASE


class RaiseOn:
    """An on_event hook that raises ``error`` on the first event of ``kind``, and keeps the
    fence of the claim it interrupted."""

    def __init__(self, kind: str, error: type[BaseException]) -> None:
        self.kind, self.error = kind, error
        self.fence: int | None = None

    def __call__(self, event: Event) -> None:
        if event.kind == self.kind and self.fence is None:
            self.fence = event.fence
            raise self.error()


def guard_record(prefix: str) -> Record:
    return record_for(prefix, "", GUARD_METHOD, "", KEY)


def entries_of(entries: list[object]) -> list[tuple[str, int | None]]:
    return [(entry.kind, entry.fence) for entry in reversed(entries)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, SystemExit], ids=lambda e: e.__name__)
def test_a_guard_claimed_hook_interrupted_releases_the_key_for_a_retry_at_once(
    real_client: redis.Redis, prefix: str, interruption: type[BaseException]
) -> None:
    hook = RaiseOn("claimed", interruption)
    store = RedisStore(real_client, Policy(prefix=prefix, lease=LEASE, wait=0, on_event=hook))
    ran: list[str] = []
    try:
        with pytest.raises(interruption), guard(store, KEY, payload=b"p"):
            ran.append("the block ran after its hook was interrupted")
        assert hook.fence is not None
        with pytest.raises(LookupError):  # its call is not left current
            current_call()
        # Released, as a claim whose reply a Ctrl-C cut off: the block never ran.
        with guard(store, KEY, payload=b"p") as retry:
            assert not retry.replayed
            assert not retry.takeover
            retry.save("ran once")
        with guard(store, KEY, payload=b"p") as again:
            assert again.replayed
            assert again.result == "ran once"
        store._keeper.drain(10)
        assert entries_of(store.uncertain()) == []  # nothing ran that an operator must check
    finally:
        store.close()
    assert ran == []


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, SystemExit], ids=lambda e: e.__name__)
def test_a_guard_takeover_hook_interrupted_keeps_the_key_until_its_lease_lapses(
    real_client: redis.Redis, prefix: str, interruption: type[BaseException]
) -> None:
    hook = RaiseOn("takeover", interruption)
    store = RedisStore(real_client, Policy(prefix=prefix, lease=LEASE, wait=0, on_event=hook))
    record = guard_record(prefix)
    ran: list[str] = []
    try:
        # A first run cut off in its block: kept, unrenewed, so the next claim takes over.
        with pytest.raises(KeyboardInterrupt), guard(store, KEY, payload=b"p"):
            raise KeyboardInterrupt
        wait_until(lambda: lease_left(real_client, record) <= 0, LAPSE_WAIT, "first lapse")
        with pytest.raises(interruption), guard(store, KEY, payload=b"p"):
            ran.append("the block ran after its hook was interrupted")
        assert hook.fence is not None
        with pytest.raises(LookupError):  # its call is not left current
            current_call()
        # Kept, not released: a release would let the retry run without call.takeover, and
        # the first run's work is unknown.
        with pytest.raises(RequestInFlightError), guard(store, KEY, payload=b"p"):
            ran.append("ran again at once")
        wait_until(
            lambda: lease_left(real_client, record) <= 0,
            LAPSE_WAIT,
            "the lease to lapse (the heartbeat still renews the interrupted claim)",
        )
        with guard(store, KEY, payload=b"p") as retry:
            assert retry.takeover
            assert (retry.fence or 0) > hook.fence
            retry.save("ran once")
        with guard(store, KEY, payload=b"p") as again:
            assert again.replayed
            assert again.result == "ran once"
        want = [("takeover", hook.fence), ("cancelled", hook.fence)]
        wait_until(
            lambda: all(pair in entries_of(store.uncertain()) for pair in want),
            10,
            f"the uncertain entries {want}",
        )
    finally:
        store.close()
    assert ran == []


@pytest.mark.parametrize(
    "interruption", [KeyboardInterrupt, asyncio.CancelledError], ids=lambda e: e.__name__
)
async def test_an_aguard_claimed_hook_interrupted_releases_the_key_for_a_retry_at_once(
    real_async_client: redis.asyncio.Redis, prefix: str, interruption: type[BaseException]
) -> None:
    hook = RaiseOn("claimed", interruption)
    policy = Policy(prefix=prefix, lease=LEASE, wait=0, on_event=hook)
    store = AsyncRedisStore(real_async_client, policy)
    ran: list[str] = []
    try:
        with pytest.raises(interruption):
            async with aguard(store, KEY, payload=b"p"):
                ran.append("the block ran after its hook was interrupted")
        assert hook.fence is not None
        with pytest.raises(LookupError):
            current_call()
        async with aguard(store, KEY, payload=b"p") as retry:
            assert not retry.replayed
            assert not retry.takeover
            retry.save("ran once")
        await store._keeper.drain(10)
        assert entries_of(await store.uncertain()) == []
    finally:
        await store.aclose()
    assert ran == []


@pytest.mark.parametrize(
    "interruption", [KeyboardInterrupt, asyncio.CancelledError], ids=lambda e: e.__name__
)
async def test_an_aguard_takeover_hook_interrupted_keeps_the_key_until_its_lease_lapses(
    real_async_client: redis.asyncio.Redis, prefix: str, interruption: type[BaseException]
) -> None:
    hook = RaiseOn("takeover", interruption)
    policy = Policy(prefix=prefix, lease=LEASE, wait=0, on_event=hook)
    store = AsyncRedisStore(real_async_client, policy)
    record = guard_record(prefix)
    ran: list[str] = []

    async def lapsed() -> bool:
        return await lease_left(real_async_client, record) <= 0

    try:
        with pytest.raises(KeyboardInterrupt):
            async with aguard(store, KEY, payload=b"p"):
                raise KeyboardInterrupt
        await async_wait_until(lapsed, LAPSE_WAIT, "the first lease to lapse")
        with pytest.raises(interruption):
            async with aguard(store, KEY, payload=b"p"):
                ran.append("the block ran after its hook was interrupted")
        assert hook.fence is not None
        with pytest.raises(LookupError):
            current_call()
        with pytest.raises(RequestInFlightError):
            async with aguard(store, KEY, payload=b"p"):
                ran.append("ran again at once")
        await async_wait_until(
            lapsed, LAPSE_WAIT, "the lease to lapse (the heartbeat still renews the claim)"
        )
        async with aguard(store, KEY, payload=b"p") as retry:
            assert retry.takeover
            retry.save("ran once")
        want = [("takeover", hook.fence), ("cancelled", hook.fence)]

        async def entries() -> bool:
            kept = entries_of(await store.uncertain())
            return all(pair in kept for pair in want)

        await async_wait_until(entries, 10, f"the uncertain entries {want}")
    finally:
        await store.aclose()
    assert ran == []


# ---- a real Ctrl-C, in a child process -------------------------------------------------------
# The worker (tests/store/_hook_sigint_worker.py) raises SIGINT itself while its claimed hook
# runs, as a Ctrl-C landing during a slow export would, and goes on, as a REPL or a worker's
# warm shutdown does: it retries at once, and again once the lease lapsed.


def run_worker(redis_url: str, prefix: str, scenario: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.store._hook_sigint_worker", redis_url, prefix, scenario],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_ctrl_c_in_a_slow_guard_hook_releases_the_key(redis_url: str, prefix: str) -> None:
    # Before: the heartbeat thread renewed the claim until the process exited; every retry
    # in between raised RequestInFlightError. The block never ran: a retry runs it at once.
    assert run_worker(redis_url, prefix, "guard") == {
        "first": "KeyboardInterrupt",
        "at_once": "ran",
        "entries": [],
    }


needs_runner = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="asyncio.run cancels its main task on Ctrl-C from 3.11"
)


@needs_runner
def test_one_ctrl_c_in_a_slow_aguard_hook_under_asyncio_run_keeps_the_key_as_a_cancel(
    redis_url: str, prefix: str
) -> None:
    # The Ctrl-C makes asyncio.run cancel its main task: the cancel lands in the block, which
    # then ends as a cancelled one (its work unknown): kept until its lease lapses.
    assert run_worker(redis_url, prefix, "aguard-1") == {
        "first": "KeyboardInterrupt",
        "at_once": "RequestInFlightError",
        "lapsed": True,
        "retry": "ran (takeover)",
        "entries": ["cancelled"],
    }


@needs_runner
def test_two_ctrl_c_in_a_slow_aguard_hook_under_asyncio_run_release_the_key(
    redis_url: str, prefix: str
) -> None:
    # The second, while the hook still runs, raises KeyboardInterrupt in the hook itself, the
    # first one's cancel still pending: the block never ran, and the release must outlast that
    # cancel (asyncio.run cancels the tasks left once its main task ended).
    assert run_worker(redis_url, prefix, "aguard-2") == {
        "first": "KeyboardInterrupt",
        "at_once": "ran",
        "entries": [],
    }


# ---- a second cancel while a cancelled block is given up --------------------------------------


async def test_a_second_cancel_while_a_cancelled_aguard_waits_for_its_entry_is_not_swallowed(
    real_async_client: redis.asyncio.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A block cut off by a cancel waits for its ``cancelled`` entry (the keeper's drain). A
    # wait retried on a cancel is for the cancel a Ctrl-C left pending; here the cancel is what
    # brought the block there, so a second one is new: it must end the wait, not start another.
    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix, lease=LEASE))
    drains: list[float] = []

    async def slow_drain(keeper: object, timeout: float) -> None:
        drains.append(timeout)
        await asyncio.sleep(30)

    entered = asyncio.Event()

    async def block() -> None:
        async with aguard(store, KEY, payload=b"p"):
            entered.set()
            await asyncio.sleep(30)

    try:
        monkeypatch.setattr(type(store._keeper), "drain", slow_drain)  # slots: on its class
        task = asyncio.ensure_future(block())
        await asyncio.wait_for(entered.wait(), 10)
        task.cancel("first")
        await async_wait_until(lambda: bool(drains), 10, "the first wait for the entry")
        task.cancel("second")
        done, _ = await asyncio.wait((task,), timeout=5)
        assert done, "the second cancel was swallowed: the block waits for its entry again"
        assert task.cancelled()
        assert len(drains) == 1
    finally:
        monkeypatch.undo()
        await store.aclose()
