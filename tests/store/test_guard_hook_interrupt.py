"""An on_event hook interrupted on ``claimed`` or ``takeover`` frees the key as an interrupted
block does: the claim is kept, no longer renewed, and the retry after its lease takes it over.

The hook runs once Redis granted the claim, before the block: a Ctrl-C landing while a slow
hook exports the event (a KeyboardInterrupt), an exit, a cancel, raise there. Before, the
claim stayed in Redis and the store's heartbeat went on renewing it: every retry raised
RequestInFlightError for as long as the process lived. Now it takes the path of a block cut
off before saving (docs/guard.md, "one rule for both guards"): a ``cancelled`` entry, the key
held until its lease lapses, then a takeover.
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
EVENTS = ["claimed", "takeover"]


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


@pytest.mark.parametrize("event", EVENTS)
@pytest.mark.parametrize("interruption", [KeyboardInterrupt, SystemExit], ids=lambda e: e.__name__)
def test_a_guard_hook_interrupted_leaves_the_key_to_lapse_and_the_retry_takes_it_over(
    real_client: redis.Redis, prefix: str, event: str, interruption: type[BaseException]
) -> None:
    hook = RaiseOn(event, interruption)
    store = RedisStore(real_client, Policy(prefix=prefix, lease=LEASE, wait=0, on_event=hook))
    record = guard_record(prefix)
    ran: list[str] = []
    try:
        if event == "takeover":
            # A first run cut off in its block: kept, unrenewed, so the next claim takes over.
            with pytest.raises(KeyboardInterrupt), guard(store, KEY, payload=b"p"):
                raise KeyboardInterrupt
            wait_until(lambda: lease_left(real_client, record) <= 0, LAPSE_WAIT, "first lapse")
        with pytest.raises(interruption), guard(store, KEY, payload=b"p"):
            ran.append("the block ran after its hook was interrupted")
        assert hook.fence is not None
        with pytest.raises(LookupError):  # its call is not left current
            current_call()
        # Kept, not released: the block's work is unknown to the guard, as after any Ctrl-C.
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
        want = [("takeover", hook.fence)] if event == "takeover" else []
        want.append(("cancelled", hook.fence))
        wait_until(
            lambda: all(pair in entries_of(store.uncertain()) for pair in want),
            10,
            f"the uncertain entries {want}",
        )
    finally:
        store.close()
    assert ran == []


@pytest.mark.parametrize("event", EVENTS)
@pytest.mark.parametrize(
    "interruption", [KeyboardInterrupt, asyncio.CancelledError], ids=lambda e: e.__name__
)
async def test_an_aguard_hook_interrupted_leaves_the_key_to_lapse_and_the_retry_takes_it_over(
    real_async_client: redis.asyncio.Redis,
    prefix: str,
    event: str,
    interruption: type[BaseException],
) -> None:
    hook = RaiseOn(event, interruption)
    policy = Policy(prefix=prefix, lease=LEASE, wait=0, on_event=hook)
    store = AsyncRedisStore(real_async_client, policy)
    record = guard_record(prefix)
    ran: list[str] = []

    async def lapsed() -> bool:
        return await lease_left(real_async_client, record) <= 0

    try:
        if event == "takeover":
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
        want = [("takeover", hook.fence)] if event == "takeover" else []
        want.append(("cancelled", hook.fence))

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
# warm shutdown does: it waits for the lease to lapse and retries.


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


def test_ctrl_c_in_a_slow_guard_hook_frees_the_key_once_the_lease_lapses(
    redis_url: str, prefix: str
) -> None:
    # Before: the heartbeat thread renewed the claim until the process exited; every retry
    # in between raised RequestInFlightError.
    assert run_worker(redis_url, prefix, "guard") == {
        "first": "KeyboardInterrupt",
        "lapsed": True,
        "retry": "ran (takeover)",
        "entries": ["cancelled"],
    }


needs_runner = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="asyncio.run cancels its main task on Ctrl-C from 3.11"
)


@needs_runner
@pytest.mark.parametrize("presses", [1, 2], ids=["one-ctrl-c", "two-ctrl-c"])
def test_ctrl_c_in_a_slow_aguard_hook_under_asyncio_run_keeps_the_key_as_a_cancel(
    redis_url: str, prefix: str, presses: int
) -> None:
    # The first Ctrl-C makes asyncio.run cancel its main task: the cancel lands in the block,
    # which then ends as a cancelled one. A second, while the hook still runs, raises
    # KeyboardInterrupt in the hook itself; before, that left no entry, and the claim was
    # renewed for as long as the loop ran.
    assert run_worker(redis_url, prefix, f"aguard-{presses}") == {
        "first": "KeyboardInterrupt",
        "lapsed": True,
        "retry": "ran (takeover)",
        "entries": ["cancelled"],
    }
