"""The uncertain outcomes, each produced by a real fault, appear once in the prefix's stream.

* SIGSTOP a worker past its lease: its successor's ``takeover`` and, once it wakes, its own
  ``lease_lost`` (tests/faults/_http_worker.py, as in test_crash.py).
* Redis stopped after the handler ran: ``completion_failed`` (kept once Redis is back).
* Redis down with ``on_store_error="open"``: ``unprotected`` (kept once Redis is back).
* A step, then a failure: ``released_with_steps``.

Keeping an entry never delays or fails the request: a paused Redis costs the caller nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio
from werkzeug.test import Client

from idemkey import AsyncRedisStore, LeaseLostError, Policy, RedisStore, aguard, guard
from idemkey._core import PAYLOAD_DIGEST, record_for, record_origin
from idemkey.adapters.wsgi import IdempotencyMiddleware
from idemkey.events import Reporter
from idemkey.store import uncertain as uncertain_module
from idemkey.store.uncertain import UncertainEntry
from tests._lease import lapse, lease_left
from tests._servers import RedisServer, async_wait_until, no_retry, wait_until
from tests.faults.test_crash import LEASE, post, spawn, successor

pytestmark = pytest.mark.redis

__all__ = ["spawn"]  # the worker fixture, shared with test_crash.py


def entries(store: RedisStore, count: int, timeout: float = 20.0) -> list[UncertainEntry]:
    """The stream once it holds ``count`` entries (oldest first), and no more a moment later."""
    deadline = time.monotonic() + timeout
    while len(found := store.uncertain()) < count:
        assert time.monotonic() < deadline, f"waited for {count} entries, got {found}"
        time.sleep(0.05)
    time.sleep(0.3)  # a second entry for the same outcome would have landed by now
    assert store.uncertain() == found, "an outcome was kept twice"
    return sorted(found, key=lambda entry: entry.at)


def test_a_worker_stopped_past_its_lease_leaves_a_takeover_and_a_lease_lost(
    spawn: Callable[[], subprocess.Popen[str]], real_client: redis.Redis, prefix: str
) -> None:
    worker = spawn()
    [started] = wait_until(
        lambda: real_client.lrange(f"{prefix}:started", 0, -1), 30, "the handler to run"
    )
    os.kill(worker.pid, signal.SIGSTOP)  # frozen inside its handler, heartbeat and all
    web = successor(real_client, prefix, [])
    wait_until(lambda: post(web).status_code == 201, LEASE + 10, "the takeover")
    real_client.rpush(f"{prefix}:go", "go")
    os.kill(worker.pid, signal.SIGCONT)
    _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    store = RedisStore(real_client, Policy(prefix=prefix))
    takeover, lost = entries(store, 2)
    assert (takeover.kind, lost.kind, lost.fence) == ("takeover", "lease_lost", int(started))
    assert takeover.fence is not None
    assert takeover.fence > int(started)
    for entry in (takeover, lost):
        assert (entry.method, entry.route) == ("POST", "/charges")
        assert entry.digest == takeover.digest
        assert entry.meaning
        assert entry.action
    assert "took the record over" in lost.detail


def _app(on_run: Callable[[], None]) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        on_run()
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b'{"id": "ch_1"}']

    return app


def test_redis_stopped_after_the_handler_leaves_a_completion_failed(
    private_redis_server: RedisServer, prefix: str
) -> None:
    client = private_redis_server.client(retry=no_retry(), socket_timeout=2)
    store = RedisStore(client, Policy(prefix=prefix))
    web = Client(IdempotencyMiddleware(_app(private_redis_server.stop), store))
    try:
        answer = web.post("/charges", data=b"{}", headers={"Idempotency-Key": "k1"})
        assert answer.status_code == 201  # the client has its answer: only the record is lost
        answer.close()  # the response is sent: the middleware completes the record now
        private_redis_server.start()  # back on the same port, within the writer's retries
        (entry,) = entries(store, 1)
        assert entry.kind == "completion_failed"
        assert (entry.method, entry.route) == ("POST", "/charges")
        assert entry.fence is not None
        assert entry.fence > 10**15  # the claim's: the server's clock in microseconds
        assert "response not stored" in entry.detail
    finally:
        store.close()
        client.close()


def test_redis_down_with_on_store_error_open_leaves_an_unprotected(
    private_redis_server: RedisServer, prefix: str
) -> None:
    client = private_redis_server.client(retry=no_retry(), socket_timeout=2)
    store = RedisStore(client, Policy(prefix=prefix, on_store_error="open"))
    ran: list[int] = []
    web = Client(IdempotencyMiddleware(_app(lambda: ran.append(1)), store))
    try:
        private_redis_server.stop()
        answer = web.post("/charges", data=b"{}", headers={"Idempotency-Key": "k1"})
        assert answer.status_code == 201
        answer.close()
        assert ran == [1]
        private_redis_server.start()
        (entry,) = entries(store, 1)
        assert entry.kind == "unprotected"
        assert (entry.method, entry.route, entry.fence) == ("POST", "/charges", None)
    finally:
        store.close()
        client.close()


def test_a_step_then_a_failure_leaves_a_released_with_steps(
    real_client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix))
    try:
        with contextlib.suppress(RuntimeError), guard(store, "order-1", scope="acct") as call:
            call.step("reserve", lambda: 1)
            call.step("charge, then ship", lambda: 2)  # a comma in a name (2ba1d64 split it)
            raise RuntimeError("card declined after the charge step")
        (entry,) = entries(store, 1)
        assert (entry.kind, entry.steps, entry.scope) == (
            "released_with_steps",
            ("reserve", "charge, then ship"),
            "acct",
        )
        assert "card declined" in entry.detail
        # A failure with no finished step is an ordinary release: nothing to reconcile.
        with contextlib.suppress(RuntimeError), guard(store, "order-2"):
            raise RuntimeError("before any step")
        assert len(entries(store, 1)) == 1
    finally:
        store.close()


def test_a_step_whose_checkpoint_is_refused_is_named_in_the_lease_lost_entry(
    real_client: redis.Redis, prefix: str
) -> None:
    """The record is lost between two steps (evicted, a failover): the second step's work ran,
    its checkpoint was refused. That step, the one certain to need checking, is listed with
    the first; the third never ran and is not."""
    store = RedisStore(real_client, Policy(prefix=prefix))
    record = record_for(prefix, "", "GUARD", "", "order-1")
    ran: list[str] = []

    def job() -> None:
        with guard(store, "order-1", payload={"o": 1}) as call:
            call.step("reserve", ran.append, "reserve")
            real_client.delete(record.key)
            call.step("charge", ran.append, "charge")
            call.step("ship", ran.append, "ship")  # pragma: no cover

    try:
        with pytest.raises(LeaseLostError):
            job()
        assert ran == ["reserve", "charge"]
        (entry,) = entries(store, 1)
        assert (entry.kind, entry.steps) == ("lease_lost", ("reserve", "charge"))
    finally:
        store.close()


def test_a_scope_with_a_lone_surrogate_keeps_its_entry_escaped(
    real_client: redis.Redis, redis_url: str, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A scope made from undecodable bytes (a lone surrogate) names its record (encoded with
    surrogatepass) and is kept in its origin escaped: its uncertain entry is kept the same way,
    so an operator sees it. Before, the strict UTF-8 encoding of the entry failed in the
    writer and the entry was dropped, logged at debug level only."""
    from idemkey.cli import main

    store = RedisStore(real_client, Policy(prefix=prefix))
    try:
        scope = "tenant-\udcff"
        with contextlib.suppress(RuntimeError), guard(store, "order-2", scope=scope) as call:
            call.step("reserve", lambda: 1)
            raise RuntimeError("after a step \udcfe")
        store._keeper.drain(5)
        (entry,) = store.uncertain()
        (status,) = store.records()
        assert status.scope == "tenant-\\udcff"  # the record's own origin, escaped
        assert (entry.kind, entry.scope, entry.steps) == (
            "released_with_steps",
            "tenant-\\udcff",
            ("reserve",),
        )
        assert entry.digest == record_for(prefix, scope, "GUARD", "", "order-2").digest
        assert "after a step \\udcfe" in entry.detail
        argv = ["--redis-url", redis_url, "--prefix", prefix, "list", "--uncertain", "--json"]
        assert main(argv) == 0
        (row,) = json.loads(capsys.readouterr().out)["uncertain"]
        assert (row["scope"], row["steps"], row["state_now"]) == (
            "tenant-\\udcff",
            ["reserve"],
            "released",
        )
    finally:
        store.close()


def test_a_takeover_lists_the_finished_steps_its_lease_lost_twin_lists(
    real_client: redis.Redis, prefix: str
) -> None:
    # Executor A stalls past its lease after two steps; B takes the record over and resumes
    # after them. Both entries of the one incident name the steps an operator must check.
    first, second = (RedisStore(real_client, Policy(prefix=prefix)) for _ in range(2))
    record = record_for(prefix, "", "GUARD", "", "job")
    try:
        with pytest.raises(LeaseLostError), guard(first, "job") as stalled:  # noqa: PT012
            stalled.step("reserve", lambda: 1)
            stalled.step("charge", lambda: 2)
            assert lapse(real_client, record) == 1  # stalled past its lease
            with guard(second, "job") as taker:
                assert taker.takeover
                assert taker.resumed_steps == ("reserve", "charge")
                taker.save("done")
            stalled.save("late")  # refused: the record is B's now
        # By kind, not by time: both can land in one millisecond (a run under load, once).
        kinds = {entry.kind: entry for entry in entries(first, 2)}
        assert sorted(kinds) == ["lease_lost", "takeover"]
        takeover, lost = kinds["takeover"], kinds["lease_lost"]
        assert takeover.steps == lost.steps == ("reserve", "charge")
        assert takeover.fence == taker.fence
        assert lost.fence == stalled.fence
        assert (takeover.fence or 0) > (lost.fence or 0)  # the taker's fence is above
    finally:
        first.close()
        second.close()


async def test_async_takeover_and_released_with_steps(
    real_async_client: redis.asyncio.Redis, prefix: str
) -> None:
    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix))
    try:
        crashed = record_for(prefix, "", "GUARD", "", "job-1")
        await store.claim(
            crashed,
            PAYLOAD_DIGEST(b""),
            lease_ms=30,
            heartbeat=False,
            origin=record_origin("", "GUARD", ""),
        )

        async def lapsed() -> bool:
            return await lease_left(real_async_client, crashed) == -2  # by its deadline

        await async_wait_until(lapsed, 10, "the lease to lapse")
        with contextlib.suppress(RuntimeError):
            async with aguard(store, "job-1") as call:
                assert call.takeover
                await call.step("sent", lambda: 1)
                raise RuntimeError("after the step")
        await store._keeper.drain(5)
        kinds = [e.kind for e in reversed(await store.uncertain())]
        assert sorted(kinds) == ["released_with_steps", "takeover"]
    finally:
        await store.aclose()


def test_keeping_an_entry_never_waits_for_a_paused_redis(
    private_redis_server: RedisServer, prefix: str
) -> None:
    client = private_redis_server.client(retry=no_retry(), socket_timeout=1)
    store = RedisStore(client, Policy(prefix=prefix))
    source = Reporter(None, record_for(prefix, "", "GUARD", "", "k"), "", "GUARD", "")
    try:
        private_redis_server.pause()
        started = time.monotonic()
        for _ in range(uncertain_module.MAX_ENTRIES // 50):  # past the writer's queue
            store.keep_uncertain("takeover", source, 2)
        assert time.monotonic() - started < 0.5
    finally:
        private_redis_server.resume()
        store.close()
        client.close()


def test_a_guard_run_open_while_redis_is_down_leaves_an_unprotected(
    private_redis_server: RedisServer, prefix: str
) -> None:
    client = private_redis_server.client(retry=no_retry(), socket_timeout=2)
    store = RedisStore(client, Policy(prefix=prefix, on_store_error="open"))
    try:
        private_redis_server.stop()
        with guard(store, "job-1", scope="acct") as call:
            call.save("sent")  # ran with no claim: nothing is stored
        private_redis_server.start()
        (entry,) = entries(store, 1)
        assert (entry.kind, entry.method, entry.scope) == ("unprotected", "GUARD", "acct")
    finally:
        store.close()
        client.close()


def test_an_entry_written_by_0_3_reads_its_comma_joined_steps() -> None:
    from idemkey.store.uncertain import decode_entry

    entry = decode_entry(b"1-0", {b"kind": b"lease_lost", b"steps": b"reserve,charge"})
    assert entry.steps == ("reserve", "charge")
