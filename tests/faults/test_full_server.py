"""A full server (``maxmemory`` with ``noeviction``) refuses a takeover as it refuses a new claim.

Redis refuses a script's write for a full server only while the script has written nothing.
claim.lua once deleted the done stream and the old origin before its HSET, so a retry took over
a lapsed claim through a server that refused the owner's renewal, and the work ran twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis
from werkzeug.test import Client
from werkzeug.wrappers import Request, Response

from idemkey import Policy, RedisStore, guard
from idemkey._core import fingerprint, payload_fingerprint, record_origin
from idemkey.adapters.wsgi import IdempotencyMiddleware
from idemkey.errors import StoreError
from idemkey.records import GUARD_METHOD, record_for
from tests._lease import lease_left
from tests._servers import RedisServer, wait_until

pytestmark = pytest.mark.redis


@pytest.fixture
def full_later(redis_server_factory: Callable[..., RedisServer]) -> Iterator[redis.Redis]:
    client = redis_server_factory(["--maxmemory-policy", "noeviction"]).client(socket_timeout=5)
    try:
        yield client
    finally:
        client.close()


def lapsed_claim(store: RedisStore, key: str, *, released: bool = False) -> str:
    """A claim of ``guard(store, key, payload=b"x")`` whose owner crashed (or failed)."""
    record = record_for(store.policy.prefix, "", GUARD_METHOD, "", key)
    origin = record_origin("", GUARD_METHOD, "", key)
    fp = payload_fingerprint(b"x")
    claimed = store.claim(record, fp, lease_ms=50, heartbeat=False, origin=origin)
    if released:
        store.release(record, claimed.owner)
    else:
        wait_until(lambda: lease_left(store.client, record) == -2, 10, "the lease to lapse")
    owner = store.client.hget(record.key, "owner")
    return owner.decode() if owner else ""


@pytest.mark.parametrize("released", [False, True], ids=["lapsed", "released"])
def test_a_full_server_refuses_a_takeover_and_keeps_the_record(
    full_later: redis.Redis, prefix: str, released: bool
) -> None:
    store = RedisStore(full_later, Policy(prefix=prefix))
    before = lapsed_claim(store, "charge-1", released=released)
    record = record_for(prefix, "", GUARD_METHOD, "", "charge-1")
    fields = full_later.hgetall(record.key)
    full_later.config_set("maxmemory", 1)
    try:
        ran: list[str] = []

        def duplicate() -> None:
            with guard(store, "charge-1", payload=b"x") as call:
                ran.append("duplicate")
                call.save(1)

        with pytest.raises(StoreError, match=r"OOM|memory"):
            duplicate()
        assert ran == []
        assert full_later.hgetall(record.key) == fields  # nothing written, the owner kept
    finally:
        full_later.config_set("maxmemory", 0)
    owner = (full_later.hget(record.key, "owner") or b"").decode()
    assert owner == before


def test_a_retry_to_a_full_server_is_503_and_the_handler_does_not_run(
    full_later: redis.Redis, prefix: str
) -> None:
    store = RedisStore(full_later, Policy(prefix=prefix, lease=0.3))
    runs: list[int] = []

    @Request.application
    def app(request: Request) -> Response:
        runs.append(1)
        return Response("charged", status=201)

    record = record_for(prefix, "k-scope", "POST", "/charges", "k1")
    fp = fingerprint("POST", "/charges", "", "", b"")  # the retry's: no body
    store.claim(record, fp, lease_ms=50, heartbeat=False, origin="POST /charges\nk-scope")
    wait_until(lambda: lease_left(full_later, record) == -2, 10, "the lease to lapse")
    full_later.config_set("maxmemory", 1)
    try:
        middleware = IdempotencyMiddleware(
            app, RedisStore(full_later, Policy(prefix=prefix, scope=lambda r: "k-scope"))
        )
        answer = Client(middleware).post("/charges", headers={"Idempotency-Key": "k1"})
        assert answer.status_code == 503, answer.get_data()
        assert runs == []
    finally:
        full_later.config_set("maxmemory", 0)
