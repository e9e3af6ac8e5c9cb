"""guard() and @idempotent at their edges (issue 9 item 4, issue 10 items 4, 5 and 12).

Every test runs on RedisStore and AsyncRedisStore, on the real session server and on fakeredis.
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from decimal import Decimal
from typing import Any

import msgspec
import pytest
import redis

from idemkey import (
    AsyncRedisStore,
    ConfigurationError,
    Event,
    IdemkeyError,
    NoResultError,
    Outcome,
    Policy,
    RecordFormatError,
    RedisStore,
    ResultNotStorableError,
    StoreError,
    UsageError,
    aguard,
    guard,
    idempotent,
)
from idemkey._core import record_state
from idemkey.records import (
    Claimed,
    InFlight,
    Mismatch,
    Replay,
    new_owner,
    payload_fingerprint,
    record_for,
)
from tests._servers import free_port, no_async_retry, no_retry
from tests.store._both import AsyncStore, Both, SyncStore, _resolve


@dataclasses.dataclass(frozen=True)
class Shipment:
    order_id: int
    carrier: str


class Label(msgspec.Struct, frozen=True):
    tracking: str
    weight: Decimal


def decorate(store: Both, func: Any, **kwargs: Any) -> Any:
    """``@idempotent(store.store, **kwargs)`` on ``func``, for a test that awaits the result."""
    return store.idempotent(func, **kwargs)


# Module-level functions: their default record name (module.qualname) names them alone.
def charge_order(order_id: int) -> str:
    return f"charged {order_id}"


def ship_order(order_id: int) -> str:
    return f"shipped {order_id}"


class EdgeBehaviour:
    # ---- issue 10 item 4: one namespace per function -------------------------------------

    async def test_two_functions_with_the_same_key_never_share_records(self, store: Both) -> None:
        charge_once = decorate(store, charge_order, key=str, outcome=True)
        ship_once = decorate(store, ship_order, key=str, outcome=True)
        assert await charge_once(42) == Outcome("charged 42", replayed=False)
        # on main: "charged 42", ship never ran
        assert await ship_once(42) == Outcome("shipped 42", replayed=False)
        assert await charge_once(42) == Outcome("charged 42", replayed=True)
        assert await ship_once(42) == Outcome("shipped 42", replayed=True)

    async def test_events_of_a_decorated_function_name_it(self, store: Both) -> None:
        events: list[Event] = []
        once = decorate(
            store, charge_order, key=str, policy=store.store.policy.replace(on_event=events.append)
        )
        await once(1)
        await once(1)
        assert [event.kind for event in events] == ["claimed", "completed", "replayed"]
        assert {event.route for event in events} == {f"{__name__}.charge_order"}

    async def test_an_explicit_name_keeps_the_records_of_a_renamed_function(
        self, store: Both
    ) -> None:
        ran: list[str] = []

        def charge(order_id: int) -> str:
            ran.append("old")
            return "charged"

        def bill(order_id: int) -> str:  # the same work, renamed
            ran.append("new")
            return "billed"

        old = decorate(store, charge, key=str, name="billing.charge")
        new = decorate(store, bill, key=str, name="billing.charge")
        assert await old(7) == "charged"
        assert await new(7) == "charged"  # replayed: the renamed function does not run again
        assert ran == ["old"]

    # ---- issue 10 item 5: a result that cannot be stored -----------------------------------

    @pytest.mark.parametrize("result", [object(), 2**70, -(2**70)], ids=["object", "big", "neg"])
    async def test_an_unstorable_result_runs_once_and_every_retry_is_told(
        self, store: Both, result: object
    ) -> None:
        ran: list[int] = []

        def send_email(order_id: int) -> object:
            ran.append(order_id)
            return result

        once = decorate(store, send_email, key=lambda order_id: f"mail:{order_id}", name="mail")
        with pytest.raises(ResultNotStorableError) as first:
            await once(1)
        assert first.value.key == "mail:1"
        for _ in range(2):  # on main: the key was released and every retry sent another email
            with pytest.raises(ResultNotStorableError) as retry:
                await once(1)
            assert retry.value.key == "mail:1"
        assert ran == [1]

    async def test_save_of_an_unstorable_value_completes_the_record_as_not_kept(
        self, store: Both
    ) -> None:
        with pytest.raises(ResultNotStorableError):
            async with store.guard("job:1") as call:
                call.save(object())
        record = store.guard_record("job:1")
        assert await store.lock_holder(record) is None  # completed, not held, not released
        assert record_state(await store.hash(record)) == "complete"
        with pytest.raises(ResultNotStorableError, match="job:1"):
            async with store.guard("job:1"):
                pytest.fail("the block ran again")

    @pytest.mark.parametrize(
        "payload", [2**70, {1: "a"}, {"items": {(1, 2): 3}}], ids=["big-int", "int-key", "nested"]
    )
    async def test_an_unfingerprintable_payload_is_refused_before_anything_runs(
        self, store: Both, payload: object
    ) -> None:
        ran: list[object] = []

        def job(data: object) -> str:
            ran.append(data)
            return "ok"

        once = decorate(store, job, key=lambda data: "job", name="job")
        with pytest.raises(ConfigurationError, match="cannot fingerprint"):
            await once(payload)
        with pytest.raises(ConfigurationError, match="cannot fingerprint"):
            async with store.guard("job", payload=payload):
                pytest.fail("the block ran")
        assert ran == []
        assert await store.keys() == []  # nothing claimed

    # ---- issue 10 item 12: methods and result types ----------------------------------------

    async def test_a_method_leaves_self_out_and_replays_its_dataclass(self, store: Both) -> None:
        ran: list[int] = []
        if store.is_async:

            class AsyncWarehouse:
                @idempotent(store.store, key=lambda self, order_id: f"ship:{order_id}", name="ship")
                async def ship(self, order_id: int) -> Shipment:
                    ran.append(order_id)
                    return Shipment(order_id, "ups")

            warehouse: Any = AsyncWarehouse()
        else:

            class Warehouse:
                @idempotent(store.store, key=lambda self, order_id: f"ship:{order_id}", name="ship")
                def ship(self, order_id: int) -> Shipment:
                    ran.append(order_id)
                    return Shipment(order_id, "ups")

            warehouse = Warehouse()

        async def ship(order_id: int) -> Shipment:
            result = warehouse.ship(order_id)
            return await result if store.is_async else result  # type: ignore[no-any-return]

        first = await ship(9)  # on main: ConfigurationError, "cannot fingerprint ... dict"
        again = await ship(9)
        assert first == again == Shipment(9, "ups")
        assert type(again) is Shipment  # on main: a dict
        assert ran == [9]

    async def test_a_classmethod_leaves_cls_out(self, store: Both) -> None:
        ran: list[int] = []
        if store.is_async:

            class AsyncLedger:
                @classmethod
                @idempotent(store.store, key=lambda cls, n: f"post:{n}", name="post")
                async def post(cls, n: int) -> int:
                    ran.append(n)
                    return n * 2

            assert await AsyncLedger.post(3) == await AsyncLedger.post(3) == 6
        else:

            class Ledger:
                @classmethod
                @idempotent(store.store, key=lambda cls, n: f"post:{n}", name="post")
                def post(cls, n: int) -> int:
                    ran.append(n)
                    return n * 2

            assert Ledger.post(3) == Ledger.post(3) == 6
        assert ran == [3]

    async def test_a_replay_has_the_type_of_the_return_annotation(self, store: Both) -> None:
        when = datetime.datetime(2026, 11, 30, 21, 0, tzinfo=datetime.timezone.utc)
        ident = uuid.UUID("12345678-1234-5678-1234-567812345678")

        def quote(n: int) -> tuple[int, datetime.datetime, Decimal, uuid.UUID, Label]:
            return (n, when, Decimal("10.50"), ident, Label("1Z", Decimal("2.5")))

        once = decorate(store, quote, key=lambda n: f"quote:{n}", name="quote")
        first = await once(1)
        replayed = await once(1)
        assert replayed == first
        # on main: a list of [int, str, str, str, dict]
        assert [type(part) for part in replayed] == [
            int,
            datetime.datetime,
            Decimal,
            uuid.UUID,
            Label,
        ]

    async def test_the_longest_ttl_and_lease_are_written_and_expire(self, store: Both) -> None:
        # audit 53: on main ttl=1e14 passed Policy; claim.lua's PEXPIRE then failed after its
        # HSET (Lua wrote 1e+17), leaving an in-progress record that never expired. The longest
        # durations Policy takes now are ones every script writes.
        from idemkey._options import MAX_SECONDS

        longest = store.store.policy.replace(ttl=MAX_SECONDS, lease=MAX_SECONDS - 1)
        async with store.guard("k", policy=longest) as call:
            assert await store.lease_left(store.guard_record("k")) > (MAX_SECONDS - 2) * 1000
            call.save(1)
        async with store.guard("k", policy=longest) as again:
            assert again.replayed
        assert await store.pttl(store.guard_record("k").key) > (MAX_SECONDS - 60) * 1000

    # ---- issue 9 item 4: errors and policies ----------------------------------------------

    async def test_misuse_raises_idemkey_errors(self, store: Both) -> None:
        async with store.guard("k") as call:
            with pytest.raises(NoResultError):
                _ = call.result
            call.save(1)
        async with store.guard("k") as again:
            with pytest.raises(UsageError):
                again.save(2)
        with pytest.raises(ConfigurationError, match="scope"):
            async with store.guard("k", scope=7):
                pytest.fail("the block ran")
        with pytest.raises(ConfigurationError, match="policy must be a Policy"):
            async with store.guard("k", policy="strict"):
                pytest.fail("the block ran")
        with pytest.raises(ConfigurationError, match="key= and payload="):
            idempotent(store.store, key="order")  # type: ignore[call-overload]
        wrong_guard: Any = guard if store.is_async else aguard  # the other kind's
        with pytest.raises(ConfigurationError, match="takes a store of type"):
            wrong_guard(store.store, "k")
        assert issubclass(NoResultError, IdemkeyError)
        assert issubclass(UsageError, IdemkeyError)

    @pytest.mark.parametrize(
        "change",
        [
            {"methods": frozenset({"PUT"})},
            {"require_key": False},
            {"strict_header": True},
            {"header": "X-Key"},
            {"max_request_bytes": 10},
            {"max_response_bytes": 10},
            {"store_error_retry_after": 5.0},
            {"scope": lambda request: "tenant"},
            {"mismatch_status": 400},
            {"store_server_errors": True},
            {"release_statuses": frozenset({400})},
            {"header_denylist": frozenset()},
            {"header_allowlist": frozenset({"etag"})},
        ],
        ids=lambda change: next(iter(change)),
    )
    async def test_a_guard_policy_with_an_http_only_field_is_refused(
        self, store: Both, change: dict[str, Any]
    ) -> None:
        (field,) = change
        with pytest.raises(ConfigurationError, match=f"Policy.{field} applies to HTTP"):
            async with store.guard("k", policy=store.store.policy.replace(**change)):
                pytest.fail("the block ran")
        assert await store.keys() == []

    async def test_a_policy_shared_with_the_adapters_is_accepted(self, store: Both) -> None:
        shared = store.store.policy.replace(methods=frozenset({"PUT"}), mismatch_status=400)
        kind = AsyncRedisStore if store.is_async else RedisStore
        other = Both(kind(store.client, shared), store.prefix)  # the store holds the same policy
        async with other.guard("k", policy=shared.replace(wait=1.0)) as call:
            call.save("ok")
        async with other.guard("k") as again:
            assert again.result == "ok"

    async def test_the_extension_surface_drives_the_store(self, store: Both) -> None:
        """What idemkey.records documents: claim, work, complete; then replay and mismatch."""
        record = record_for(store.prefix, "tenant-7", "JOB", "send-invoice", "inv-1")
        owner = new_owner()
        decision = await store.claim(record, payload_fingerprint(b"body"), owner=owner)
        assert decision == Claimed(owner, decision.fence, False)
        busy = await store.claim(record, payload_fingerprint(b"body"))
        assert type(busy) is InFlight
        assert await store.complete(record, owner, b"answer")
        assert await store.claim(record, payload_fingerprint(b"body")) == Replay(b"answer")
        assert type(await store.claim(record, payload_fingerprint(b"other"))) is Mismatch

    # ---- a record the claim cannot read: never a run beside it, whatever on_store_error ----

    @pytest.mark.parametrize("mode", ["closed", "open"])
    async def test_a_step_name_that_is_not_utf8_is_refused_even_when_open(
        self, store: Both, mode: str
    ) -> None:
        # A released record with a finished step whose name no str gives (forged or damaged):
        # Redis answered, so it is no store failure to run the block beside ("open" included),
        # as the HTTP adapters answer 503 record_unreadable for it.
        events: list[Event] = []
        policy = store.store.policy.replace(on_store_error=mode, on_event=events.append)
        record = store.guard_record("job-1")
        fields = {"fence": "5", "f0": "5", "fp": payload_fingerprint(b"p"), "ns": "1"}
        await _resolve(store.client.hset(record.key, mapping={**fields, b"s:\xff": b"\x01\xc0"}))
        for _ in range(3):  # each retry alike: the refused claim was given back
            with pytest.raises(RecordFormatError, match="not UTF-8"):
                async with store.guard("job-1", payload=b"p", policy=policy):
                    pytest.fail("the block ran beside a record idemkey cannot read")
        assert [event.kind for event in events] == ["store_error"] * 3
        assert (await store.hash(record)).get(b"owner") is None

    @pytest.mark.parametrize("mode", ["closed", "open"])
    @pytest.mark.parametrize("kind", ["string", "list", "set"])
    async def test_a_key_of_another_type_at_the_record_name_is_unreadable_not_redis_failing(
        self, store: Both, mode: str, kind: str
    ) -> None:
        # A stranger's SET (or damage) where the record should be: claim.lua's read of the hash
        # is refused (WRONGTYPE), which was taken for "Redis failed": "open" ran the block on
        # every retry, "closed" raised a StoreError that a retry never cleared.
        events: list[Event] = []
        policy = store.store.policy.replace(on_store_error=mode, on_event=events.append)
        key = store.guard_record("job-2").key
        write = {"string": ("set", "not a hash"), "list": ("rpush", "a"), "set": ("sadd", "a")}
        method, value = write[kind]
        await _resolve(getattr(store.client, method)(key, value))
        for _ in range(2):
            with pytest.raises(RecordFormatError, match=f"not an idemkey record: a {kind}"):
                async with store.guard("job-2", payload=b"p", policy=policy):
                    pytest.fail("the block ran beside a key idemkey cannot read")
        assert [event.kind for event in events] == ["store_error"] * 2
        assert await _resolve(store.client.type(key)) == kind.encode()  # left as it was
        assert await store.keys() == [key.encode()]  # no hint written beside it


class TestSyncEdges(SyncStore, EdgeBehaviour):
    pass


class TestAsyncEdges(AsyncStore, EdgeBehaviour):
    pass


# ---- on_store_error="open" in guard(): run unprotected ------------------------------------


def _dead_store_policy(events: list[Event], mode: str) -> Policy:
    return Policy(on_event=events.append, on_store_error=mode)  # type: ignore[arg-type]


def test_open_on_store_error_runs_the_block_unprotected() -> None:
    events: list[Event] = []
    dead = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=no_retry())
    store = RedisStore(dead, _dead_store_policy(events, "open"))
    ran = []
    try:
        with guard(store, "charge:1") as call:
            assert call.replayed is False
            assert call.fence is None
            ran.append(1)
            call.save("charged")
        assert call.result == "charged"
    finally:
        store.close()
        dead.close()
    assert ran == [1]
    assert [event.kind for event in events] == ["unprotected"]


async def test_open_on_store_error_runs_the_async_block_unprotected() -> None:
    import redis.asyncio

    events: list[Event] = []
    dead = redis.asyncio.Redis(port=free_port(), socket_connect_timeout=1, retry=no_async_retry())
    store = AsyncRedisStore(dead, _dead_store_policy(events, "open"))
    try:
        async with aguard(store, "charge:1") as call:
            assert call.replayed is False
            call.save("charged")
        with pytest.raises(StoreError):  # closed (the default) still refuses to run
            async with aguard(store, "charge:2", policy=Policy()):
                pytest.fail("the block ran without a claim")
    finally:
        await store.aclose()
        await dead.aclose()
    assert [event.kind for event in events] == ["unprotected"]


@pytest.mark.parametrize("payload", [b"\x00raw", bytearray(b"raw"), "caf\xe9", {"a": [1, 2]}, 7])
def test_a_guard_fingerprints_its_payload_as_records_says(payload: object) -> None:
    # The guard hashes bytes without encode_payload/payload_fingerprint's calls: the
    # fingerprint it sends must stay the public function's, or inspect/claim tools disagree.
    from benchmarks.fakes import FakeClient, first_call_replies
    from idemkey._codec import encode_payload
    from idemkey.records import payload_fingerprint

    store = RedisStore(FakeClient(first_call_replies()), Policy(prefix="fp"))  # type: ignore[arg-type]
    try:
        assert guard(store, "k", payload=payload).fingerprint == payload_fingerprint(
            encode_payload(payload)
        )
    finally:
        store.close()


# ---- audit 53: @idempotent's arguments are checked when it decorates -----------------------


class Declined(Exception):
    pass


def charge_invoice(invoice: int) -> int:
    return invoice


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"name": 5}, r"name=\.\.\.\): expected a non-empty string"),
        ({"name": ""}, r"name=\.\.\.\): expected a non-empty string"),
        ({"scope": None}, r"scope=\.\.\.\): expected a str"),
        ({"policy": "strict"}, r"policy=\.\.\.\): expected a Policy"),
        ({"policy": Policy(header="X-Key")}, r"Policy\.header applies to HTTP requests only"),
        ({"result_type": 5}, r"result_type=5: msgspec cannot decode a result into it"),
        ({"result_type": "int"}, r"result_type='int': msgspec cannot decode a result into it"),
        ({"outcome": "yes"}, r"outcome=\.\.\.\): expected True or False"),
        ({"cache_exceptions": {Declined: None}}, "the fields of Declined must be a tuple"),
        ({"cache_exceptions": {Declined: 5}}, "the fields of Declined must be a tuple"),
    ],
    ids=[
        "name-int",
        "name-empty",
        "scope-none",
        "policy-str",
        "policy-http-field",
        "result-type-5",
        "result-type-str",
        "outcome-str",
        "fields-none",
        "fields-int",
    ],
)
def test_idempotent_refuses_a_bad_argument_when_it_decorates(
    options: dict[str, Any], says: str
) -> None:
    # On main each was accepted: result_type=5 ran and stored the work, then every retry raised
    # ConfigurationError; name=5 was an AttributeError at every call; {E: None} a TypeError.
    client = redis.Redis(port=free_port())  # never reached: nothing is claimed
    store = RedisStore(client)
    try:
        with pytest.raises(ConfigurationError, match=says):
            idempotent(store, key=lambda invoice: str(invoice), **options)(charge_invoice)
    finally:
        store.close()
        client.close()


def make_charger(provider: str, store: RedisStore, sent: list[str], name: str | None) -> Any:
    @idempotent(store, key=lambda order_id: f"order:{order_id}", name=name)
    def charge(order_id: str) -> str:
        sent.append(provider)
        return f"{provider} charged {order_id}"

    return charge


def test_a_function_made_inside_another_needs_a_name() -> None:
    """On main two closures of one factory (and two lambdas) shared module.qualname and so
    their records: paypal's charge was answered with stripe's result and never ran."""
    import fakeredis

    store, sent = RedisStore(fakeredis.FakeRedis()), []
    with pytest.raises(
        ConfigurationError, match=r"needs name= for .*make_charger\.<locals>\.charge"
    ):
        make_charger("stripe", store, sent, None)
    with pytest.raises(ConfigurationError, match=r"needs name= for .*<lambda>"):
        idempotent(store, key=lambda x: str(x))(lambda x: 2 * x)
    stripe = make_charger("stripe", store, sent, "charges.stripe")
    paypal = make_charger("paypal", store, sent, "charges.paypal")
    assert (stripe("1001"), paypal("1001")) == ("stripe charged 1001", "paypal charged 1001")
    assert (stripe("1001"), paypal("1001")) == ("stripe charged 1001", "paypal charged 1001")
    assert sent == ["stripe", "paypal"]
    store.close()


class Charger:
    def __call__(self, order_id: str) -> str:
        return f"charged {order_id}"


def charge_with(provider: str, order_id: str) -> str:
    return f"{provider} charged {order_id}"


def test_a_callable_without_a_qualified_name_needs_a_name() -> None:
    # On main: AttributeError ('functools.partial' object has no attribute '__qualname__').
    import functools

    import fakeredis

    store = RedisStore(fakeredis.FakeRedis())
    for target in (functools.partial(charge_with, "stripe"), Charger()):
        with pytest.raises(ConfigurationError, match="needs name="):
            idempotent(store, key=lambda order_id: order_id)(target)
    partial = idempotent(store, key=lambda order_id: order_id, name="charges.partial")(
        functools.partial(charge_with, "stripe")
    )
    instance = idempotent(store, key=lambda order_id: order_id, name="charges.instance")(Charger())
    assert partial("1") == partial("1") == "stripe charged 1"
    assert instance("1") == instance("1") == "charged 1"
    store.close()


# ---- Ctrl-C (KeyboardInterrupt) in guard() ---------------------------------------------------


def test_a_claim_cut_off_by_ctrl_c_is_released(real_client: redis.Redis, prefix: str) -> None:
    # Redis applied the claim, then KeyboardInterrupt came as its reply was read. Before, the
    # key stayed claimed: every retry got RequestInFlightError until the lease lapsed (60 s).
    store = RedisStore(real_client, Policy(prefix=prefix, lease=60))
    real = store._eval
    interrupted: list[str] = []

    def script_call(name: str, *keys_and_args: str | bytes | int) -> Any:
        reply = real(name, *keys_and_args)
        if name == "claim" and not interrupted:
            interrupted.append(name)
            raise KeyboardInterrupt  # the reply is lost
        return reply

    store._eval = script_call  # type: ignore[method-assign]
    try:
        with pytest.raises(KeyboardInterrupt), guard(store, "job", payload=1):
            pytest.fail("the block ran although its claim's reply never came")
        status = store.record("job")
        assert status is not None
        assert status.state == "released"
        with guard(store, "job", payload=1) as call:  # at once, not after the lease
            assert not call.replayed
            call.save("ran once")
    finally:
        store.close()
    assert interrupted == ["claim"]
