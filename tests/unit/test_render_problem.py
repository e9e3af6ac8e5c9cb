"""Policy.render_problem: idemkey's own answers in the API's error shape (sans-IO).

Every answer idemkey gives on its own (400, 409, 413, 422, 503) goes through the hook; the
status and Retry-After stay idemkey's. The shape used is Stripe's, which its SDK needs to raise
``IdempotencyError`` (tests/frameworks/test_stripe.py runs the SDK against a real server).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from idemkey import Policy, StoreError
from idemkey._core import InFlight, Mismatch, Replay
from idemkey.http import Exchange, Headers, Problem, Request, Response, begin
from tests._exchanges import decided

SEEN: list[Problem] = []


def stripe_errors(problem: Problem) -> tuple[str, bytes]:
    SEEN.append(problem)
    error = {"type": "idempotency_error", "code": problem.code, "message": problem.detail}
    return "application/json", json.dumps({"error": error}).encode()


STRIPE = Policy(render_problem=stripe_errors)


def request(headers: list[tuple[str, str]] | None = None) -> Request:
    if headers is None:
        headers = [("Idempotency-Key", "k1")]
    return Request("POST", "/charges", "", Headers(headers))


def exchange(policy: Policy = STRIPE) -> Exchange:
    step = begin(policy, request())
    assert isinstance(step, Exchange)
    return step


def stripe_body(response: Response, status: int, code: str) -> dict[str, Any]:
    assert response.status == status
    headers = dict(response.headers)
    assert headers["Content-Type"] == "application/json"
    assert headers["Content-Length"] == str(len(response.body))
    body: dict[str, Any] = json.loads(response.body)
    assert body == {
        "error": {"type": "idempotency_error", "code": code, "message": body["error"]["message"]}
    }
    return body


def test_missing_and_invalid_keys_are_400_in_the_api_shape() -> None:
    missing = begin(STRIPE, request([]))
    assert isinstance(missing, Response)
    stripe_body(missing, 400, "missing_key")
    invalid = begin(STRIPE, request([("Idempotency-Key", "a b")]))
    assert isinstance(invalid, Response)
    stripe_body(invalid, 400, "invalid_key")


def test_in_flight_is_409_and_keeps_retry_after() -> None:
    SEEN.clear()
    answer = decided(exchange(), InFlight(5.0))
    assert isinstance(answer, Response)
    stripe_body(answer, 409, "in_flight")
    assert dict(answer.headers)["Retry-After"] == "1"
    assert SEEN[-1].retry_after == 1
    assert SEEN[-1].title  # the hook gets the human title too


@pytest.mark.parametrize("status", [400, 422])
def test_key_reuse_keeps_the_configured_status(status: int) -> None:
    answer = decided(exchange(STRIPE.replace(mismatch_status=status)), Mismatch())
    assert isinstance(answer, Response)
    stripe_body(answer, status, "key_reused")


def test_too_large_is_413() -> None:
    stripe_body(exchange().reject_too_large(), 413, "request_too_large")


def test_store_errors_are_503_with_the_policy_retry_after() -> None:
    answer = exchange(STRIPE.replace(store_error_retry_after=7))._failed(StoreError("down"))
    assert isinstance(answer, Response)
    stripe_body(answer, 503, "store_unavailable")
    assert dict(answer.headers)["Retry-After"] == "7"
    unreadable = decided(exchange(), Replay(b"not a record"))
    assert isinstance(unreadable, Response)
    stripe_body(unreadable, 503, "record_unreadable")
    assert dict(unreadable.headers)["Retry-After"] == "1"


def test_the_default_stays_rfc_9457() -> None:
    answer = begin(Policy(), request([]))
    assert isinstance(answer, Response)
    assert dict(answer.headers)["Content-Type"] == "application/problem+json"
    assert json.loads(answer.body)["code"] == "missing_key"


def broken_raises(problem: Problem) -> tuple[str, bytes]:
    raise KeyError("oops")


def broken_returns_text(problem: Problem) -> tuple[str, bytes]:
    return "application/json", "not bytes"  # type: ignore[return-value]


def returning_content_type(content_type: str) -> Any:
    def render(problem: Problem) -> tuple[str, bytes]:
        return content_type, b"{}"

    return render


@pytest.mark.parametrize(
    "renderer",
    [
        broken_raises,
        broken_returns_text,
        returning_content_type("application/vnd.err+json\r\nX-Injected: yes"),  # a split head
        returning_content_type("application/vnd.err+json\rX-Injected: yes"),
        returning_content_type("application/vnd.err+json\nX-Injected: yes"),
        returning_content_type("application/vnd.err+json\x00"),
    ],
)
def test_a_broken_renderer_falls_back_to_rfc_9457_and_is_logged(
    renderer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="idemkey"):
        answer = decided(exchange(Policy(render_problem=renderer)), InFlight(1.0))
    assert isinstance(answer, Response)
    assert answer.status == 409
    assert dict(answer.headers)["Retry-After"] == "1"
    assert dict(answer.headers)["Content-Type"] == "application/problem+json"
    assert "render_problem failed" in caplog.text


def test_a_body_shorter_than_its_content_length_is_400_in_the_api_shape() -> None:
    headers = [("Idempotency-Key", "k1"), ("Content-Length", "10")]
    step = begin(STRIPE, request(headers))
    assert isinstance(step, Exchange)
    answer = step.received(b"short")
    assert isinstance(answer, Response)
    stripe_body(answer, 400, "incomplete_body")
