"""``Client(on_replay=...)`` against idemkey's adapters on real servers (issue 24).

CVE-2026-34210 was a server that called Stripe, ignored ``Idempotent-Replayed`` and handed
out resources for one payment again and again: each time its order code ran again with the
same key, Stripe answered with the stored charge and the code took it for a new payment.
``on_replay="refuse"`` makes that an error: a replay the call's own attempts do not explain
means the operation ran before, for another call. A replay after the call's own attempt was
lost (it may have reached the handler: a dropped response, a timeout, a gateway's 504) is the
retry working, and is accepted; one after attempts that never reached the handler (a refused
connection, 409 in_flight while another call held the key, a 503 from a gateway) is refused.
"""

from __future__ import annotations

import socket
import threading
import uuid
from typing import Any

import pytest

from idemkey.client import (
    AsyncClient,
    Client,
    IdempotentResponse,
    RefusedError,
    RetryEvent,
    RetryPolicy,
    UnexpectedReplayError,
)
from tests._servers import wait_until

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


def test_a_replay_after_another_calls_409_in_flight_is_refused(server: Server) -> None:
    """Two runs of the order code at once, one key: the second's first attempt gets 409
    in_flight (the first run holds the key), its next one the first run's charge. Nothing of
    the second call reached the handler: refused, as on a first attempt."""
    call = uuid.uuid4().hex[:12]
    order, url = f"order-{call}", f"/charges?call={call}&sleep=1.5"
    first: list[IdempotentResponse] = []

    def first_run() -> None:
        with Client(base_url=base(server), retry=FAST, on_replay="refuse") as client:
            first.append(client.post(url, json={"amount": 1200}, idempotency_key=order))

    thread = threading.Thread(target=first_run)
    thread.start()
    try:
        wait_until(lambda: runs(server, call) == 1, 10.0, "the first run in its handler")
        client = Client(base_url=base(server), retry=FAST, on_replay="refuse")
        with client, pytest.raises(UnexpectedReplayError) as refused:
            client.post(url, json={"amount": 1200}, idempotency_key=order)
    finally:
        thread.join(15.0)
    assert refused.value.attempts >= 2  # 409 in_flight first: not the first attempt's replay
    assert refused.value.reply.content == first[0].content
    assert not first[0].replayed
    assert runs(server, call) == 1


def test_a_replay_after_a_refused_connection_is_refused(server: Server) -> None:
    """The first attempt finds the port closed (a restart): nothing was sent, so the replay
    the second attempt gets is an earlier run's."""
    call = uuid.uuid4().hex[:12]
    order, url = f"order-{call}", f"/charges?call={call}"
    with Client(base_url=base(server), retry=FAST) as client:
        paid = client.post(url, json={"amount": 1200}, idempotency_key=order)  # an earlier run
    port = socket.socket()
    port.bind(("127.0.0.1", 0))  # bound, not listening: a connection is refused
    proxies: list[HttpFaultProxy] = []

    def come_up(event: RetryEvent) -> None:  # between the two attempts
        if not proxies:
            proxies.append(HttpFaultProxy("127.0.0.1", server.port, listener=port))

    address = f"http://127.0.0.1:{port.getsockname()[1]}"
    try:
        client = Client(base_url=address, retry=FAST, on_retry=come_up, on_replay="refuse")
        with client, pytest.raises(UnexpectedReplayError) as refused:
            client.post(url, json={"amount": 1200}, idempotency_key=order)
    finally:
        for proxy in proxies:
            proxy.close()
        port.close()
    assert refused.value.attempts == 2
    assert refused.value.reply.content == paid.content
    assert runs(server, call) == 1


def test_a_replay_after_a_503_the_handler_never_saw_is_refused(server: Server) -> None:
    call = uuid.uuid4().hex[:12]
    order, url = f"order-{call}", f"/charges?call={call}"
    with HttpFaultProxy("127.0.0.1", server.port) as proxy:
        with Client(base_url=proxy.url, retry=FAST) as client:
            paid = client.post(url, json={"amount": 1}, idempotency_key=order)  # an earlier run
        proxy.arm("shed")  # a load balancer sheds the next request: it never reaches the app
        client = Client(base_url=proxy.url, retry=FAST, on_replay="refuse")
        with client, pytest.raises(UnexpectedReplayError) as refused:
            client.post(url, json={"amount": 1}, idempotency_key=order)
    assert refused.value.attempts == 2
    assert refused.value.reply.content == paid.content
    assert runs(server, call) == 1


def test_a_replay_after_a_gateway_timeout_is_the_calls_own(server: Server) -> None:
    """A 504 may come after the handler ran (the gateway stopped waiting): the replay the
    next attempt gets may be this call's own answer, and is accepted."""
    call = uuid.uuid4().hex[:12]
    with HttpFaultProxy("127.0.0.1", server.port) as proxy:
        proxy.arm("gateway")  # the first attempt ran; a 504 came back in its answer's place
        with Client(base_url=proxy.url, retry=FAST, on_replay="refuse") as client:
            reply = client.post(f"/charges?call={call}", json={"amount": 5})
    assert reply.replayed
    assert reply.attempts == 2
    assert runs(server, call) == 1


async def test_the_async_client_refuses_a_replay_after_a_503_too(servers: Servers) -> None:
    server = servers.get("asgi")
    call = uuid.uuid4().hex[:12]
    order, url = f"order-{call}", f"/charges?call={call}"
    with HttpFaultProxy("127.0.0.1", server.port) as proxy:
        async with AsyncClient(base_url=proxy.url, retry=FAST) as client:
            await client.post(url, json={"amount": 1}, idempotency_key=order)
        proxy.arm("shed")
        async with AsyncClient(base_url=proxy.url, retry=FAST, on_replay="refuse") as client:
            with pytest.raises(UnexpectedReplayError) as refused:
                await client.post(url, json={"amount": 1}, idempotency_key=order)
    assert refused.value.attempts == 2
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
