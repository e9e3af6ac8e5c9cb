"""``Client(on_replay=...)`` against idemkey's adapters on real servers (issue 24).

CVE-2026-34210 was a server that called Stripe, ignored ``Idempotent-Replayed`` and handed
out resources for one payment again and again: each time its order code ran again with the
same key, Stripe answered with the stored charge and the code took it for a new payment.
``on_replay="refuse"`` makes that an error: a replay on the call's first attempt means the
operation ran before, for another call. A replay after the call's own attempt was lost (a
dropped response) is the retry working, and is accepted.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from idemkey.client import (
    AsyncClient,
    Client,
    IdempotentResponse,
    RefusedError,
    RetryPolicy,
    UnexpectedReplayError,
)

from ._http_proxy import HttpFaultProxy
from .conftest import Server, Servers

FAST = RetryPolicy(backoff=0.05, backoff_cap=0.2, deadline=10.0)


def runs(server: Server, call: str) -> int:
    with server.redis() as r:
        return int(r.get(f"{server.prefix}:runs:{call}") or 0)


@pytest.fixture(params=["flask", "wsgi", "asgi"])
def server(request: pytest.FixtureRequest, servers: Servers) -> Server:
    return servers.get(request.param)


def base(server: Server) -> str:
    return f"http://127.0.0.1:{server.port}"


def test_an_order_sent_twice_with_one_key_is_refused_the_second_time(server: Server) -> None:
    call = uuid.uuid4().hex[:12]
    order = f"order-{call}"  # the key the order code derives: the same each time it runs
    with Client(base_url=base(server), retry=FAST, on_replay="refuse") as client:
        first = client.post(f"/charges?call={call}", json={"amount": 1000}, idempotency_key=order)
        assert (first.status_code, first.replayed) == (201, False)
        with pytest.raises(UnexpectedReplayError) as refused:
            client.post(f"/charges?call={call}", json={"amount": 1000}, idempotency_key=order)
    assert refused.value.attempts == 1
    assert refused.value.key == order
    assert refused.value.reply.replayed
    assert refused.value.reply.content == first.content  # the stored charge, not a new one
    assert runs(server, call) == 1


def test_by_default_the_replay_is_returned_and_marked(server: Server) -> None:
    call = uuid.uuid4().hex[:12]
    with Client(base_url=base(server), retry=FAST) as client:
        first = client.post(f"/charges?call={call}", json={"amount": 1}, idempotency_key=call)
        again = client.post(f"/charges?call={call}", json={"amount": 1}, idempotency_key=call)
    assert not first.replayed
    assert again.replayed
    assert again.content == first.content
    assert runs(server, call) == 1


def test_a_replay_after_the_calls_own_lost_attempt_is_accepted(server: Server) -> None:
    call = uuid.uuid4().hex[:12]
    with HttpFaultProxy("127.0.0.1", server.port) as proxy:
        proxy.arm("drop")  # the first attempt ran, its answer never came back
        with Client(base_url=proxy.url, retry=FAST, on_replay="refuse") as client:
            reply = client.post(f"/charges?call={call}", json={"amount": 5})
    assert reply.replayed
    assert reply.attempts == 2
    assert runs(server, call) == 1


def test_a_function_sees_every_replay_and_refuses_by_raising(server: Server) -> None:
    call = uuid.uuid4().hex[:12]
    seen: list[IdempotentResponse] = []

    def audit(reply: IdempotentResponse) -> None:
        seen.append(reply)
        raise LookupError("not for us")

    with Client(base_url=base(server), retry=FAST, on_replay=audit) as client:
        client.post(f"/charges?call={call}", json={"amount": 1}, idempotency_key=call)
        assert seen == []  # a first answer is no replay
        with pytest.raises(LookupError):
            client.post(f"/charges?call={call}", json={"amount": 1}, idempotency_key=call)
    assert [reply.replayed for reply in seen] == [True]


async def test_the_async_client_refuses_too(servers: Servers) -> None:
    server = servers.get("asgi")
    call = uuid.uuid4().hex[:12]
    async with AsyncClient(base_url=base(server), retry=FAST, on_replay="refuse") as client:
        await client.post(f"/charges?call={call}", json={"amount": 1}, idempotency_key=call)
        with pytest.raises(UnexpectedReplayError):
            await client.post(f"/charges?call={call}", json={"amount": 1}, idempotency_key=call)
    assert runs(server, call) == 1


def test_a_refusal_carries_the_retry_member(server: Server) -> None:
    call = uuid.uuid4().hex[:12]
    with Client(base_url=base(server), retry=FAST) as client:
        client.post(f"/charges?call={call}", json={"amount": 1}, idempotency_key=call)
        with pytest.raises(RefusedError) as refused:
            client.post(f"/charges?call={call}", json={"amount": 2}, idempotency_key=call)
    assert refused.value.code == "key_reused"
    assert refused.value.retry == "new_key"
    assert isinstance(refused.value.problem["retention"], int)


@pytest.mark.parametrize("value", ["sometimes", 3, None])
def test_on_replay_is_checked_where_it_arrives(value: Any) -> None:
    from idemkey import ConfigurationError

    with pytest.raises(ConfigurationError, match="on_replay"):
        Client(on_replay=value)
