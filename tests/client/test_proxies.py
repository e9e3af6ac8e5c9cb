"""A proxy that refuses a tunnel (``CONNECT`` answered 502: ``httpx.ProxyError``) is retried.

Nothing reached the origin on that attempt, as with a refused connection. The refusal ended
the call as a bare ``httpx.ProxyError``, without the key, even after an earlier attempt had
reached the handler and its answer was lost: a caller retrying ``post()`` sent a new key, and
the handler ran twice. Now it retries, and a call that ends after its first attempt ends with
its key (``RetriesExhaustedError.key``), whatever httpx raised.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from idemkey.client import (
    AsyncClient,
    AsyncIdempotentTransport,
    Client,
    IdempotentTransport,
    RetriesExhaustedError,
    RetryPolicy,
)

from ._http_proxy import ConnectProxy, TlsScriptedServer, self_signed
from ._scripted_server import Seen, answer

CLIENTS = ["client", "async-client"]
SHELLS = [*CLIENTS, "transport", "async-transport"]
FAST = RetryPolicy(max_attempts=3, deadline=10.0, backoff=0.01, backoff_cap=0.01)


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    # The test extra brings it (daphne's autobahn needs it); a smaller install skips.
    pytest.importorskip("cryptography", reason="cryptography makes the origin's certificate")
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def origin(pem: tuple[Path, Path]) -> Iterator[TlsScriptedServer]:
    with TlsScriptedServer(lambda _: answer(201, body=b"ok"), *pem) as server:
        yield server


def post(shell: str, url: str, **options: Any) -> Any:
    """One keyed POST through ``shell``: its reply (a response from a transport), or it raises."""
    if shell == "client":
        with Client(base_url=url, timeout=2.0, retry=FAST, **options) as client:
            return client.post("/charges", json={"amount": 1})
    if shell == "transport":
        verify, proxy = options.pop("verify"), options.pop("proxy")
        inner = httpx.HTTPTransport(verify=verify, proxy=proxy)
        transport = IdempotentTransport(inner, retry=FAST)
        with httpx.Client(base_url=url, transport=transport, **options) as http:
            return http.post("/charges", json={"amount": 1})

    async def main() -> Any:
        if shell == "async-client":
            async with AsyncClient(base_url=url, timeout=2.0, retry=FAST, **options) as aclient:
                return await aclient.post("/charges", json={"amount": 1})
        verify, proxy = options.pop("verify"), options.pop("proxy")
        inner = httpx.AsyncHTTPTransport(verify=verify, proxy=proxy)
        transport = AsyncIdempotentTransport(inner, retry=FAST)
        async with httpx.AsyncClient(base_url=url, transport=transport, **options) as http:
            return await http.post("/charges", json={"amount": 1})

    return asyncio.run(main())


def through(proxy: ConnectProxy, pem: tuple[Path, Path]) -> dict[str, Any]:
    return {"proxy": proxy.url, "verify": ssl.create_default_context(cafile=str(pem[0]))}


@pytest.mark.parametrize("shell", SHELLS)
def test_a_refused_tunnel_is_retried(
    shell: str, origin: TlsScriptedServer, pem: tuple[Path, Path]
) -> None:
    with ConnectProxy(origin.port) as proxy:
        proxy.arm("refuse")
        reply = post(shell, origin.url, **through(proxy, pem))
        assert len(proxy.connects) == 2
    assert reply.status_code == 201
    assert len(origin.seen) == 1  # the handler ran once
    if shell in CLIENTS:
        assert reply.attempts == 2


def lost(seen: Seen) -> bytes:
    raise OSError("the handler ran; its answer is lost")


@pytest.mark.parametrize("shell", CLIENTS)
def test_a_refused_tunnel_after_a_lost_answer_ends_with_the_key(
    shell: str, pem: tuple[Path, Path]
) -> None:
    with TlsScriptedServer(lost, *pem) as origin, ConnectProxy(origin.port) as proxy:
        proxy.arm("tunnel")  # reaches the handler
        for _ in range(FAST.max_attempts - 1):
            proxy.arm("refuse")
        with pytest.raises(RetriesExhaustedError) as ended:
            post(shell, origin.url, **through(proxy, pem))
    assert [seen.headers["idempotency-key"] for seen in origin.seen] == [ended.value.key]
    assert ended.value.reason == "attempts"
    assert ended.value.last == "connect"
    assert isinstance(ended.value.__cause__, httpx.ProxyError)


def failing(*errors: type[httpx.TransportError]) -> httpx.MockTransport:
    """A transport whose attempt *n* raises ``errors[n]``."""
    calls: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise errors[len(calls) - 1]("scripted", request=request)

    return httpx.MockTransport(handle)


@pytest.mark.parametrize("shell", CLIENTS)
def test_an_unretryable_error_after_a_lost_attempt_ends_with_the_key(shell: str) -> None:
    transport = failing(httpx.ReadError, httpx.LocalProtocolError)
    with pytest.raises(RetriesExhaustedError) as ended:
        post(shell, "http://127.0.0.1:9", transport=transport)
    assert ended.value.reason == "unretryable"
    assert ended.value.last == "LocalProtocolError"
    assert ended.value.attempts == 2
    assert ended.value.key
    assert isinstance(ended.value.__cause__, httpx.LocalProtocolError)


@pytest.mark.parametrize("shell", CLIENTS)
def test_an_unretryable_first_attempt_raises_httpx_s_error(shell: str) -> None:
    with pytest.raises(httpx.UnsupportedProtocol):
        post(shell, "http://127.0.0.1:9", transport=failing(httpx.UnsupportedProtocol))
