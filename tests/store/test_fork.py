"""A RedisStore survives os.fork(): a child process gets its own heartbeat and claims freely.

multiprocessing's fork start method (the default on Linux before Python 3.14), gunicorn's
preload and Celery's prefork pool all fork a process that may already have used the store.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager

import pytest
import redis

from idemkey import Policy, RedisStore, guard
from idemkey.guard import GUARD_METHOD
from idemkey.records import Claimed, Replay, payload_fingerprint, record_for
from tests._lease import lapse
from tests._servers import RedisServer, wait_until

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _fork() -> int:
    with warnings.catch_warnings():
        # Python 3.12+ warns that forking a multi-threaded process may deadlock: that is the
        # very hazard this test checks the store handles.
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _in_child(work: object) -> None:  # pragma: no cover - runs in the forked child
    code = 1
    try:
        work()  # type: ignore[operator]
        code = 0
    finally:
        os._exit(code)


@contextlib.contextmanager
def _held_by_another_thread(lock: AbstractContextManager[object]) -> Iterator[None]:
    """``lock`` held by another thread for the block: a child forked in it inherits the lock
    taken by a thread that does not exist there, so nothing would ever release it."""
    held, let_go = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            let_go.wait(10)

    busy = threading.Thread(target=hold)
    busy.start()
    try:
        assert held.wait(10)
        yield
    finally:
        let_go.set()
        busy.join(10)


def _exit_code(pid: int) -> int:
    """Wait (with a deadline) for the child; kill it if it hangs."""

    def finished() -> tuple[int, int] | None:
        done, status = os.waitpid(pid, os.WNOHANG)
        return (done, status) if done else None

    try:
        _, status = wait_until(finished, timeout=10, message="the forked child to finish")
    except AssertionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    return os.waitstatus_to_exitcode(status)


def test_a_child_forked_while_the_heartbeat_holds_its_lock_can_claim(
    real_client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix))
    try:
        with guard(store, "parent") as call:
            # Stand-in for the heartbeat thread caught inside its critical section at fork
            # time: that thread does not exist in the child, so the lock it held is never
            # released there.
            with _held_by_another_thread(store._wakeup):
                sys.stdout.flush()
                pid = _fork()
                if pid == 0:  # pragma: no cover - the child

                    def claim_in_child() -> None:
                        with guard(store, "child") as child_call:
                            child_call.save("from the child")

                    _in_child(claim_in_child)
            assert _exit_code(pid) == 0
            call.save("from the parent")
    finally:
        store.close()
    with guard(store, "child") as again:
        assert again.result == "from the child"


def test_a_child_forked_while_a_thread_waits_reads_for_itself(
    private_redis_server: RedisServer, prefix: str
) -> None:
    # The parent's waiting thread is the reader of the record's done stream at fork time; in
    # the child that thread does not exist, so the child must not wait on its read.
    client = private_redis_server.client()
    admin = private_redis_server.client()
    store = RedisStore(client, Policy(prefix=prefix))
    record = record_for(prefix, "s", "POST", "/r", "k")

    def blocked() -> int:
        return int(admin.info("clients")["blocked_clients"])

    try:
        first = store.claim(record, "fp")
        assert isinstance(first, Claimed)
        parent_waiter = threading.Thread(
            target=store.claim, args=(record, "fp"), kwargs={"wait": 10}
        )
        parent_waiter.start()
        wait_until(blocked, 10, "the parent's read")
        sys.stdout.flush()
        pid = _fork()
        if pid == 0:  # pragma: no cover - the child

            def wait_in_child() -> None:
                assert store.claim(record, "fp", wait=10) == Replay(b"done")

            _in_child(wait_in_child)
        wait_until(lambda: blocked() == 2, 10, "the child's own read")
        assert store.complete(record, first.owner, b"done")
        assert _exit_code(pid) == 0
        parent_waiter.join(10)
    finally:
        store.close()
        client.close()
        admin.close()


def test_a_child_forked_while_the_uncertain_writer_holds_its_lock_keeps_its_outcomes(
    real_client: redis.Redis, prefix: str
) -> None:
    # The uncertain-outcome writer's lock taken by another thread at fork time (a writer thread
    # leaving at idle, a request starting one): that thread does not exist in the child, so a
    # child that took the inherited lock would hang in its first keep(). The child's takeover
    # must return, and its "takeover" entry reach Redis.
    store = RedisStore(real_client, Policy(prefix=prefix))
    record = record_for(prefix, "", GUARD_METHOD, "", "job")
    crashed = store.claim(record, payload_fingerprint(b""), heartbeat=False)
    assert isinstance(crashed, Claimed)
    assert lapse(real_client, record) == 1
    try:
        with _held_by_another_thread(store._keeper._lock):
            sys.stdout.flush()
            pid = _fork()
            if pid == 0:  # pragma: no cover - the child

                def take_over_in_child() -> None:
                    with guard(store, "job") as call:
                        assert call.takeover
                        call.save("from the child")
                    wait_until(
                        lambda: [e.kind for e in store.uncertain()] == ["takeover"],
                        timeout=5,
                        message="the child's takeover entry",
                    )

                _in_child(take_over_in_child)
            assert _exit_code(pid) == 0
    finally:
        store.close()
    with guard(store, "job") as again:
        assert again.result == "from the child"
