"""The uncertain-outcome keepers, against a client that holds every write until let go: both
hold at most MAX_PENDING entries not yet written, the one being written included, and both try
a write that could not connect again, through the one retry loop they share (_async_append)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from idemkey.store._concurrency._async_keeper import AsyncKeeper
from idemkey.store._concurrency._sync_keeper import Keeper
from idemkey.store.uncertain import MAX_PENDING


class HeldClient:
    """A client whose pipelines write only once ``let_go`` is set; ``refusals`` first writes
    fail as a connection that could not be made (nothing reached Redis)."""

    def __init__(self, refusals: int = 0) -> None:
        self.let_go = threading.Event()
        self.writing = threading.Event()  # a write is waiting on let_go
        self.written: list[dict[str, str]] = []
        self.refusals = refusals


class _Pipe:
    def __init__(self, client: HeldClient) -> None:
        self.client = client
        self.fields: dict[str, str] = {}

    def xadd(self, stream: str, fields: dict[str, str], **_: Any) -> None:
        self.fields = fields

    def pexpire(self, stream: str, ttl_ms: int) -> None:
        pass

    def _write(self) -> None:
        if self.client.refusals:
            self.client.refusals -= 1
            raise ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
        self.client.written.append(self.fields)


class SyncPipe(_Pipe):
    def execute(self) -> None:
        self.client.writing.set()
        assert self.client.let_go.wait(10), "the test never let the write go"
        self._write()


class AsyncPipe(_Pipe):
    async def execute(self) -> None:
        self.client.writing.set()
        for _ in range(1000):  # 10 s
            if self.client.let_go.is_set():
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the test never let the write go")
        self._write()


class SyncHeld(HeldClient):
    def pipeline(self, transaction: bool) -> Any:
        assert not transaction
        return SyncPipe(self)


class AsyncHeld(HeldClient):
    def pipeline(self, transaction: bool) -> Any:
        assert not transaction
        return AsyncPipe(self)


def test_the_writer_thread_holds_max_pending_entries_its_own_included() -> None:
    """The writer thread's entry counts: 63d3937's queue held MAX_PENDING besides it, one
    more than the asyncio keeper's tasks."""
    client = SyncHeld()
    keeper = Keeper(client)
    keeper.keep("s", {"n": "0"}, 1000)
    assert client.writing.wait(10), "the writer never started"
    for n in range(1, MAX_PENDING + 5):
        keeper.keep("s", {"n": str(n)}, 1000)
    client.let_go.set()
    keeper.drain(10)
    assert [int(fields["n"]) for fields in client.written] == list(range(MAX_PENDING))


async def test_the_tasks_hold_max_pending_entries() -> None:
    client = AsyncHeld()
    keeper = AsyncKeeper(client)
    for n in range(MAX_PENDING + 5):
        keeper.keep("s", {"n": str(n)}, 1000)
    client.let_go.set()
    await keeper.drain(10)
    assert sorted(int(fields["n"]) for fields in client.written) == list(range(MAX_PENDING))


def test_a_write_that_could_not_connect_is_tried_again_once_written() -> None:
    client = SyncHeld(refusals=2)
    client.let_go.set()
    keeper = Keeper(client)
    keeper.keep("s", {"n": "0"}, 1000)
    keeper.drain(10)
    assert client.written == [{"n": "0"}]


async def test_an_async_write_that_could_not_connect_is_tried_again_once_written() -> None:
    client = AsyncHeld(refusals=2)
    client.let_go.set()
    keeper = AsyncKeeper(client)
    keeper.keep("s", {"n": "0"}, 1000)
    await keeper.drain(10)
    assert client.written == [{"n": "0"}]
