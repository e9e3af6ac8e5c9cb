"""A hostile server's answer ends a call as documented, in every shell, over a real socket.

Never an untyped exception: a retry, ``RetriesExhaustedError`` (a transport returns the last
response instead), or the response returned as it is. Each case was a bare ``OverflowError``,
``ValueError`` or ``RecursionError`` from ``Client``, ``AsyncClient`` and both transports.
"""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest

from idemkey.client import (
    AsyncClient,
    AsyncIdempotentTransport,
    Client,
    IdempotentTransport,
    RefusedError,
    RetriesExhaustedError,
    RetryPolicy,
)

from ._scripted_server import ScriptedServer, answer

CLIENTS = ["client", "async-client"]
SHELLS = [*CLIENTS, "transport", "async-transport"]

#: Two attempts, 10 ms apart: a retry is seen, and the call ends soon.
TWO = RetryPolicy(max_attempts=2, deadline=10.0, backoff=0.01, backoff_cap=0.01)

HUGE_YEAR = "Mon, 01 Jan 99999999999999999999 00:00:00 GMT"
NESTED = b"[" * 100_000 + b"]" * 100_000


def post(shell: str, url: str) -> httpx.Response:
    """One POST through ``shell``: the response it ends with, or what it raises."""
    if shell == "client":
        with Client(base_url=url, timeout=2.0, retry=TWO) as client:
            return client.post("/charges", json={"amount": 1}).response
    if shell == "transport":
        with httpx.Client(base_url=url, transport=IdempotentTransport(retry=TWO)) as http:
            return http.post("/charges", json={"amount": 1})

    async def main() -> httpx.Response:
        if shell == "async-client":
            async with AsyncClient(base_url=url, timeout=2.0, retry=TWO) as client:
                return (await client.post("/charges", json={"amount": 1})).response
        transport = AsyncIdempotentTransport(retry=TWO)
        async with httpx.AsyncClient(base_url=url, transport=transport) as http:
            return await http.post("/charges", json={"amount": 1})

    return asyncio.run(main())


def gives_up(shell: str, url: str, reason: str, attempts: int) -> httpx.Response:
    """The last response: ``RetriesExhaustedError``'s from a client, a transport's own."""
    if shell not in CLIENTS:
        return post(shell, url)
    with pytest.raises(RetriesExhaustedError) as gave_up:
        post(shell, url)
    assert (gave_up.value.reason, gave_up.value.attempts) == (reason, attempts)
    assert gave_up.value.response is not None
    return gave_up.value.response


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("value", ["9" * 20, "9" * 400, "9" * 5000], ids=["20", "400", "5000"])
def test_a_retry_after_past_any_deadline_ends_the_call_at_once(shell: str, value: str) -> None:
    with ScriptedServer(lambda _: answer(503, [("Retry-After", value)])) as server:
        assert gives_up(shell, server.url, "deadline", 1).status_code == 503
    assert len(server.seen) == 1


@pytest.mark.parametrize("shell", CLIENTS)
@pytest.mark.parametrize("value", ["120", "Fri, 31 Dec 9999 23:59:59 GMT"], ids=["seconds", "date"])
def test_giving_up_on_a_long_retry_after_says_so(shell: str, value: str) -> None:
    # It was reported as a bare "deadline" a split second into a long one, with nothing saying
    # the server had asked for a wait longer than what was left of it.
    with (
        ScriptedServer(lambda _: answer(503, [("Retry-After", value)])) as server,
        pytest.raises(RetriesExhaustedError) as gave_up,
    ):
        post(shell, server.url)
    error = gave_up.value
    assert error.retry_after is not None
    assert error.left is not None
    assert error.retry_after >= 120.0 > error.left > 0.0
    assert "; the server asked to wait " in str(error)
    assert str(error).endswith(" s left")


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    "value", ["1e9", "Mon, 01 Jan 10000 00:00:00 GMT", HUGE_YEAR], ids=["1e9", "10000", "huge"]
)
def test_an_unreadable_retry_after_retries_on_the_backoff(shell: str, value: str) -> None:
    with ScriptedServer(lambda _: answer(503, [("Retry-After", value)])) as server:
        assert gives_up(shell, server.url, "attempts", 2).status_code == 503
    assert len(server.seen) == 2


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("status", [409, 422, 503])
def test_a_problem_body_nested_too_deep_is_the_apps_answer(shell: str, status: int) -> None:
    """409 and 422 returned as they are, 503 retried: as any body that is no idemkey problem."""
    problem = [("Content-Type", "application/problem+json")]
    with ScriptedServer(lambda _: answer(status, problem, NESTED)) as server:
        if status == 503:
            response = gives_up(shell, server.url, "attempts", 2)
        else:
            response = post(shell, server.url)
    assert (response.status_code, response.content) == (status, NESTED)
    assert len(server.seen) == (2 if status == 503 else 1)


#: A code that forges a log line, and one of a megabyte (a megabyte line per retry).
FORGED = "x)\nINFO:idemkey.client:charge ch_123 refunded to account 4242 (ok"
HOSTILE_CODES = [FORGED, "A" * 1_000_000]
#: A detail that is a JSON array nested four deep, 7 long strings a level (a 500 kB body):
#: reprlib shows 6 items a level, 100 characters each, so the message ran to 130 kB.
DEEP: object = "D" * 200
for _ in range(4):
    DEEP = [DEEP] * 7


def tame(text: str, limit: int) -> bool:
    """``text`` is one printable line (no newline of the server's) of fewer than ``limit``
    characters."""
    return text.isprintable() and len(text) < limit


def head(text: str) -> str:
    """What an assertion shows of a line that may be a megabyte long."""
    return f"{len(text)} characters: {text[:150]!r}"


def problem_answer(status: int, code: str, detail: object = "") -> bytes:
    document = {"type": "urn:idemkey:problem:busy", "code": code, "detail": detail}
    headers = [("Content-Type", "application/problem+json")]
    return answer(status, headers, json.dumps(document).encode())


@pytest.mark.parametrize("shell", CLIENTS)
@pytest.mark.parametrize("code", HOSTILE_CODES, ids=["newline", "megabyte"])
def test_a_hostile_code_is_logged_and_raised_escaped_and_bounded(
    shell: str, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="idemkey.client")
    with ScriptedServer(lambda _: problem_answer(503, code)) as server:
        gives_up(shell, server.url, "attempts", 2)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "idemkey.client"]
    assert tame(line, 200), head(line)
    server = ScriptedServer(lambda _: problem_answer(503, code))
    with server, pytest.raises(RetriesExhaustedError) as gave_up:
        post(shell, server.url)
    message = str(gave_up.value)
    assert tame(message, 200), head(message)


@pytest.mark.parametrize("shell", CLIENTS)
@pytest.mark.parametrize(
    ("code", "detail"),
    [
        (FORGED, "no"),
        ("key_reused", "line one\nline two"),
        ("key_reused", "D" * 1_000_000),
        ("key_reused", DEEP),
    ],
    ids=["code", "detail-newline", "detail-megabyte", "detail-nested"],
)
def test_a_refusal_message_shows_hostile_text_escaped_and_bounded(
    shell: str, code: str, detail: object
) -> None:
    server = ScriptedServer(lambda _: problem_answer(422, code, detail))
    with server, pytest.raises(RefusedError) as refused:
        post(shell, server.url)
    message = str(refused.value)
    assert tame(message, 300), head(message)
    assert refused.value.problem["detail"] == detail  # the document itself, as it came


@pytest.mark.parametrize("shell", CLIENTS)
def test_a_refusal_message_shows_a_plain_detail_as_it_is(shell: str) -> None:
    detail = "The Idempotency-Key was used with another request"
    server = ScriptedServer(lambda _: problem_answer(422, "key_reused", detail))
    with server, pytest.raises(RefusedError) as refused:
        post(shell, server.url)
    assert str(refused.value) == f"422 key_reused: {detail}"
