"""The response-class matrix, replayed on every harness of the adapter suite.

JSON, HTML, a file, a redirect, a streamed body, a 204, two ``Set-Cookie`` lines and two
``Link`` lines: the retry gets the first answer's status, body, and header lines in their
order, plus ``Idempotent-Replayed: true``. Two documented exceptions: ``Set-Cookie`` (and
``Date``) are on the default ``header_denylist``, so a replay carries none (it must not hand
out a second session), and a streamed body is not kept (``Idempotent-Body-Not-Kept: true``,
empty body, same status and headers). Runs on the suite's fixtures (``tests/adapters/conftest.py``).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from idemkey import AsyncRedisStore, Policy
from idemkey.adapters import asgi, wsgi
from tests.adapters.harness import MATRIX, STREAM_CHUNKS, store_on
from tests.adapters.test_asgi import call
from tests.adapters.test_wsgi import Server

if TYPE_CHECKING:
    from collections.abc import Iterable

    import redis.asyncio
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from tests.adapters.harness import Harness, Reply

NOT_STORED = {"set-cookie", "date"}  # the default header_denylist's end-to-end headers
REPLAYED = ("Idempotent-Replayed", "true")


def send_twice(harness: Harness, path: str) -> tuple[Reply, Reply]:
    headers = [("Idempotency-Key", uuid.uuid4().hex), ("Content-Type", "application/json")]
    first = harness.request("POST", path, headers=headers, body=b"{}")
    replay = harness.request("POST", path, headers=headers, body=b"{}")
    return first, replay


def stored_lines(reply: Reply) -> list[tuple[str, str]]:
    return [(n.lower(), v) for n, v in reply.headers if n.lower() not in NOT_STORED]


def lowered(lines: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(n.lower(), v) for n, v in lines]


@pytest.mark.parametrize("kind", MATRIX)
def test_each_response_class_is_replayed_exactly(harness: Harness, kind: str) -> None:
    status, headers, body = MATRIX[kind]
    first, replay = send_twice(harness, f"/matrix/{kind}")
    assert first.status == status, first
    assert first.body == body
    assert harness.executions["matrix"] == 1
    assert replay.status == first.status
    assert replay.body == first.body
    assert lowered(replay.headers) == [*stored_lines(first), lowered([REPLAYED])[0]]
    if first.header("Content-Length") is None:
        assert replay.header("Content-Length") is None  # a 204 must not get one (RFC 9110 8.6)
    # The app's own lines reached the first client and come back in the replay (Django keeps
    # one value per header name, so only the last Link line).
    for name, value in headers:
        if harness.name.startswith("django") and (name, value) == ("Link", "</p/2>; rel=next"):
            continue
        if name.lower() not in NOT_STORED and name.lower() != "content-type":
            assert (name.lower(), value) in lowered(replay.headers), (name, value)


def test_two_link_lines_stay_two_lines(harness: Harness) -> None:
    first, replay = send_twice(harness, "/matrix/links")
    links = ["</p/2>; rel=next", "</p/9>; rel=last"]
    if harness.name.startswith("django"):  # HttpResponse keeps one value per header name
        links = links[1:]
    assert first.header_all("Link") == links
    assert replay.header_all("Link") == links


def test_set_cookie_lines_reach_the_first_client_only(harness: Harness) -> None:
    first, replay = send_twice(harness, "/matrix/cookies")
    cookies = [c.split(";")[0].strip() for c in first.header_all("Set-Cookie")]
    assert cookies == ["a=1", "b=2"]
    assert replay.header_all("Set-Cookie") == []  # denylisted: a replay hands out no session
    assert replay.body == first.body


def test_a_streamed_response_replays_its_status_and_headers(harness: Harness) -> None:
    first, replay = send_twice(harness, "/stream")
    assert first.body == b"".join(STREAM_CHUNKS)
    assert harness.executions["stream"] == 1
    assert replay.status == first.status
    assert replay.body == b""
    assert replay.header("Idempotent-Body-Not-Kept") == "true"
    expected = [*stored_lines(first), ("idempotent-replayed", "true")]
    expected.append(("idempotent-body-not-kept", "true"))
    assert lowered(replay.headers) == expected


# A 1xx is no answer: an app that gives one as its status (WSGI) or starts with one before its
# real start (ASGI, 103 Early Hints the pre-extension way) is never replayed a 1xx.


@pytest.mark.redis
def test_a_wsgi_1xx_status_is_never_stored_as_the_answer(redis_url: str, prefix: str) -> None:
    runs: list[int] = []

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        runs.append(1)
        start_response("103 Early Hints", [("Link", "</a.css>; rel=preload")])
        return [b'{"id": 1}']

    with store_on(redis_url, Policy(prefix=prefix)) as store:
        middleware = wsgi.IdempotencyMiddleware(app, store)
        Server().call(middleware)
        retry = Server()
        retry.call(middleware)
    assert ("Idempotent-Replayed", "true") not in retry.headers
    assert runs == [1, 1]  # released, as for any status outside 200-599


async def test_an_asgi_1xx_start_is_never_replayed_as_the_answer(
    async_client: redis.asyncio.Redis, prefix: str
) -> None:
    runs: list[int] = []

    async def app(scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        await receive()
        runs.append(1)
        link = [(b"link", b"</a.css>; rel=preload")]
        await send({"type": "http.response.start", "status": 103, "headers": link})
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b'{"id": 1}'})

    store = AsyncRedisStore(async_client, Policy(prefix=prefix))
    try:
        middleware = asgi.IdempotencyMiddleware(app, store)
        first = await call(middleware)
        retry = await call(middleware)
    finally:
        await store.aclose()
    assert [m["status"] for m in first.sent if m["type"] == "http.response.start"] == [103, 201]
    starts = [m for m in retry.sent if m["type"] == "http.response.start"]
    assert [m["status"] for m in starts] == [201]  # the answer replayed, never a lone 103
    assert retry.body == b'{"id": 1}'
    assert runs == [1]  # the 103 was forwarded, the 201 stored: the app ran once


async def test_an_asgi_answer_with_trailers_is_replayed_without_its_body(
    async_client: redis.asyncio.Redis, prefix: str
) -> None:
    """Trailers follow the body, and a replay sends none: the body is not kept, and the
    replay says so (Idempotent-Body-Not-Kept), rather than a body without its trailers."""

    async def app(scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [], "trailers": True})
        await send({"type": "http.response.body", "body": b"data"})
        await send({"type": "http.response.trailers", "headers": [(b"grpc-status", b"0")]})

    store = AsyncRedisStore(async_client, Policy(prefix=prefix))
    try:
        middleware = asgi.IdempotencyMiddleware(app, store)
        await call(middleware)
        retry = await call(middleware)
    finally:
        await store.aclose()
    (start,) = [m for m in retry.sent if m["type"] == "http.response.start"]
    assert (b"idempotent-body-not-kept", b"true") in [(n.lower(), v) for n, v in start["headers"]]
    assert retry.body == b""
