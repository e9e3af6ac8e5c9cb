"""A keyed write follows redirects on its own origin only, with ``follow_redirects=True``.

httpx follows a redirect anywhere with every header but Authorization and Cookie: the
``Idempotency-Key`` (possibly a secret) went to another host, and on 307 and 308 the body too,
a write to a server that shares no record with the first. Now a redirect to another origin is
the call's answer, returned as httpx returns it with ``follow_redirects=False``; a redirect on
the same origin is followed as httpx follows it. Two real servers on two ports of 127.0.0.1.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from idemkey.client import AsyncClient, Client, IdempotentResponse
from idemkey.client._errors import UnusableAnswerError

from ._scripted_server import ScriptedServer, Seen, answer

STATUSES = [301, 302, 303, 307, 308]
CREATED = answer(201, [("Content-Type", "application/json")], b'{"id": "ch_1"}')


@pytest.fixture
def other() -> Iterator[ScriptedServer]:
    """Another origin: it must never hear of the call."""
    with ScriptedServer(lambda _: CREATED) as server:
        yield server


async def post(kind: str, url: str, **options: Any) -> IdempotentResponse:
    """One keyed POST with ``follow_redirects=True``, through Client or AsyncClient."""
    payload: dict[str, Any] = {"json": {"amount": 1}, "headers": {"Authorization": "Bearer t"}}
    if kind == "sync":
        with Client(base_url=url, timeout=2.0, follow_redirects=True, **options) as client:
            return client.post("/charges", **payload)
    async with AsyncClient(base_url=url, timeout=2.0, follow_redirects=True, **options) as aclient:
        return await aclient.post("/charges", **payload)


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("status", STATUSES)
async def test_a_redirect_to_another_origin_is_the_answer(
    other: ScriptedServer, kind: str, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="idemkey.client")
    location = f"{other.url}/steal?token=x"
    with ScriptedServer(lambda _: answer(status, [("Location", location)])) as first:
        reply = await post(kind, first.url)
    assert other.seen == []  # neither the key nor the body
    assert [seen.headers["idempotency-key"] for seen in first.seen] == [reply.key]
    assert (reply.status_code, reply.headers["location"], reply.attempts) == (status, location, 1)
    next_request = reply.response.next_request  # as httpx leaves it unfollowed: built, not sent
    assert next_request is not None
    assert next_request.url == location
    [line] = [r.getMessage() for r in caplog.records if r.name == "idemkey.client"]
    said = f"POST {first.url}/charges answered {status} to another origin ({other.url}/)"
    assert line == said + ": not followed, a keyed call stays on its origin"
    assert reply.key not in line
    assert "token" not in line


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_the_redirect_line_never_carries_a_password(
    other: ScriptedServer, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Both URLs of the warning may carry ``user:password``: neither reaches the log."""
    caplog.set_level(logging.WARNING, logger="idemkey.client")
    location = other.url.replace("http://", "http://thief:SECRET-THERE@") + "/steal"
    with ScriptedServer(lambda _: answer(307, [("Location", location)])) as first:
        mine = first.url.replace("http://", "http://api-user:SECRET-HERE@")
        reply = await post(kind, mine)
    assert (reply.status_code, other.seen) == (307, [])
    [line] = [r.getMessage() for r in caplog.records if r.name == "idemkey.client"]
    assert line.startswith(f"POST {first.url}/charges answered 307 to another origin")
    assert "SECRET" not in line
    assert "api-user" not in line
    assert "thief" not in line


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_the_redirect_line_shows_the_servers_urls_bounded(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Both URLs of the warning are the server's once it redirected on its origin: a path of
    20 000 characters, then another origin with a host of 6 100, made a line of 26 kB."""
    caplog.set_level(logging.WARNING, logger="idemkey.client")
    host = ".".join(["h" * 60] * 100)
    with ScriptedServer(chain(307, f"http://{host}/steal", hop="/" + "p" * 20_000)) as first:
        reply = await post(kind, first.url)
    assert (reply.status_code, [seen.target[:2] for seen in first.seen]) == (307, ["/c", "/p"])
    [line] = [r.getMessage() for r in caplog.records if r.name == "idemkey.client"]
    shown = f"{len(line)} characters: {line[:300]!r}"
    assert line.isprintable(), shown
    assert len(line) < 600, shown
    assert line.startswith(f"POST '{first.url}/pppp")
    assert " answered 307 to another origin ('http://hhhh" in line


def chain(status: int, elsewhere: str, hop: str = "/v2/charges") -> Callable[[Seen], bytes]:
    """``/charges`` redirects to ``hop`` (here), which redirects to ``elsewhere``."""

    def respond(seen: Seen) -> bytes:
        if seen.target == "/charges":
            return answer(status, [("Location", hop)])
        return answer(307, [("Location", elsewhere)])

    return respond


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("status", STATUSES)
async def test_a_redirect_on_the_same_origin_is_followed_as_httpx_follows_it(
    other: ScriptedServer, kind: str, status: int
) -> None:
    with ScriptedServer(chain(status, f"{other.url}/steal")) as first:
        reply = await post(kind, first.url)
    assert other.seen == []
    start, hop = first.seen
    assert (hop.target, reply.status_code, reply.attempts) == ("/v2/charges", 307, 1)
    assert [r.status_code for r in reply.response.history] == [status]
    assert hop.headers["idempotency-key"] == start.headers["idempotency-key"] == reply.key
    assert hop.headers["authorization"] == "Bearer t"  # the same origin: httpx keeps it
    if status in (307, 308):  # the method and the body kept
        assert (hop.method, hop.body) == ("POST", start.body)
    else:  # httpx turns the POST into a GET (301 and 302 as browsers do)
        assert (hop.method, hop.body) == ("GET", b"")
    # ... up to the same limit: a loop ends after as many requests as httpx's TooManyRedirects,
    # which the call raises as the cause of UnusableAnswerError, with the key.
    with ScriptedServer(lambda _: answer(status, [("Location", "/charges")])) as loop:
        plain_httpx = httpx.AsyncClient(base_url=loop.url, follow_redirects=True, max_redirects=2)
        async with plain_httpx:
            with pytest.raises(httpx.TooManyRedirects):
                await plain_httpx.post("/charges", json={})
        plain = len(loop.seen)
        with pytest.raises(UnusableAnswerError) as ended:
            await post(kind, loop.url, max_redirects=2)
    assert isinstance(ended.value.__cause__, httpx.TooManyRedirects)
    assert ended.value.key == loop.seen[-1].headers["idempotency-key"]
    assert len(loop.seen) - plain == plain == 3
