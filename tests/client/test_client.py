"""The I/O shells over httpx's MockTransport: keys, bytes, hooks, logs, errors, transports.

No network: what a real server does with these requests is in ``test_faults.py``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from idemkey.client import (
    AsyncClient,
    AsyncIdempotentTransport,
    Client,
    IdempotentTransport,
    RefusedError,
    RetriesExhaustedError,
    RetryEvent,
    RetryPolicy,
)
from idemkey.errors import ConfigurationError, IdemkeyError, InvalidKeyError

NOW = RetryPolicy(max_attempts=3, backoff=0.0, backoff_cap=0.0, deadline=30.0)

Handler = Callable[[httpx.Request], httpx.Response]


def problem(status: int, code: str, **headers: str) -> httpx.Response:
    body = {"type": f"urn:idemkey:problem:{code}", "status": status, "code": code, "detail": "no"}
    return httpx.Response(
        status, headers={"content-type": "application/problem+json", **headers}, json=body
    )


def scripted(*answers: httpx.Response | Exception) -> tuple[Handler, list[httpx.Request]]:
    """A MockTransport handler that gives ``answers`` in order (the last one forever)."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers[min(len(seen), len(answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return handler, seen


def client(handler: Handler, retry: RetryPolicy = NOW, **kwargs: Any) -> Client:
    return Client(
        transport=httpx.MockTransport(handler), base_url="http://api.test", retry=retry, **kwargs
    )


def test_the_key_is_fixed_before_the_first_attempt_and_kept() -> None:
    handler, seen = scripted(httpx.ReadTimeout("slow"), httpx.Response(201, json={"id": 1}))
    with client(handler) as api:
        operation = api.prepare("POST", "/charges", json={"amount": 1000})
        assert seen == []  # nothing sent yet, but the key is known
        reply = api.send(operation)
    assert reply.key == operation.key
    assert reply.attempts == 2
    assert [r.headers["Idempotency-Key"] for r in seen] == [operation.key] * 2
    # The same bytes on every attempt (their spacing is httpx's: 0.27 puts a space after ":").
    assert seen[0].content == seen[1].content
    assert json.loads(seen[0].content) == {"amount": 1000}
    assert reply.json() == {"id": 1}
    assert not reply.replayed


def test_the_callers_key_wins() -> None:
    handler, seen = scripted(httpx.Response(201))
    with client(handler) as api:
        api.post("/charges", json={}, idempotency_key="job-42")
        api.post("/charges", json={}, headers={"Idempotency-Key": "job-43"})
        first = api.prepare("POST", "/charges", json={})
        second = api.prepare("POST", "/charges", json={})
    assert [r.headers["Idempotency-Key"] for r in seen] == ["job-42", "job-43"]
    assert first.key != second.key  # one key per logical call


@pytest.mark.parametrize("key", ["", "a b", "é", "x" * 256, "a,b", 42, b"job-42"])
def test_an_invalid_key_is_refused_before_sending(key: object) -> None:
    """A key that is not a string too: it was a bare AttributeError or TypeError."""
    handler, seen = scripted(httpx.Response(201))
    with client(handler) as api, pytest.raises(InvalidKeyError):
        api.prepare("POST", "/charges", json={}, idempotency_key=key)  # type: ignore[arg-type]
    assert seen == []


async def test_an_async_stream_cannot_be_resent_byte_for_byte() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"{}"

    async with AsyncClient(base_url="http://api.test") as api:
        with pytest.raises(ConfigurationError):
            api.prepare("POST", "/charges", content=chunks())


def test_a_replay_is_reported() -> None:
    replayed = httpx.Response(201, headers={"Idempotent-Replayed": "true"}, json={"id": 1})
    handler, _ = scripted(replayed)
    with client(handler) as api:
        assert api.post("/charges", json={}).replayed


def test_each_attempt_fits_in_what_is_left_of_the_deadline() -> None:
    handler, seen = scripted(httpx.Response(201))
    with client(handler, timeout=5.0, retry=RetryPolicy(deadline=1.0)) as api:
        api.post("/charges", json={})
    assert all(0 < value <= 1.0 for value in seen[0].extensions["timeout"].values())


def test_one_hook_call_and_one_log_line_per_retry(caplog: pytest.LogCaptureFixture) -> None:
    handler, _ = scripted(
        httpx.ConnectError("refused"), problem(409, "in_flight"), httpx.Response(201)
    )
    events: list[RetryEvent] = []
    caplog.set_level(logging.INFO, logger="idemkey.client")
    with client(handler, on_retry=events.append) as api:
        operation = api.prepare("POST", "/charges?token=secret", json={})
        api.send(operation)
    assert [(e.attempt, e.reason) for e in events] == [(1, "connect"), (2, "409 in_flight")]
    assert all(e.operation is operation for e in events)
    lines = [r.getMessage() for r in caplog.records if r.name == "idemkey.client"]
    assert len(lines) == 2
    assert lines[0].startswith("retrying POST http://api.test/charges in ")
    assert all("secret" not in line and operation.key not in line for line in lines)


def test_a_retry_line_never_carries_the_urls_password(caplog: pytest.LogCaptureFixture) -> None:
    handler, _ = scripted(httpx.Response(503), httpx.Response(201))
    caplog.set_level(logging.INFO, logger="idemkey.client")
    api = Client(transport=httpx.MockTransport(handler), retry=NOW)
    with api:
        api.post("https://api-user:SECRET-PASSWORD@api.example/charges", json={})
    lines = [r.getMessage() for r in caplog.records if r.name == "idemkey.client"]
    assert lines == [lines[0]]
    assert lines[0].startswith("retrying POST https://api.example/charges in ")
    assert "SECRET" not in lines[0]
    assert "api-user" not in lines[0]


def test_a_failing_hook_is_logged_and_the_retry_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    handler, seen = scripted(httpx.ReadError("reset"), httpx.Response(201))

    def hook(event: RetryEvent) -> None:
        raise RuntimeError("hook bug")

    with client(handler, on_retry=hook) as api:
        assert api.post("/charges", json={}).status_code == 201
    assert len(seen) == 2
    assert any("on_retry hook raised" in r.getMessage() for r in caplog.records)


def test_a_refusal_raises_with_the_problem() -> None:
    handler, seen = scripted(problem(422, "key_reused"))
    with client(handler) as api, pytest.raises(RefusedError) as refused:
        api.post("/charges", json={})
    assert isinstance(refused.value, IdemkeyError)
    assert (refused.value.code, refused.value.status, refused.value.attempts) == (
        "key_reused",
        422,
        1,
    )
    assert refused.value.problem["detail"] == "no"
    assert len(seen) == 1


def test_giving_up_after_the_attempt_budget() -> None:
    handler, seen = scripted(httpx.ConnectError("refused"))
    with client(handler) as api, pytest.raises(RetriesExhaustedError) as gave_up:
        api.post("/charges", json={})
    assert (gave_up.value.reason, gave_up.value.last, gave_up.value.attempts) == (
        "attempts",
        "connect",
        3,
    )
    assert isinstance(gave_up.value.__cause__, httpx.ConnectError)
    assert gave_up.value.response is None
    assert len(seen) == 3


def test_giving_up_at_the_deadline_keeps_the_last_response() -> None:
    handler, seen = scripted(httpx.Response(503, headers={"Retry-After": "120"}))
    with client(handler) as api, pytest.raises(RetriesExhaustedError) as gave_up:
        api.post("/charges", json={})
    assert gave_up.value.reason == "deadline"  # 120 s is past the 30 s deadline: no wait
    assert gave_up.value.response is not None
    assert gave_up.value.response.status_code == 503
    assert len(seen) == 1


def test_a_post_given_up_hands_over_the_key_it_sent_to_resume_with() -> None:
    """post() makes its key where the caller never sees it: after RetriesExhaustedError the
    only retry was another post(), a new key, the operation run twice. The error holds the
    key; idempotency_key=key resumes the same operation."""
    handler, seen = scripted(httpx.ConnectError("refused"), httpx.ConnectError("refused"))
    with client(handler) as api, pytest.raises(RetriesExhaustedError) as gave_up:
        api.post("/charges", json={})
    sent = {request.headers["Idempotency-Key"] for request in seen}
    assert sent == {gave_up.value.key}
    assert gave_up.value.key not in str(gave_up.value)  # an attribute, never the message


def test_an_error_no_retry_can_fix_is_raised_at_once() -> None:
    handler, seen = scripted(httpx.LocalProtocolError("bad header"))
    with client(handler) as api, pytest.raises(httpx.LocalProtocolError):
        api.post("/charges", json={})
    assert len(seen) == 1


def test_http_client_and_options_do_not_mix() -> None:
    with httpx.Client() as http, pytest.raises(ConfigurationError):
        Client(http, base_url="http://api.test")


def test_wrapping_an_existing_httpx_client_leaves_it_open() -> None:
    handler, _ = scripted(httpx.Response(201))
    http = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://api.test")
    with Client(http, retry=NOW) as api:
        api.patch("/charges/1", json={"amount": 1})
    assert not http.is_closed
    http.close()


# ---- the transports -----------------------------------------------------------------------


def test_transport_keys_and_retries_writes_only() -> None:
    handler, seen = scripted(httpx.RemoteProtocolError("dropped"), httpx.Response(201))
    transport = IdempotentTransport(httpx.MockTransport(handler), retry=NOW)
    with httpx.Client(transport=transport, base_url="http://api.test") as http:
        assert http.post("/charges", json={"a": 1}).status_code == 201
        http.get("/charges")
    post1, post2, get = seen
    assert post1.headers["Idempotency-Key"] == post2.headers["Idempotency-Key"]
    assert post1.content == post2.content
    assert "Idempotency-Key" not in get.headers


def test_transport_hands_back_refusals_and_last_answers() -> None:
    handler, _ = scripted(problem(422, "key_reused"))
    with httpx.Client(
        transport=IdempotentTransport(httpx.MockTransport(handler), retry=NOW)
    ) as http:
        assert http.post("http://api.test/charges", json={}).json()["code"] == "key_reused"
    handler, seen = scripted(httpx.Response(503))
    with httpx.Client(
        transport=IdempotentTransport(httpx.MockTransport(handler), retry=NOW)
    ) as http:
        assert http.post("http://api.test/charges", json={}).status_code == 503
    assert len(seen) == 3
    handler, _ = scripted(httpx.ConnectError("refused"))
    with (
        httpx.Client(
            transport=IdempotentTransport(httpx.MockTransport(handler), retry=NOW)
        ) as http,
        pytest.raises(httpx.ConnectError),
    ):
        http.post("http://api.test/charges", json={})


async def test_async_client_and_transport() -> None:
    handler, seen = scripted(httpx.ReadTimeout("slow"), httpx.Response(201, json={"id": 7}))
    async with AsyncClient(
        transport=httpx.MockTransport(handler), base_url="http://api.test", retry=NOW
    ) as api:
        reply = await api.post("/charges", data={"amount": "1"}, files={"f": ("a.txt", b"x")})
    assert reply.attempts == 2
    assert seen[0].content == seen[1].content
    assert seen[0].headers["content-type"] == seen[1].headers["content-type"]

    handler, seen = scripted(httpx.ReadError("reset"), httpx.Response(201))
    transport = AsyncIdempotentTransport(httpx.MockTransport(handler), retry=NOW)
    async with httpx.AsyncClient(transport=transport) as http:
        assert (await http.post("http://api.test/charges", content=b"{}")).status_code == 201
    assert seen[0].headers["Idempotency-Key"] == seen[1].headers["Idempotency-Key"]
    assert json.loads(seen[1].content) == {}
