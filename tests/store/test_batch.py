"""Script calls of many tasks sent as batches (idemkey/store/_concurrency/_async_lean.py
``Batched``), on a real redis-server: each call gets its own answer, a call alone is sent at
once, and an error reply, a dropped connection, a timeout or a cancelled caller inside a batch
touch only what they must. The store contract on batches: ``BatchedAsyncStore`` in
test_scripts.py, test_guard.py and test_tombstones.py; the raw replies: test_lean.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from idemkey import AsyncRedisStore, Policy, StoreError
from idemkey._core import Claimed, Replay, record_for
from idemkey.records import Record
from idemkey.store._base import evalsha_packer
from idemkey.store._concurrency._async_lean import Batched

pytestmark = pytest.mark.skipif(
    int(redis.__version__.split(".", 1)[0]) < 8, reason="the lean path needs redis-py 8"
)

TASKS = 200
#: Seconds a burst of calls may take before the test fails rather than hangs.
DEADLINE = 20.0


async def _at_once(*calls: Any, return_exceptions: bool = False) -> list[Any]:
    """``asyncio.gather`` of ``calls``, failing after :data:`DEADLINE`."""
    gathered = asyncio.gather(*calls, return_exceptions=return_exceptions)
    return list(await asyncio.wait_for(gathered, DEADLINE))


class Recording(Batched):
    """The default sender, keeping the size of each batch it sends."""

    def __init__(self, client: Any) -> None:
        pack = evalsha_packer(client.connection_pool)
        assert pack is not None
        super().__init__(client, pack)
        self.sizes: list[int] = []

    async def _send(self, batch: list[Any]) -> None:
        self.sizes.append(len(batch))
        await Batched._send(self, batch)


def _store(client: redis.asyncio.Redis, prefix: str) -> tuple[AsyncRedisStore, Recording]:
    store = AsyncRedisStore(client, Policy(prefix=prefix))
    assert type(store._evalsha.__self__) is Batched  # type: ignore[attr-defined]
    sender = Recording(client)
    store._evalsha = sender.evalsha  # type: ignore[method-assign]
    return store, sender


@pytest_asyncio.fixture
async def loaded(
    real_async_client: redis.asyncio.Redis, prefix: str
) -> AsyncIterator[tuple[AsyncRedisStore, Recording]]:
    store, sender = _store(real_async_client, prefix)
    for script in store._scripts.values():
        await real_async_client.script_load(script.script)
    try:
        yield store, sender
    finally:
        await store.aclose()


def _records(prefix: str, n: int = TASKS) -> list[Record]:
    return [record_for(prefix, "", "GUARD", "", f"k{i}") for i in range(n)]


async def _evalsha_calls(client: redis.asyncio.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_many_tasks_at_once_each_get_their_own_answer(
    loaded: tuple[AsyncRedisStore, Recording], prefix: str
) -> None:
    store, sender = loaded
    records = _records(prefix)
    claims = await _at_once(
        *(
            store.claim(r, b"fp%d" % i, owner=f"o{i}", heartbeat=False)
            for i, r in enumerate(records)
        )
    )
    assert [type(c) for c in claims] == [Claimed] * TASKS
    assert [c.owner for c in claims] == [f"o{i}" for i in range(TASKS)]  # type: ignore[union-attr]
    assert max(sender.sizes) > 1  # they did share batches ...
    assert sum(sender.sizes) == TASKS - 1  # ... all but the first, sent alone at once
    done = await _at_once(
        *(store.complete(r, f"o{i}", b"body %d" % i) for i, r in enumerate(records))
    )
    assert done == [True] * TASKS
    replays = await _at_once(
        *(store.claim(r, b"fp%d" % i, heartbeat=False) for i, r in enumerate(records))
    )
    assert [(type(d), d.response) for d in replays] == [  # type: ignore[union-attr]
        (Replay, b"body %d" % i) for i in range(TASKS)
    ]
    mismatches = await _at_once(  # another fingerprint: each record's own refusal
        *(store.claim(r, b"other", heartbeat=False) for r in records)
    )
    assert {type(d).__name__ for d in mismatches} == {"Mismatch"}


async def test_a_call_alone_is_sent_at_once(
    loaded: tuple[AsyncRedisStore, Recording], prefix: str
) -> None:
    store, sender = loaded
    for i, record in enumerate(_records(prefix, 20)):
        claimed = await store.claim(record, b"fp", owner=f"o{i}", heartbeat=False)
        assert await store.complete(record, claimed.owner, b"r")  # type: ignore[union-attr]
    assert sender.sizes == []  # no call waited for a batch


async def test_noscript_in_a_batch_fails_only_its_own_calls(
    loaded: tuple[AsyncRedisStore, Recording], prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After SCRIPT FLUSH only claim.lua is loaded again: in one batch, claims and releases;
    each release's NOSCRIPT sends it again through the registered script, and every claim is
    answered from the batch itself (none through the script)."""
    store, sender = loaded
    client = store.client
    await client.script_flush()
    await client.script_load(store._scripts["claim"].script)
    through_script: list[str] = []
    for name in ("claim", "release"):
        script = store._scripts[name]

        async def counted(keys: Any, args: Any, *, _name: str = name, _s: Any = script) -> Any:
            through_script.append(_name)
            return await _s(keys, args)

        monkeypatch.setitem(store._scripts, name, counted)
        counted.sha = script.sha  # type: ignore[attr-defined]
    records = _records(prefix, 60)
    calls = []
    for i, record in enumerate(records):
        calls.append(store.claim(record, b"fp", owner=f"o{i}", heartbeat=False))
        calls.append(store.release(record, "not the owner"))
    answers = await _at_once(*calls)
    assert [c.owner for c in answers[0::2]] == [f"o{i}" for i in range(60)]  # type: ignore[union-attr]
    assert answers[1::2] == [False] * 60
    assert max(sender.sizes) > 2
    assert sorted(through_script) == ["release"] * 60
    for i, record in enumerate(records):  # and the connections carry no stray reply
        assert await store.release(record, f"o{i}")


async def test_noscript_for_a_whole_batch(
    loaded: tuple[AsyncRedisStore, Recording], prefix: str
) -> None:
    store, sender = loaded
    await store.client.script_flush()
    records = _records(prefix, 50)
    claims = await _at_once(
        *(store.claim(r, b"fp", owner=f"o{i}", heartbeat=False) for i, r in enumerate(records))
    )
    assert [c.owner for c in claims] == [f"o{i}" for i in range(50)]  # type: ignore[union-attr]
    assert max(sender.sizes) > 1


async def _drop_one_read(
    monkeypatch: pytest.MonkeyPatch, client: redis.asyncio.Redis, at: int
) -> None:
    """The ``at``-th reply read in a batch finds its connection dropped, once."""
    reads = [0]
    read = redis.asyncio.Connection.read_response
    # Connections made before, so that no handshake's reply is counted: the call sent alone
    # and the batch each take one.
    pool = client.connection_pool
    made = [await pool.get_connection(), await pool.get_connection()]
    for conn in made:
        await pool.release(conn)

    async def dropping(conn: Any, *args: Any, **kwargs: Any) -> Any:
        reads[0] += 1
        if reads[0] == at:
            await conn.disconnect()
            raise redis.ConnectionError("dropped under the read")
        return await read(conn, *args, **kwargs)

    monkeypatch.setattr(redis.asyncio.Connection, "read_response", dropping)


async def _claim_all(store: AsyncRedisStore, records: list[Record], sender: Recording) -> None:
    """Claims of every record at once, the first one alone and the rest in one batch."""
    # All made in one loop iteration: the first call is sent alone, the others wait for it
    # and go out together.
    claims = await _at_once(
        *(store.claim(r, b"fp", owner=f"o{i}", heartbeat=False) for i, r in enumerate(records))
    )
    assert [c.owner for c in claims] == [f"o{i}" for i in range(len(records))]  # type: ignore[union-attr]
    assert sender.sizes == [len(records) - 1]


async def test_a_dropped_connection_resends_only_the_unanswered_calls(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection drops at the 1 + 5th reply (the batch's fifth): the client's retry policy
    (one retry) reconnects and sends the batch's calls from the fifth on, once; the first four
    keep their replies, and the store's own re-send is never needed."""
    client = redis.asyncio.Redis.from_url(redis_url, retry=Retry(NoBackoff(), 1))
    store, sender = _store(client, prefix)
    records = _records(prefix, 20)
    try:
        await store.release(records[0], "nobody")  # connected, the release script loaded
        for script in store._scripts.values():
            await client.script_load(script.script)
        monkeypatch.setattr(store, "_eval_again", None)  # not the store's re-send: the client's
        before = await _evalsha_calls(client)
        await _drop_one_read(monkeypatch, client, at=1 + 5)
        await _claim_all(store, records, sender)
        monkeypatch.undo()
        # 20 claims, and the 19 - 4 the batch sent again (stats: one EVALSHA more, INFO none)
        assert await _evalsha_calls(client) - before == 20 + 15
    finally:
        await store.aclose()
        await client.aclose()


async def test_a_dropped_connection_without_retries_fails_each_unanswered_call(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No retry left: each call not yet answered gets the ConnectionError, and each is then sent
    again by the store alone (``_eval_again``), as a single call would be."""
    client = redis.asyncio.Redis.from_url(redis_url, retry=Retry(NoBackoff(), 0))
    store, sender = _store(client, prefix)
    records = _records(prefix, 20)
    again: list[str] = []
    eval_again = store._eval_again

    async def counted(name: str, keys_and_args: Any) -> Any:
        again.append(str(keys_and_args[2]))  # (record, fingerprint, owner, ...)
        return await eval_again(name, keys_and_args)

    try:
        for script in store._scripts.values():
            await client.script_load(script.script)
        await store.release(records[0], "nobody")
        monkeypatch.setattr(store, "_eval_again", counted)
        await _drop_one_read(monkeypatch, client, at=1 + 5)
        await _claim_all(store, records, sender)
        assert again == [f"o{i}" for i in range(5, 20)]
    finally:
        await store.aclose()
        await client.aclose()


async def test_a_timeout_fails_the_batch_and_leaves_no_stray_reply(
    private_redis_server: Any, prefix: str
) -> None:
    """A server that stops answering: every call of the batch ends with the connection's
    ``socket_timeout`` as a StoreError, within a deadline; once it answers again, every call
    gets its own answer (no connection went back to the pool with replies left unread)."""
    client = private_redis_server.async_client(socket_timeout=0.3, retry=Retry(NoBackoff(), 0))
    store, sender = _store(client, prefix)
    records = _records(prefix, 30)
    try:
        await store.release(records[0], "nobody")
        for script in store._scripts.values():
            await client.script_load(script.script)
        private_redis_server.pause()
        started = time.monotonic()
        try:
            outcomes = await _at_once(
                *(store.release(r, f"o{i}") for i, r in enumerate(records)),
                return_exceptions=True,
            )
            # Before the late replies can arrive: no connection that timed out is kept.
            pooled = client.connection_pool._available_connections
            assert [c for c in pooled if c.is_connected] == []
        finally:
            private_redis_server.resume()
        assert time.monotonic() - started < 5
        assert all(isinstance(o, StoreError) and "Timeout" in str(o) for o in outcomes)
        assert max(sender.sizes) > 1
        claims = await _at_once(
            *(store.claim(r, b"fp", owner=f"o{i}", heartbeat=False) for i, r in enumerate(records))
        )
        assert [c.owner for c in claims] == [f"o{i}" for i in range(30)]  # type: ignore[union-attr]
        releases = await _at_once(*(store.release(r, f"o{i}") for i, r in enumerate(records)))
        assert releases == [True] * 30
    finally:
        await store.aclose()
        await client.aclose()


async def test_a_cancelled_caller_leaves_the_batch_alone(
    loaded: tuple[AsyncRedisStore, Recording], prefix: str
) -> None:
    """A caller cancelled before its batch is sent: its call is left out (nothing written), and
    the other calls of the batch get their answers."""
    store, sender = loaded
    records = _records(prefix, 10)
    tasks = [
        asyncio.ensure_future(store.claim(r, b"fp", owner=f"o{i}", heartbeat=False))
        for i, r in enumerate(records)
    ]
    await asyncio.sleep(0)  # each task has made its call: the first sent, the rest waiting
    tasks[4].cancel()
    outcomes = await _at_once(*tasks, return_exceptions=True)
    assert isinstance(outcomes[4], asyncio.CancelledError)
    kept = [o for i, o in enumerate(outcomes) if i != 4]
    assert [c.owner for c in kept] == [f"o{i}" for i in range(10) if i != 4]  # type: ignore[union-attr]
    assert sender.sizes == [8]
    assert not await store.client.exists(records[4].key)


def test_a_new_event_loop_after_one_that_died_mid_call(redis_url: str, prefix: str) -> None:
    """The batch state belongs to one event loop. A loop closed while a call was in flight (a
    worker's ``asyncio.run`` job that returned early) leaves that call counted there: on the
    next loop a call alone is still sent at once, calls at once still share batches, and the
    dead call's coroutine, closed later (as when it is collected), changes nothing here."""
    client = redis.asyncio.Redis.from_url(redis_url)
    store, sender = _store(client, prefix)
    dead = asyncio.new_event_loop()
    stuck: list[asyncio.Task[Any]] = []

    async def start() -> None:
        record = _records(prefix + "dead", 1)[0]
        stuck.append(asyncio.ensure_future(store.claim(record, b"fp", heartbeat=False)))
        await asyncio.sleep(0)  # the call is on its way; the loop closes before its reply

    dead.run_until_complete(start())
    dead.close()

    async def alone(records: list[Record]) -> None:
        for i, record in enumerate(records):
            claimed = await store.claim(record, b"fp", owner=f"o{i}", heartbeat=False)
            assert claimed.owner == f"o{i}"  # type: ignore[union-attr]

    async def later() -> None:
        await alone(_records(prefix + "a", 5))
        assert sender.sizes == []  # not waiting behind the dead loop's call
        stuck.pop().get_coro().close()  # type: ignore[union-attr]
        await alone(_records(prefix + "b", 5))
        assert sender.sizes == []
        records = _records(prefix + "c", 30)
        claims = await _at_once(
            *(store.claim(r, b"fp", owner=f"o{i}", heartbeat=False) for i, r in enumerate(records))
        )
        assert [c.owner for c in claims] == [f"o{i}" for i in range(30)]  # type: ignore[union-attr]
        assert sender.sizes == [29]
        await store.aclose()
        await client.aclose()

    asyncio.run(later())
