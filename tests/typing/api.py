"""A consumer of idemkey's public API, type-checked with ``mypy --strict`` (never run).

If a change to the public types breaks ordinary user code, tests/typing/test_api.py fails.
Each line is what a user writes; ``assert_type`` pins what the checker must infer.
"""

from __future__ import annotations

import dataclasses

import msgspec
import redis
import redis.asyncio
from typing_extensions import assert_type

import idemkey
from idemkey import (
    AsyncRedisStore,
    Call,
    ConfigurationError,
    Event,
    IdemkeyError,
    InvalidKeyError,
    KeyReuseError,
    LeaseLostError,
    NoResultError,
    Outcome,
    Policy,
    RecordFormatError,
    RedisStore,
    RequestInFlightError,
    ResultNotStorableError,
    StoredResponse,
    StoreError,
    UsageError,
    aguard,
    guard,
    idempotent,
)
from idemkey.http import Request as HttpRequest
from idemkey.records import (
    GUARD_METHOD,
    Claimed,
    Decision,
    InFlight,
    Mismatch,
    Record,
    Replay,
    new_owner,
    payload_fingerprint,
    record_for,
    request_fingerprint,
)
from idemkey.store import Cancelled


class Receipt(msgspec.Struct):
    charge_id: str
    amount: int


@dataclasses.dataclass
class Invoice:
    id: str
    amount: int


def on_event(event: Event) -> None:
    print(event.kind, event.record, event.fence)


policy = Policy(ttl=3_600, lease=10, wait=2.0, prefix="payments", on_event=on_event)
waiting: Policy = policy.replace(wait=5.0)
as_json: Policy = policy.replace(fingerprint="json")


def without_nonce(request: HttpRequest, body: bytes) -> bytes:
    return body.split(b"&nonce=")[0]


custom = Policy(prefix="orders", fingerprint=without_nonce)
store = RedisStore(redis.Redis.from_url("redis://localhost:6379/0"), policy)
astore = AsyncRedisStore(redis.asyncio.Redis.from_url("redis://localhost:6379/0"))


def charge(invoice: Invoice) -> Receipt:
    return Receipt(invoice.id, invoice.amount)


def pay(invoice: Invoice) -> Receipt:
    with guard(store, f"charge:{invoice.id}", payload=invoice.id, result_type=Receipt) as call:
        assert_type(call, Call[Receipt])
        if call.replayed:
            return call.result
        fence: int | None = call.fence
        takeover: bool = call.takeover
        print(fence, takeover)
        receipt = charge(invoice)
        call.save(receipt)
        return receipt


async def apay(invoice: Invoice) -> Receipt:
    async with aguard(
        astore, f"charge:{invoice.id}", payload=b"body", scope="tenant", result_type=Receipt
    ) as call:
        assert_type(call, Call[Receipt])
        if call.replayed:
            return call.result
        call.save(charge(invoice))
        return call.result


def steps(invoice: Invoice) -> object:
    with guard(store, f"order:{invoice.id}", payload=invoice.id) as call:
        receipt = call.step("charge", charge, invoice)
        downstream_key: str = call.step_key("charge")
        resumed: tuple[str, ...] = call.resumed_steps
        call.save(receipt)
        return (receipt, downstream_key, resumed)


class Declined(Exception):
    code = "card_declined"


RETRY = idemkey.StepRetry(attempts=4, backoff=0.5, retry_on=(ConnectionError,), timeout=10)


def durable_steps(invoice: Invoice) -> object:
    with guard(
        store, f"order:{invoice.id}", cache_exceptions={Declined: ("code",)}, deadline=60
    ) as call:
        receipt = call.step("charge", charge, invoice, retry=RETRY, cache_exceptions=(Declined,))
        left: float | None = idemkey.step_deadline()
        cancelled = store.cancel(call.record) if call.record else None
        fence: int | None = cancelled.fence if cancelled else None
        return (receipt, left, fence)


async def acancel(invoice: Invoice) -> Cancelled | None:
    async with aguard(astore, f"order:{invoice.id}", deadline=5.0) as call:
        assert call.record is not None
        return await astore.cancel(call.record, abandon=True)


def remembered(error: IdemkeyError) -> str:
    if isinstance(error, idemkey.StoredFailureError):
        return error.type_path
    if isinstance(error, idemkey.StepAttemptsExhaustedError):
        return f"{error.step}: {error.attempts}"
    if isinstance(error, idemkey.JobDeadlineError):
        return str(error.seconds)
    return ""


async def asteps(invoice: Invoice) -> object:
    async with aguard(astore, f"order:{invoice.id}") as call:
        return await call.step("charge", charge, invoice)


@idempotent(store, key=lambda invoice: f"charge:{invoice.id}", result_type=Receipt)
def charge_job(invoice: Invoice) -> Receipt:
    return charge(invoice)


@idempotent(astore, key=lambda invoice: f"charge:{invoice.id}", payload=lambda invoice: invoice.id)
async def acharge_job(invoice: Invoice) -> Receipt:
    return charge(invoice)


async def callers() -> None:
    assert_type(charge_job(Invoice("inv_1", 100)), Receipt)
    assert_type(await acharge_job(Invoice("inv_1", 100)), Receipt)


def handle_errors(invoice: Invoice) -> str:
    try:
        pay(invoice)
    except RequestInFlightError as exc:
        retry_after: float = exc.retry_after
        lease_remaining: float = exc.lease_remaining
        return f"retry in {retry_after} (the lease lapses in {lease_remaining})"
    except (KeyReuseError, InvalidKeyError) as exc:
        return str(exc)
    except LeaseLostError as exc:
        lost_fence: int | None = exc.fence
        return f"lost at {lost_fence}"
    except ResultNotStorableError as exc:
        unstored_key: str = exc.key
        return f"ran once, result not kept: {unstored_key}: {exc.reason}"
    except (UsageError, NoResultError):
        return "misuse"
    except RecordFormatError:
        return "unreadable record"
    except StoreError as exc:
        return f"redis: {exc.__cause__!r}"
    except (ConfigurationError, IdemkeyError):
        return "bug"
    return "ok"


@idempotent(store, key=lambda invoice: invoice.id, name="billing.charge_job")
def renamed_charge_job(invoice: Invoice) -> Receipt:
    return charge(invoice)


class Billing:
    @idempotent(store, key=lambda self, invoice: invoice.id)
    def charge(self, invoice: Invoice) -> Receipt:
        return charge(invoice)


def custom_integration(body: bytes) -> bytes | None:
    """A job runner of one's own, on the store's methods and idemkey.records."""
    record: Record = record_for(store.policy.prefix, "tenant", GUARD_METHOD, "", "job-1")
    owner = new_owner()
    decision: Decision = store.claim(record, payload_fingerprint(body), owner=owner)
    if isinstance(decision, Claimed):
        ours: bool = store.complete(record, decision.owner, b"done")
        return b"done" if ours else None
    if isinstance(decision, Replay):
        return decision.response
    if isinstance(decision, InFlight):
        wait: float = decision.retry_after
        print(wait, decision.lease_remaining)
    assert_type(decision, InFlight | Mismatch)
    return None


http_fingerprint: bytes = request_fingerprint("POST", "/charges", "", "application/json", b"{}")
response = StoredResponse(201, (("content-type", "application/json"),), b"{}")
status: int = response.status
kept: bool = response.body_kept
version: str = idemkey.__version__
store.close()


async def shutdown() -> None:
    await astore.aclose()


def replay_aware() -> bool:
    """@idempotent(outcome=True): the result with whether it was a replay."""

    @idempotent(store, key=lambda invoice: f"charge:{invoice}", outcome=True, name="charge")
    def charge_once(invoice: int) -> int:
        return invoice

    outcome = charge_once(1)
    assert_type(outcome, Outcome[int])
    return outcome.replayed


async def replay_aware_async() -> bool:
    @idempotent(astore, key=lambda invoice: f"charge:{invoice}", outcome=True, name="charge")
    async def charge_once(invoice: int) -> int:
        return invoice

    outcome = await charge_once(1)
    assert_type(outcome, Outcome[int])
    return outcome.replayed


# The status API (issue 27): records, one record, the uncertain outcomes; sync and asyncio.
def operator(store: RedisStore) -> list[str]:
    from idemkey.store import RecordStatus
    from idemkey.store.uncertain import UncertainEntry

    stuck = [s for s in store.records(state=("lapsed", "released"), route="/charges", limit=10)]
    assert_type(stuck, list[RecordStatus])
    one = store.record("invoice-7", scope="acct_42")
    assert_type(one, RecordStatus | None)
    entries = store.uncertain(limit=5)
    assert_type(entries, list[UncertainEntry])
    return [s.digest for s in stuck] + [e.action for e in entries]


async def aoperator(store: AsyncRedisStore) -> list[float | None]:
    from idemkey.store import RecordStatus

    ages = [s.age async for s in store.records(state="in_progress")]
    one = await store.record("invoice-7")
    assert_type(one, RecordStatus | None)
    return [*ages, len(await store.uncertain())]
