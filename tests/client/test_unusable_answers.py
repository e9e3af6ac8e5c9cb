"""A complete answer httpx will not make a response of ends the call once, with its key.

The server got the request (and the key), so its handler may have run; httpx then raised on
the answer: a body that fails to decode (``Content-Encoding: gzip`` over bytes that are not),
a redirect loop past ``max_redirects``, a redirect whose ``Location`` is no URL. Each escaped
``Client.post()`` as a raw httpx error, without the key a ``post()`` never showed (a second
``post()`` would run the handler again under a new key), and the bad ``Location`` was taken for
a dropped response and re-sent until the attempts ran out. Now the clients raise
``UnusableAnswerError`` (``.key``, ``.attempts``, the httpx error as ``__cause__``) after that
one attempt; a transport raises the httpx error, as httpx does without it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from idemkey.client import (
    AsyncClient,
    AsyncIdempotentTransport,
    Client,
    IdempotentTransport,
    RetryPolicy,
)
from idemkey.client._errors import UnusableAnswerError

from ._scripted_server import ScriptedServer, Seen, answer

CLIENTS = ["client", "async-client"]
TRANSPORTS = ["transport", "async-transport"]

#: Retries at once, and plenty of them: an answer taken for a failure shows as a second request.
FAST = RetryPolicy(max_attempts=4, deadline=10.0, backoff=0.01, backoff_cap=0.01)

NOT_GZIP = answer(
    201, [("Content-Type", "application/json"), ("Content-Encoding", "gzip")], b"not gzip"
)
BAD_LOCATION = answer(302, [("Location", "http://[::1")], b"moved")


def loop(seen: Seen) -> bytes:
    return answer(307, [("Location", "/charges")])


def post(shell: str, url: str, **options: Any) -> Any:
    """One keyed POST through ``shell``: its reply (a response from a transport), or it raises."""
    if shell == "client":
        with Client(base_url=url, timeout=2.0, retry=FAST, **options) as client:
            return client.post("/charges", json={"amount": 1})
    if shell == "transport":
        transport = IdempotentTransport(retry=FAST)
        with httpx.Client(base_url=url, transport=transport, **options) as http:
            return http.post("/charges", json={"amount": 1})

    async def main() -> Any:
        if shell == "async-client":
            async with AsyncClient(base_url=url, timeout=2.0, retry=FAST, **options) as aclient:
                return await aclient.post("/charges", json={"amount": 1})
        transport = AsyncIdempotentTransport(retry=FAST)
        async with httpx.AsyncClient(base_url=url, transport=transport, **options) as http:
            return await http.post("/charges", json={"amount": 1})

    return asyncio.run(main())


def ends_once(shell: str, server: ScriptedServer, **options: Any) -> UnusableAnswerError:
    with pytest.raises(UnusableAnswerError) as ended:
        post(shell, server.url, **options)
    keys = {seen.headers["idempotency-key"] for seen in server.seen}
    assert keys == {ended.value.key}  # the key the server got, to resume the call with
    assert ended.value.attempts == 1
    return ended.value


@pytest.mark.parametrize("shell", CLIENTS)
def test_a_body_that_fails_to_decode_ends_the_call_with_its_key(shell: str) -> None:
    with ScriptedServer(lambda _: NOT_GZIP) as server:
        ended = ends_once(shell, server)
    assert len(server.seen) == 1
    assert isinstance(ended.__cause__, httpx.DecodingError)
    assert ended.key not in str(ended)  # a key may be a secret


@pytest.mark.parametrize("shell", CLIENTS)
def test_a_redirect_loop_ends_the_call_with_its_key(shell: str) -> None:
    with ScriptedServer(loop) as server:
        ended = ends_once(shell, server, follow_redirects=True, max_redirects=2)
    assert len(server.seen) == 3  # as many requests as httpx sends before it gives up
    assert isinstance(ended.__cause__, httpx.TooManyRedirects)


@pytest.mark.parametrize("shell", CLIENTS)
@pytest.mark.parametrize("follow", [False, True], ids=["not-following", "following"])
def test_a_location_that_is_no_url_is_never_re_sent(shell: str, follow: bool) -> None:
    """httpx builds the redirect even with ``follow_redirects=False``, and raises then."""
    with ScriptedServer(lambda _: BAD_LOCATION) as server:
        ended = ends_once(shell, server, follow_redirects=follow)
    assert len(server.seen) == 1
    assert isinstance(ended.__cause__, httpx.RemoteProtocolError)


@pytest.mark.parametrize("shell", TRANSPORTS)
@pytest.mark.parametrize("respond", [NOT_GZIP, BAD_LOCATION], ids=["not-gzip", "bad-location"])
def test_a_transport_raises_httpx_s_own_error_after_one_request(shell: str, respond: bytes) -> None:
    """As httpx raises without the transport; its request carries the key the server got."""
    raises = pytest.raises((httpx.DecodingError, httpx.RemoteProtocolError))
    with ScriptedServer(lambda _: respond) as server, raises as raised:
        post(shell, server.url)
    [seen] = server.seen
    assert raised.value.request.headers["Idempotency-Key"] == seen.headers["idempotency-key"]
