"""The client against idemkey's own adapters on real servers, behind a loopback fault proxy.

Each fault hits one logical call (``?call=<id>``); the handler counts its executions in Redis.
In every case the handler runs once and the client returns the first execution's answer,
and every attempt crossed the proxy with the same key and the same bytes. The negative
controls at the end send the same faults through plain httpx with a fresh key per attempt,
and see the handler run twice: the harness can see a duplicate.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import ssl
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from idemkey.client import (
    AsyncClient,
    AsyncIdempotentTransport,
    Client,
    IdempotentResponse,
    IdempotentTransport,
    Operation,
    RefusedError,
    RetriesExhaustedError,
    RetryEvent,
    RetryPolicy,
)
from tests._servers import wait_until

from ._http_proxy import HttpFaultProxy
from .conftest import Server, Servers

TIMEOUT = 0.5  # each attempt's timeout; a held answer or a slow handler outlasts it
SLOW = 1.0  # the slow handler's run time
FAST = RetryPolicy(backoff=0.05, backoff_cap=0.2, deadline=10.0)
# Plain HTTP only: one context for every client spares loading the CA bundle per client.
TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


class Caller:
    """Client or AsyncClient, driven the same way; ``events`` holds every on_retry event."""

    def __init__(self, mode: str, base_url: str) -> None:
        self.mode, self.base_url = mode, base_url
        self.events: list[RetryEvent] = []
        self.client = Client(
            base_url=base_url, timeout=TIMEOUT, retry=FAST, on_retry=self.events.append, verify=TLS
        )

    def prepare(self, url: str, **kwargs: Any) -> Operation:
        return self.client.prepare("POST", url, **kwargs)

    def send(self, operation: Operation) -> IdempotentResponse:
        if self.mode == "sync":
            return self.client.send(operation)
        return asyncio.run(self._asend(operation))

    async def _asend(self, operation: Operation) -> IdempotentResponse:
        async with AsyncClient(
            base_url=self.base_url,
            timeout=TIMEOUT,
            retry=FAST,
            on_retry=self.events.append,
            verify=TLS,
        ) as client:
            return await client.send(operation)

    def close(self) -> None:
        self.client.close()


@pytest.fixture(
    params=[("flask", "sync"), ("wsgi", "sync"), ("asgi", "sync"), ("asgi", "async")],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def target(
    request: pytest.FixtureRequest, servers: Servers
) -> Iterator[tuple[Server, HttpFaultProxy, Caller]]:
    name, mode = request.param
    server = servers.get(name)
    with HttpFaultProxy("127.0.0.1", server.port) as proxy:
        caller = Caller(mode, proxy.url)
        try:
            yield server, proxy, caller
        finally:
            caller.close()


def new_call() -> str:
    return uuid.uuid4().hex[:12]


def runs(server: Server, call: str) -> int:
    with server.redis() as r:
        return int(r.get(f"{server.prefix}:runs:{call}") or 0)


def assert_once(
    server: Server,
    proxy: HttpFaultProxy,
    call: str,
    reply: IdempotentResponse,
    events: list[RetryEvent],
) -> None:
    """The handler ran once, the client got that run's answer, every attempt was identical."""
    assert runs(server, call) == 1
    with server.redis() as r:
        first = r.get(f"{server.prefix}:first:{call}")
    assert reply.status_code == 201
    assert reply.content == first
    # Every attempt that may have sent crossed the proxy. One the client failed as "connect"
    # sent nothing (ConnectTimeout: on a starved box the 0.5 s can pass before the connection
    # is used); each of the others is in `seen`, though not always yet: an attempt the client
    # gave up on ("timeout") may still wait in the proxy's accept queue while a later one is
    # answered, and is recorded when the proxy reads it.
    unsent = sum(event.reason == "connect" for event in events)
    reasons = [event.reason for event in events]
    sent = reply.attempts - unsent
    wait_until(
        lambda: len(proxy.requests_for(call)) >= sent, 10, f"{sent} at the proxy ({reasons})"
    )
    seen = proxy.requests_for(call)
    assert len(seen) == sent, f"{len(seen)} seen; retried for {reasons}"
    assert {s.headers["idempotency-key"] for s in seen} == {reply.key}
    assert len({s.body for s in seen}) == 1  # the same bytes every time
    assert len({s.headers["content-type"] for s in seen}) == 1  # a multipart boundary too
    assert reply.json()["sha256"] == hashlib.sha256(seen[0].body).hexdigest()


def test_response_dropped_after_the_server_answered(target: Any) -> None:
    server, proxy, caller = target
    call = new_call()
    proxy.arm("drop")
    reply = caller.send(caller.prepare(f"/charges?call={call}", json={"amount": 1000}))
    assert_once(server, proxy, call, reply, caller.events)
    assert proxy.requests_for(call)[0].fault == "drop"
    assert reply.replayed  # a later attempt got the stored answer
    assert caller.events[0].reason in ("protocol", "network")


def test_response_held_past_the_client_timeout(target: Any) -> None:
    server, proxy, caller = target
    call = new_call()
    proxy.arm("hold", 3 * TIMEOUT)
    reply = caller.send(caller.prepare(f"/charges?call={call}", json={"amount": 1000}))
    assert_once(server, proxy, call, reply, caller.events)
    assert proxy.requests_for(call)[0].fault == "hold"
    assert reply.replayed
    assert caller.events[0].reason == "timeout"


def test_reset_before_forwarding(target: Any) -> None:
    server, proxy, caller = target
    call = new_call()
    proxy.arm("reset")
    reply = caller.send(caller.prepare(f"/charges?call={call}", json={"amount": 1000}))
    assert_once(server, proxy, call, reply, caller.events)
    assert proxy.requests_for(call)[0].fault == "reset"
    # The first attempt never reached the server: the second ran the handler (a replay only if
    # a loaded machine made that one time out too).
    assert not reply.replayed or reply.attempts > 2
    assert caller.events[0].reason in ("protocol", "network")


def test_slow_handler_409_then_replay(target: Any) -> None:
    server, proxy, caller = target
    call = new_call()
    reply = caller.send(caller.prepare(f"/charges?call={call}&sleep={SLOW}", json={"amount": 7}))
    assert_once(server, proxy, call, reply, caller.events)
    assert reply.replayed
    reasons = [e.reason for e in caller.events]
    assert reasons[0] == "timeout"
    assert "409 in_flight" in reasons
    in_flight = next(e for e in caller.events if e.reason == "409 in_flight")
    assert in_flight.retry_after is not None
    assert in_flight.delay >= in_flight.retry_after


def test_server_503_with_retry_after_is_honoured(target: Any) -> None:
    server, proxy, caller = target
    call = new_call()
    with server.redis() as r:
        r.set(f"{server.prefix}:shed:{call}", 1, ex=60)  # the next request is shed with a 503
    operation = caller.prepare(f"/charges?call={call}", json={"amount": 1000})
    started = time.monotonic()
    reply = caller.send(operation)
    # Retry-After: 1 s, five times the longest backoff of this client (FAST: 0.2 s at most):
    # a wait this long is the header honoured.
    assert time.monotonic() - started >= 1.0
    assert_once(server, proxy, call, reply, caller.events)
    first, second = proxy.requests_for(call)[:2]
    assert second.at - first.at >= 1.0  # measured where the requests arrive
    assert (caller.events[0].reason, caller.events[0].retry_after) == ("503", 1.0)


def test_key_reused_is_refused_without_a_retry(target: Any) -> None:
    server, proxy, caller = target
    call = new_call()
    key = f"order-{call}"
    first = caller.send(
        caller.prepare(f"/charges?call={call}", json={"amount": 1000}, idempotency_key=key)
    )
    assert first.status_code == 201
    other = caller.prepare(f"/charges?call={call}", json={"amount": 2000}, idempotency_key=key)
    with pytest.raises(RefusedError) as refused:
        caller.send(other)
    assert refused.value.code == "key_reused"
    assert refused.value.status == 422
    assert refused.value.problem["type"] == "urn:idemkey:problem:key_reused"
    assert refused.value.attempts == 1
    assert len(proxy.requests_for(call)) == 2  # one per logical call: the 422 was not retried
    assert caller.events == []
    assert runs(server, call) == 1


def test_multipart_is_retried_byte_identically(target: Any) -> None:
    server, proxy, caller = target
    call = new_call()
    proxy.arm("drop")
    proxy.arm("reset")
    operation = caller.prepare(
        f"/charges?call={call}",
        data={"amount": "1000"},
        files={"receipt": ("receipt.pdf", os.urandom(4096), "application/pdf")},
    )
    reply = caller.send(operation)
    assert_once(server, proxy, call, reply, caller.events)
    assert reply.attempts >= 3
    assert proxy.requests_for(call)[0].headers["content-type"].startswith("multipart/form-data")


def test_deadline_gives_up_and_the_same_operation_resumes_later(servers: Servers) -> None:
    """Past the deadline the client stops (the handler still runs, once); sending the same
    operation again later, as a restarted process would with its saved key, gets the answer."""
    server = servers.get("flask")
    call = new_call()
    with HttpFaultProxy("127.0.0.1", server.port) as proxy:
        short = RetryPolicy(backoff=0.05, backoff_cap=0.2, deadline=1.0)
        with Client(base_url=proxy.url, timeout=TIMEOUT, retry=short, verify=TLS) as client:
            operation = client.prepare("POST", f"/charges?call={call}&sleep=1.5", json={})
            started = time.monotonic()
            with pytest.raises(RetriesExhaustedError) as gave_up:
                client.send(operation)
            # Every attempt's timeouts are clipped to the deadline, and no wait outlives it.
            assert time.monotonic() - started < 1.5
            assert gave_up.value.reason == "deadline"
            # Normally a 409 whose Retry-After (1 s) would end past the deadline; a timeout
            # if a loaded machine delayed that answer.
            assert gave_up.value.last in ("409 in_flight", "timeout")
            with server.redis() as r:
                wait_until(lambda: r.exists(f"{server.prefix}:first:{call}"), 10, "the first run")
            reply = client.send(operation)  # later, with the same key
        assert reply.replayed
        assert runs(server, call) == 1
        with server.redis() as r:
            assert reply.content == r.get(f"{server.prefix}:first:{call}")
        seen = proxy.requests_for(call)
        assert {s.headers["idempotency-key"] for s in seen} == {operation.key}
        assert len({s.body for s in seen}) == 1


def test_a_post_given_up_at_the_deadline_resumes_with_the_key_its_error_holds(
    servers: Servers,
) -> None:
    """The user's path: client.post(), no key of their own. Past the deadline the handler still
    runs, once; the error's key, sent again, replays it, where a second post() ran it again."""
    server = servers.get("flask")
    call = new_call()
    with HttpFaultProxy("127.0.0.1", server.port) as proxy:
        short = RetryPolicy(backoff=0.05, backoff_cap=0.2, deadline=1.0)
        with Client(base_url=proxy.url, timeout=TIMEOUT, retry=short, verify=TLS) as client:
            path = f"/charges?call={call}&sleep=1.5"
            with pytest.raises(RetriesExhaustedError) as gave_up:
                client.post(path, json={})
            key = gave_up.value.key
            assert key is not None
            with server.redis() as r:
                wait_until(lambda: r.exists(f"{server.prefix}:first:{call}"), 10, "the first run")
            reply = client.post(path, json={}, idempotency_key=key)
        assert reply.replayed
        assert runs(server, call) == 1
        assert {s.headers["idempotency-key"] for s in proxy.requests_for(call)} == {key}


# ---- the transports, mounted on plain httpx clients ----------------------------------------


def test_transport_mounted_on_httpx_client(servers: Servers) -> None:
    server = servers.get("wsgi")
    with HttpFaultProxy("127.0.0.1", server.port) as proxy:
        call = new_call()
        proxy.arm("drop")
        transport = IdempotentTransport(httpx.HTTPTransport(verify=TLS), retry=FAST)
        with httpx.Client(base_url=proxy.url, timeout=TIMEOUT, transport=transport) as http:
            reply = http.post(f"/charges?call={call}", json={"amount": 1000})
        assert reply.status_code == 201
        assert reply.headers["idempotent-replayed"] == "true"
        assert runs(server, call) == 1
        first, second = proxy.requests_for(call)
        assert first.headers["idempotency-key"] == second.headers["idempotency-key"]
        assert first.body == second.body


async def test_async_transport_mounted_on_httpx_async_client(servers: Servers) -> None:
    server = servers.get("asgi")
    with HttpFaultProxy("127.0.0.1", server.port) as proxy:
        call = new_call()
        proxy.arm("hold", 3 * TIMEOUT)
        transport = AsyncIdempotentTransport(httpx.AsyncHTTPTransport(verify=TLS), retry=FAST)
        async with httpx.AsyncClient(
            base_url=proxy.url, timeout=TIMEOUT, transport=transport
        ) as http:
            reply = await http.post(f"/charges?call={call}", json={"amount": 1000})
        assert reply.status_code == 201
        assert reply.headers["idempotent-replayed"] == "true"
        assert runs(server, call) == 1


# ---- negative controls: plain httpx, a fresh key per attempt ------------------------------


def plain_retry(base_url: str, url: str, attempts: int = 3, **kwargs: Any) -> httpx.Response:
    """What the issue calls the classic bug: each attempt gets a new key."""
    with httpx.Client(base_url=base_url, timeout=TIMEOUT, verify=TLS) as client:
        for _ in range(attempts - 1):
            try:
                return client.post(url, headers={"Idempotency-Key": str(uuid.uuid4())}, **kwargs)
            except httpx.TransportError:
                continue
        return client.post(url, headers={"Idempotency-Key": str(uuid.uuid4())}, **kwargs)


@pytest.fixture(params=["flask", "wsgi", "asgi"])
def plain(
    request: pytest.FixtureRequest, servers: Servers
) -> Iterator[tuple[Server, HttpFaultProxy]]:
    server = servers.get(request.param)
    with HttpFaultProxy("127.0.0.1", server.port) as proxy:
        yield server, proxy


@pytest.mark.parametrize(("fault", "seconds"), [("drop", 0.0), ("hold", 3 * TIMEOUT)])
def test_control_fresh_key_per_attempt_runs_twice(plain: Any, fault: Any, seconds: float) -> None:
    server, proxy = plain
    call = new_call()
    proxy.arm(fault, seconds)
    reply = plain_retry(proxy.url, f"/charges?call={call}", json={"amount": 1000})
    assert reply.status_code == 201
    assert "idempotent-replayed" not in reply.headers
    assert runs(server, call) == 2  # charged twice


def test_reserialised_multipart_is_still_the_same_request(plain: Any) -> None:
    """Same key, but httpx draws a new multipart boundary per request: the bytes differ, yet
    the server fingerprints multipart by its parts, so the retry is a replay, not a 422 (plain
    httpx retries work for uploads; the client sends the same bytes anyway)."""
    server, proxy = plain
    call = new_call()
    files = {"receipt": ("receipt.pdf", b"%PDF-1.7 receipt", "application/pdf")}
    headers = {"Idempotency-Key": f"k-{call}"}
    proxy.arm("drop")
    with httpx.Client(base_url=proxy.url, timeout=TIMEOUT, verify=TLS) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            client.post(f"/charges?call={call}", files=files, headers=headers)
        retry = client.post(f"/charges?call={call}", files=files, headers=headers)
    assert retry.status_code == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    first, second = proxy.requests_for(call)
    assert first.body != second.body  # two boundaries: the bytes really differed
    assert runs(server, call) == 1
