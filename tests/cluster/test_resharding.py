"""A slot of 50 000 completed records moves between masters while requests replay and claim in it.

Issue 23's "done when": on a real 3-master cluster, a slot holding at least 50 000 completed
records (2 KiB each) is migrated with ``CLUSTER SETSLOT`` and ``MIGRATE`` in batches of 100 keys,
paced as a move across a network is (at least 12 ms a batch, so the move lasts at least 6 s),
while 4 threads (one ``RedisStore`` on a ``RedisCluster``) and 4 asyncio tasks (one
``AsyncRedisStore`` on the asyncio ``RedisCluster``) replay records of that slot and claim new
keys in it. It counts the store errors (what an HTTP adapter answers 503), duplicate executions
and replays that are not byte-identical, and prints the move's duration, the requests made
during it and the errors.

It passes because every script touches one key, the record (its lease a field of it): the
source serves what it still holds and redirects the rest with ASK, which the target serves. With
0.2's two keys (record and lock) the cluster refused the scripts with TRYAGAIN until the slot
had moved, and after ``slot_moving_wait`` (2 s) the store gave up: 16-18 errors per move.

The 50 000 records are one record completed through the store, copied: the same fields
complete.lua wrote (``fp``, ``resp``), each copy with its own 2 KiB response, under names that
share one hash tag so they all sit in the slot (a real record's tag is a digest of its key, and
finding 50 000 keys of one slot would take minutes). The store replays them like any record.
"""

from __future__ import annotations

import asyncio
import collections
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from idemkey import AsyncRedisStore, Policy, RedisStore
from idemkey._core import Claimed, InFlight, Record, Replay
from tests._servers import redis_server_executable, server_version, wait_until
from tests.cluster._cluster import ClusterProcesses, running_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.redis, pytest.mark.slow]

RECORDS = 50_000
RESPONSE_BYTES = 2048
BATCH = 100
# A batch at most this often: 500 batches take at least 6 s, as a move across a network does
# (loopback alone moved the slot in 1.3-2.3 s, inside slot_moving_wait).
BATCH_INTERVAL = 0.012
MIN_MOVE_SECONDS = 5.0
THREADS = 4
TASKS = 4
# One request in this many claims a new key; the others replay a stored record.
NEW_KEY_EVERY = 4


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterProcesses]:
    """Its own 3 masters, no replicas: 100 MB of records would slow every other cluster test."""
    with running_cluster(masters=3, replicas=0) as processes:
        yield processes


def _response(i: int) -> bytes:
    """Record ``i``'s stored response: 2 KiB, its own first bytes."""
    head = b"record %08d " % i
    return head + bytes((i + n) % 251 for n in range(RESPONSE_BYTES - len(head)))


class Tally:
    """What every worker saw, under one lock: requests (all, and during the move), errors by
    kind, executions per new key, replays whose bytes differ."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.during = collections.Counter[str]()
        self.errors = collections.Counter[str]()
        self.executions = collections.Counter[str]()
        self.not_identical = 0
        self.move: tuple[float, float] | None = None  # (start, end), monotonic
        self.moving_since: float | None = None

    def request(self, who: str, started: float, error: BaseException | None = None) -> None:
        with self.lock:
            self.requests += 1
            if (
                self.moving_since is not None
                and started >= self.moving_since
                and (self.move is None or started <= self.move[1])
            ):
                self.during[who] += 1
            if error is not None:  # "StoreError(ClusterError)": the store's error and its cause
                cause = error.__cause__
                kind = type(error).__name__ + (f"({type(cause).__name__})" if cause else "")
                self.errors[kind] += 1


def _copy_completed_records(
    cluster: ClusterProcesses, fields: dict[bytes, bytes], records: list[Record]
) -> None:
    """Write ``records`` as completed: ``fields`` with each one's own response, pipelined on
    the slot's master, with the original's TTL."""
    master = cluster.master_for_slot(key_slot(records[0].record_key.encode()))
    client = cluster.node_client(master, socket_timeout=30)
    try:
        ttl = 86_400_000
        for start in range(0, len(records), 1000):
            pipe = client.pipeline(transaction=False)
            for i in range(start, min(start + 1000, len(records))):
                pipe.hset(records[i].record_key, mapping={**fields, b"resp": _response(i)})
                pipe.pexpire(records[i].record_key, ttl)
            pipe.execute()
    finally:
        client.close()


def _migrate_paced(cluster: ClusterProcesses, slot: int, tally: Tally) -> int:
    """Move ``slot`` to another master, one batch of 100 keys per BATCH_INTERVAL at most."""
    owner = cluster.master_for_slot(slot)
    target = next(m for m in cluster.masters() if m is not owner)
    started = time.monotonic()
    with tally.lock:
        tally.moving_since = started
    source = cluster.begin_migration(slot, target)
    moved = batches = 0
    while True:
        not_before = started + batches * BATCH_INTERVAL
        if (pause := not_before - time.monotonic()) > 0:
            time.sleep(pause)
        count = cluster.migrate_some(slot, source, target, BATCH)
        if not count:
            break
        moved += count
        batches += 1
    cluster.finish_migration(slot, source, target)
    with tally.lock:
        tally.move = (started, time.monotonic())
    if cluster.master_for_slot(slot) is not target:
        raise HarnessError(f"slot {slot} did not move to {target}")
    return moved


def _thread_worker(
    store: RedisStore,
    records: list[Record],
    new: Iterator[Record],
    tally: Tally,
    stop: threading.Event,
) -> None:
    rng = random.Random()
    pending: Record | None = None
    n = 0
    while not stop.is_set():
        n += 1
        started = time.monotonic()
        try:
            if n % NEW_KEY_EVERY == 0:
                # A new key, or again the one whose claim failed (a client retrying).
                record = pending or next(new)
                pending = record
                decision = store.claim(record, "fp", heartbeat=False)
                if isinstance(decision, Claimed):
                    with tally.lock:
                        tally.executions[record.record_key] += 1
                    store.complete(record, decision.owner, b"new " + record.digest.encode())
                    pending = None
                elif decision == Replay(b"new " + record.digest.encode()):
                    pending = None
                elif not isinstance(decision, InFlight):
                    with tally.lock:
                        tally.not_identical += 1
            else:
                i = rng.randrange(len(records))
                if store.claim(records[i], "fp") != Replay(_response(i)):
                    with tally.lock:
                        tally.not_identical += 1
        except Exception as exc:  # counted, as a 503 would be
            tally.request("threads", started, exc)
        else:
            tally.request("threads", started)


async def _task_worker(
    store: AsyncRedisStore,
    records: list[Record],
    new: Iterator[Record],
    tally: Tally,
    stop: threading.Event,
) -> None:
    rng = random.Random()
    pending: Record | None = None
    n = 0
    while not stop.is_set():
        n += 1
        started = time.monotonic()
        try:
            if n % NEW_KEY_EVERY == 0:
                record = pending or next(new)
                pending = record
                decision = await store.claim(record, "fp", heartbeat=False)
                if isinstance(decision, Claimed):
                    with tally.lock:
                        tally.executions[record.record_key] += 1
                    await store.complete(record, decision.owner, b"new " + record.digest.encode())
                    pending = None
                elif decision == Replay(b"new " + record.digest.encode()):
                    pending = None
                elif not isinstance(decision, InFlight):
                    with tally.lock:
                        tally.not_identical += 1
            else:
                i = rng.randrange(len(records))
                if await store.claim(records[i], "fp") != Replay(_response(i)):
                    with tally.lock:
                        tally.not_identical += 1
        except Exception as exc:
            tally.request("tasks", started, exc)
        else:
            tally.request("tasks", started)
        await asyncio.sleep(0)  # a task that never awaits a slow reply must not starve others


class HarnessError(RuntimeError):
    """The test could not do its part (a wait timed out, the slot did not move): a broken
    harness, told apart from the behaviour the test is about."""


def _wait(predicate: Any, timeout: float, message: str) -> None:
    try:
        wait_until(predicate, timeout, message)
    except AssertionError as exc:
        raise HarnessError(str(exc)) from exc


def _new_records(prefix: str, tag: str, who: str) -> Iterator[Record]:
    n = 0
    while True:
        name = f"{prefix}:{{{tag}}}:new:{who}:{n}"
        yield Record(f"{who}-{n}", name, name + ":lock")
        n += 1


def test_a_slot_of_50000_records_moves_while_requests_replay_and_claim_in_it(
    cluster: ClusterProcesses, prefix: str
) -> None:
    exe = redis_server_executable()
    if exe is None:
        raise HarnessError("no server binary")
    server = "{} {}".format(server_version(exe)[0], ".".join(map(str, server_version(exe)[1])))
    tag = f"reshard-{prefix}"
    slot = key_slot(f"{{{tag}}}".encode())
    records = [
        Record(f"r{i}", f"{prefix}:{{{tag}}}:{i}", f"{prefix}:{{{tag}}}:{i}:lock")
        for i in range(RECORDS)
    ]
    client = cluster.client()
    store = RedisStore(client, Policy(prefix=prefix))
    first = store.claim(records[0], "fp", heartbeat=False)
    if not isinstance(first, Claimed) or not store.complete(records[0], first.owner, _response(0)):
        raise HarnessError(f"the first record could not be completed: {first!r}")
    fields = client.hgetall(records[0].record_key)
    _copy_completed_records(cluster, fields, records)
    master = cluster.master_for_slot(slot)
    in_slot = int(cluster.node_client(master).execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))
    if store.claim(records[-1], "fp") != Replay(_response(RECORDS - 1)) or in_slot < RECORDS:
        raise HarnessError(f"the slot holds {in_slot} keys, or the copies do not replay")

    tally = Tally()
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=_thread_worker,
            args=(store, records, _new_records(prefix, tag, f"t{n}"), tally, stop),
            daemon=True,
        )
        for n in range(THREADS)
    ]
    loop_ready = threading.Event()

    async def tasks_main() -> None:
        async_client = cluster.async_client()
        # Not initialised first: the tasks' first calls are the store's (which initialises the
        # client under its lock), as in an application that makes the client and serves.
        async_store = AsyncRedisStore(async_client, Policy(prefix=prefix))
        loop_ready.set()
        try:
            await asyncio.gather(
                *(
                    _task_worker(
                        async_store, records, _new_records(prefix, tag, f"a{n}"), tally, stop
                    )
                    for n in range(TASKS)
                )
            )
        finally:
            await async_store.aclose()
            await async_client.aclose()

    tasks_thread = threading.Thread(target=asyncio.run, args=(tasks_main(),), daemon=True)
    for thread in [*threads, tasks_thread]:
        thread.start()
    try:
        _wait(loop_ready.is_set, 30, "the asyncio workers to start")
        _wait(lambda: tally.requests > 200, 30, "requests before the move")
        moved = _migrate_paced(cluster, slot, tally)
        seen = tally.requests
        _wait(lambda: tally.requests > seen + 200, 30, "requests after the move")
    finally:
        stop.set()
        for thread in [*threads, tasks_thread]:
            thread.join(60)
        store.close()
        client.close()
    if tally.move is None:
        raise HarnessError("the move did not end")
    duration = tally.move[1] - tally.move[0]
    duplicates = {key: n for key, n in tally.executions.items() if n > 1}
    print(
        f"\n{server}: moved {moved} keys of slot {slot} in {duration:.2f} s; "
        f"requests during the move: {sum(tally.during.values())} ({dict(tally.during)}), "
        f"in all {tally.requests}; errors: {dict(tally.errors) or 'none'}; "
        f"duplicate executions: {len(duplicates)}; replays not byte-identical: "
        f"{tally.not_identical}"
    )
    if moved < RECORDS or duration < MIN_MOVE_SECONDS or not tally.during:
        raise HarnessError("the move was not the one the test is about (see the line above)")
    assert not duplicates
    assert tally.not_identical == 0
    assert not tally.errors, dict(tally.errors)
