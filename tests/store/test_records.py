"""store.records() and store.record(): every state, the filters, sync and asyncio, real Redis.

Records are made the way users make them (guard() and the HTTP middleware through a real
server), then listed; the 100 000-record keyspace checks memory stays bounded by a page.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio

from idemkey import AsyncRedisStore, Policy, RedisStore, aguard, guard
from idemkey._core import record_for, record_origin
from idemkey.errors import ConfigurationError, InvalidKeyError, StoreError
from idemkey.store import RecordStatus
from tests._lease import lease_left
from tests._pages import ROOT, run_twice
from tests._servers import RedisServer, no_retry, wait_until

pytestmark = pytest.mark.redis


def hold(enter: Callable[[], object]) -> None:
    """Enter a guard in a thread of its own and leave it entered, as a worker busy with it:
    the store's heartbeat keeps its lease, and this thread's current call stays unset."""
    thread = threading.Thread(target=enter)
    thread.start()
    thread.join(30)


def seed_every_state(store: RedisStore) -> dict[str, str]:
    """One guard() record per state, and one claimed as the HTTP driver claims; returns
    state -> key."""
    with guard(store, "done", payload={"a": 1}) as call:
        call.save("ok")
    with contextlib.suppress(RuntimeError), guard(store, "failed", payload={"a": 1}) as call:
        call.step("charge", lambda: 42)
        raise RuntimeError("after a step")
    hold(lambda: guard(store, "held", payload={"a": 1}).__enter__().step("sent", lambda: "yes"))
    # An HTTP request in flight, claimed as the driver claims it (with its origin).
    http = record_for(store.policy.prefix, "acct_1", "POST", "/charges", "h1")
    store.claim(http, "fp", heartbeat=False, origin=record_origin("acct_1", "POST", "/charges"))
    # A lapsed lease: the claim of a crashed owner (no heartbeat, a short lease).
    crashed = record_for(store.policy.prefix, "", "GUARD", "", "crashed")
    store.claim(crashed, "fp", lease_ms=50, heartbeat=False, origin=record_origin("", "GUARD", ""))
    wait_until(lambda: lease_left(store.client, crashed) == -2, 10, "the crashed lease to lapse")
    return {"complete": "done", "released": "failed", "in_progress": "held", "lapsed": "crashed"}


def test_records_of_every_state(real_client: redis.Redis, prefix: str) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix))
    try:
        keys = seed_every_state(store)
        listed = list(store.records())
        assert sorted(s.state for s in listed) == sorted(
            ["complete", "released", "in_progress", "in_progress", "lapsed"]
        )
        found = {s.state: s for s in listed if s.route != "/charges"}
        for state, key in keys.items():
            one = store.record(key)
            assert one is not None, key
            assert one.state == state, (key, one)
            assert one.key == found[state].key
        held = found["in_progress"]
        assert held.route == ""
        assert held.method == "GUARD"
        assert held.scope == ""
        assert held.steps == ("sent",)
        assert held.fence is not None
        assert held.fence > 10**15  # the server's clock in microseconds, at least
        assert held.owner
        assert held.lease_left is not None
        assert 0 < held.lease_left <= 30
        assert held.age is not None
        assert 0 <= held.age < 60
        assert held.ttl_left is not None
        assert held.ttl_left > 0
        assert found["released"].steps == ("charge",)
        assert found["released"].lease_left is None
        assert found["complete"].fence is None
        assert found["complete"].steps == ()
        assert found["lapsed"].lease_left is None
        assert found["lapsed"].owner
        # Filters: state (one or several), route, scope, limit.
        assert [s.state for s in store.records(state="lapsed")] == ["lapsed"]
        both = {s.state for s in store.records(state=("in_progress", "lapsed"))}
        assert both == {"in_progress", "lapsed"}
        (http,) = store.records(route="/charges")
        assert (http.method, http.scope, http.state) == ("POST", "acct_1", "in_progress")
        assert store.record("h1", scope="acct_1", method="POST", route="/charges").key == http.key
        assert len(list(store.records(scope="", limit=2))) == 2
        assert list(store.records(scope="tenant-nobody")) == []
        assert store.record("never-used") is None
        with pytest.raises(ConfigurationError, match="unknown record state"):
            list(store.records(state="stuck"))
    finally:
        store.close()


async def test_async_records_and_record(
    real_async_client: redis.asyncio.Redis, prefix: str
) -> None:
    store = AsyncRedisStore(real_async_client, Policy(prefix=prefix))
    try:
        async with aguard(store, "a1", payload=1, scope="acct_9") as call:
            call.save({"id": 1})
        entered = aguard(store, "a2", payload=1, scope="acct_9")
        held = await entered.__aenter__()
        listed = [status async for status in store.records()]
        assert sorted(s.state for s in listed) == ["complete", "in_progress"]
        (held_status,) = [status async for status in store.records(scope="acct_9")]
        assert held_status.state == "in_progress"
        one = await store.record("a2", scope="acct_9")
        assert isinstance(one, RecordStatus)
        assert one.state == "in_progress"
        # A completed record drops its origin (its memory goal): no scope to filter by.
        assert [s.scope async for s in store.records(state="complete")] == [""]
        held.save({"id": 2})
        await entered.__aexit__(None, None, None)
        done = await store.record("a2", scope="acct_9")
        assert done is not None
        assert done.state == "complete"
    finally:
        await store.aclose()


def test_a_claim_is_timed_by_the_server_clock(
    real_client: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The origin's time is the claim script's (the clock of the lease and the fence): a client
    whose clock is a day off still shows the record's true age, and a claim formats no time."""
    store = RedisStore(real_client, Policy(prefix=prefix))
    try:
        record = record_for(prefix, "acct_1", "POST", "/charges", "late-clock")
        day_behind = time.time() - 86_400
        with monkeypatch.context() as patched:
            patched.setattr(time, "time", lambda: day_behind)
            store.claim(record, "fp", heartbeat=False, origin=record_origin("acct_1", "POST", "/c"))
        seconds, micros = real_client.time()
        stamped = int(real_client.hget(record.record_key, "i").split(b" ", 1)[0])
        assert abs(stamped - (seconds * 1000 + micros // 1000)) < 60_000
        listed = store.record("late-clock", scope="acct_1", method="POST", route="/charges")
        assert listed is not None
        assert listed.age is not None
        assert 0 <= listed.age < 60
    finally:
        store.close()


def test_store_down_is_a_store_error(prefix: str) -> None:
    client = redis.Redis(port=1, socket_connect_timeout=0.5, retry=no_retry())
    store = RedisStore(client, Policy(prefix=prefix))
    try:
        with pytest.raises(StoreError):
            list(store.records())
        with pytest.raises(StoreError):
            store.record("k")
    finally:
        store.close()


def seed(client: Any, prefix: str, n: int) -> None:
    """``n`` completed records and a few in progress, written with pipelines (as claim.lua and
    complete.lua leave them)."""
    pipe = client.pipeline(transaction=False)
    now = int(time.time() * 1000)
    for i in range(n):
        name = f"{prefix}:{{{i:032x}}}"
        if i % 1000 == 0:
            pipe.hset(name, mapping={"state": "in_progress", "fence": 1, "owner": "o" * 32,
                                     "fp": "f", "i": f"{now} POST /charges\nacct",
                                     "lease": now + 600_000})  # fmt: skip
        else:
            pipe.hset(name, mapping={"fp": "f" * 28, "resp": b"\x01" + b"x" * 200})
        pipe.pexpire(name, 600_000)
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()


@pytest.mark.slow
def test_hundred_thousand_records_bounded_memory(real_client: redis.Redis, prefix: str) -> None:
    n = 100_000
    seed(real_client, prefix, n)
    store = RedisStore(real_client, Policy(prefix=prefix))
    try:
        tracemalloc.start()
        counted, in_progress = 0, 0
        for status in store.records():
            counted += 1
            in_progress += status.state == "in_progress"
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert counted == n
        assert in_progress == n // 1000
        # One page (1000 records) decoded at a time: a few MB; all 100 000 kept would be ~50 MB.
        assert peak < 8_000_000, f"peak {peak} bytes"
        assert len(list(store.records(state="in_progress", limit=7))) == 7
    finally:
        store.close()


def test_operators_page(
    private_redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/operators.md's status API sample, run as printed, then again: the same record
    (claimed again by the second run's job, so its fence is higher), and one uncertain entry
    more, as the page says (the stream keeps each run's, newest first)."""
    ((block,), (again,)) = run_twice("docs/operators.md", private_redis_server.url)
    out = capsys.readouterr().out.splitlines()
    listed = r"released GUARD \('reserve',\) (\d{16}) ([0-9a-f]{32})"
    entry = (
        "released_with_steps ('reserve',) -> retry with the same key, or compensate the "
        "finished steps"
    )
    assert [re.sub(listed, "listed", line) for line in out] == [
        "listed",
        "released ('reserve',)",
        entry,
        # The second run:
        "listed",
        "released ('reserve',)",
        entry,
        entry,
    ]
    (first_fence, digest), (second_fence, same) = re.findall(listed, "\n".join(out))
    assert same == digest
    assert int(second_fence) > int(first_fence)
    assert block["one"].scope == again["one"].scope == "acct_42"
    page = " ".join((ROOT / "docs" / "operators.md").read_text("utf-8").split())
    said = re.findall(
        r"Run again, it prints the same record with a higher fence \(.+?\), and "
        r"(\w+) `released_with_steps` entries",
        page,
    )
    assert said == ["two"], "the page says what a second run prints"


def test_a_scope_with_a_lone_surrogate_is_guarded_and_listed(
    real_client: redis.Redis, prefix: str
) -> None:
    """A scope made from undecodable bytes: the claim's origin text is sent escaped (2ba1d64
    raised UnicodeEncodeError from the client's strict encoding), the record listed with it,
    and a retry replays the same record."""
    store = RedisStore(real_client, Policy(prefix=prefix))
    scope = "tenant-\udcff"
    with guard(store, "k", scope=scope) as call:
        assert not call.replayed
        (listed,) = [s for s in store.records() if s.state == "in_progress"]
        assert listed.scope == "tenant-\\udcff"
        call.save(1)
    with guard(store, "k", scope=scope) as again:
        assert again.replayed
        assert again.result == 1


def test_a_path_with_line_breaks_is_listed_under_its_own_tenant(
    real_client: redis.Redis, prefix: str
) -> None:
    """A keyed POST to /charges%0Atenant-acme%0A... by tenant-mallory: while it runs, its claim
    is listed with its own path and scope, not as another tenant's (the origin is line-based)."""
    from werkzeug.test import Client
    from werkzeug.wrappers import Request, Response

    from idemkey.adapters.wsgi import IdempotencyMiddleware

    path = "/charges%0Atenant-acme%0Ak:forged;"  # listed as sent
    store = RedisStore(
        real_client, Policy(prefix=prefix, scope=lambda r: r.headers.get("Account", ""))
    )
    seen: list[list[tuple[str, str]]] = []

    @Request.application
    def app(request: Request) -> Response:
        seen.append([(s.route, s.scope) for s in store.records(scope="tenant-mallory")])
        seen.append([(s.route, s.scope) for s in store.records(route=request.path)])
        # Never listed as the tenant or the route its path names.
        seen.append([(s.route, s.scope) for s in store.records(scope="tenant-acme")])
        seen.append([(s.route, s.scope) for s in store.records(route="/charges")])
        return Response("ok", status=201)

    client = Client(IdempotencyMiddleware(app, store))
    headers = {"Idempotency-Key": "k1", "Account": "tenant-mallory"}
    assert client.post("/charges%0Atenant-acme%0Ak:forged;", headers=headers).status_code == 201
    assert seen == [[(path, "tenant-mallory")]] * 2 + [[], []]  # found by its own path only


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"key": b"k"}, InvalidKeyError),
        ({"key": 5}, InvalidKeyError),
        ({"key": None}, InvalidKeyError),
        ({"key": ""}, InvalidKeyError),
        ({"key": "k", "scope": b"s"}, ConfigurationError),
        ({"key": "k", "route": None}, ConfigurationError),
        ({"key": "k", "method": 5}, ConfigurationError),
        ({"key": "k", "method": "\udcff"}, ConfigurationError),
    ],
    ids=["bytes", "int", "none", "empty", "scope-bytes", "route-none", "method-int", "surrogate"],
)
async def test_record_refuses_a_name_no_adapter_gives_typed(
    real_client: redis.Redis, redis_url: str, prefix: str, arguments: dict[str, Any], error: type
) -> None:
    """``store.record()`` with a key or a part that is no str: a typed error, as ``guard()``
    gives, where it was an AttributeError (or UnicodeEncodeError) from the record's digest."""
    store = RedisStore(real_client, Policy(prefix=prefix))
    with pytest.raises(error):
        store.record(**arguments)
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        with pytest.raises(error):
            await AsyncRedisStore(client, Policy(prefix=prefix)).record(**arguments)
    finally:
        await client.aclose()
