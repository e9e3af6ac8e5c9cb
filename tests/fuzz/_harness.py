"""One hostile exchange through the sans-IO HTTP code, with every property checked.

Shared by the hypothesis tests (``test_hostile_input.py``) and the atheris target
(``fuzz_http.py``). :func:`run_exchange` takes raw material (a method, header lines as bytes,
a body, what the store answered, what the app answered, a policy variant) and walks
``idemkey.http`` exactly as an adapter does. Any exception other than the AssertionError of a
broken property is a bug: bad input must end in a well-formed response or a pass-through.

Properties:

* ``begin`` passes through (None), rejects with a 400 problem, or returns an Exchange;
* every Response idemkey builds is well formed: a status it documents, headers that are
  latin-1 text without CR/LF (no header injection from client input), a correct
  Content-Length, and, for problems, an RFC 9457 JSON body with a stable ``code``;
* a rejected request (400 / 413) never reaches the store: no Exchange, or no claim;
* a stored answer replays byte for byte (body, status, kept headers).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from idemkey import Policy
from idemkey._codec import StoredResponse, _sendable, decode_response, encode_response
from idemkey._core import Claimed, Decision, InFlight, Mismatch, Replay
from idemkey.http import (
    REPLAYED_HEADER,
    Complete,
    Exchange,
    Headers,
    Release,
    Request,
    Response,
    begin,
    content_length,
)
from idemkey.http._answers import plan_for
from tests._exchanges import decided

__all__ = ["Exchange", "Input", "policy_for", "run_exchange"]

PROBLEM_CODES = {
    # incomplete_body: a body shorter than its declared Content-Length (an ASGI request that
    # declares 3 bytes and sends none).
    400: {"missing_key", "invalid_key", "key_reused", "incomplete_body"},
    409: {"in_flight", "key_reused"},
    413: {"request_too_large"},
    422: {"key_reused"},
    503: {"record_unreadable", "store_unavailable"},
}


@dataclass
class Input:
    """Everything one fuzzed exchange is made of; bytes where the wire carries bytes."""

    method: bytes = b"POST"
    path: bytes = b"/charges"
    query: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    decision: int = 0  # 0 claimed, 1 replay of stored, 2 replay of the app's answer, 3, 4
    stored: bytes = b""  # what a Replay carries when decision == 1 (often garbage)
    # The app's answer. The app is trusted: its header names are tokens and its values
    # printable text (a fuzzer builds them so); client input is everything above.
    retry_after: float = 0.0
    status: int = 200
    response_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    response_body: bytes | None = b""
    variant: int = 0  # which policy


def policy_for(variant: int) -> Policy:
    """Eight policy variants: strict header, optional key, Stripe's 400, tiny body limit."""
    return Policy(
        strict_header=bool(variant & 1),
        require_key=not variant & 2,
        mismatch_status=400 if variant & 4 else 422,
        max_request_bytes=16 if variant & 4 else 1 << 20,
        store_server_errors=bool(variant & 2),
        methods=frozenset({"POST", "PATCH", "PUT"})
        if variant & 1
        else frozenset({"POST", "PATCH"}),
    )


_POLICIES = [policy_for(v) for v in range(8)]
_BREAKS = frozenset("\r\n\0")


def _text(raw: bytes) -> str:
    # What WSGI and ASGI servers hand over: header bytes decoded as latin-1.
    return raw.decode("latin-1")


def check_response(response: Response, allowed: set[int]) -> None:
    assert isinstance(response, Response)
    assert response.status in allowed, response.status
    assert isinstance(response.body, bytes)
    seen: dict[str, str] = {}
    for name, value in response.headers:
        name.encode("latin-1")  # a str that a server can send
        value.encode("latin-1")
        assert not _BREAKS.intersection(value), value  # no header injection
        assert not _BREAKS.union(":").intersection(name), name
        seen.setdefault(name.lower(), value)
    if "content-length" in seen:
        assert seen["content-length"] == str(len(response.body))
    if seen.get("content-type") == "application/problem+json":
        doc = json.loads(response.body)
        assert doc["status"] == response.status
        assert doc["code"] in PROBLEM_CODES[response.status], doc
        assert doc["type"].endswith(doc["code"])
        assert isinstance(doc["title"], str)
        assert isinstance(doc["detail"], str)


def run_exchange(data: Input) -> str:
    """Walk one exchange; return what happened (for statistics). Raises only AssertionError."""
    policy = _POLICIES[data.variant % len(_POLICIES)]
    method = _text(data.method)
    headers = Headers((_text(name), _text(value)) for name, value in data.headers)
    request = Request(method, _text(data.path), _text(data.query), headers)
    step = begin(policy, request)
    if step is None:
        guarded = method in policy.methods and bool(headers.get_all(policy.header))
        assert not guarded, "a keyed request on a guarded method passed through"
        return "pass"
    if isinstance(step, Response):
        check_response(step, {400})
        return "rejected"
    assert isinstance(step, Exchange)

    # The body: a declared Content-Length over the limit is refused before reading.
    declared = content_length(headers)
    limit = policy.max_request_bytes
    if (declared is not None and declared > limit) or len(data.body) > limit:
        check_response(step.reject_too_large(), {413})
        return "too_large"

    fingerprint = step.fingerprint(data.body)
    assert isinstance(fingerprint, bytes)
    assert len(fingerprint) == 16  # raw xxh3-128, as the record stores it

    # The claim's answer.
    app_headers = [(_text(n), _text(v)) for n, v in data.response_headers]
    decision: Decision
    kind = data.decision % 5
    unsendable = False
    if kind == 0:
        decision = Claimed("owner", 1, False)
    elif kind == 1:
        decision = Replay(data.stored)
    elif kind == 2:
        status = min(max(data.status, 100), 599)
        forged = StoredResponse(status, tuple(app_headers), data.body)
        # A 1xx, a hop-by-hop line or a value h11 refuses: no server sends it, so no replay.
        unsendable = status < 200 or not _sendable(forged)
        decision = Replay(encode_response(forged))
    elif kind == 3:
        retry = data.retry_after
        decision = InFlight(retry if math.isfinite(retry) and retry >= 0 else 0.0)
    else:
        decision = Mismatch()
    received = step.received(data.body)
    if received is not None:  # shorter than its Content-Length: refused, nothing claimed
        check_response(received, {400})
        return "rejected"
    step.claiming()
    answer = step.decide(decision)
    if isinstance(answer, Response):
        if kind == 1:
            # Whatever bytes the record held: an answer, never an exception. (A record is
            # written by idemkey; garbage here means someone else wrote into Redis.)
            assert answer.status == 503 or isinstance(answer.status, int)
            return "answered"
        if kind == 2 and unsendable:
            check_response(answer, {503})  # record_unreadable
            return "answered"
        check_response(answer, set(range(200, 600)) if kind == 2 else {409, 400, 422})
        if kind == 2:
            assert answer.body == data.body
            assert (REPLAYED_HEADER, "true") in answer.headers
        return "answered"
    assert answer is None
    assert step.claim is decision
    step.fail("the app's answer is built below, without this exchange")  # not current now

    # The app answered: store it or release the key, and replay it byte for byte.
    status = data.status
    plan = plan_for(policy, status, app_headers, data.response_body)
    if isinstance(plan, Release):
        assert status >= 500 or status < 200 or status in policy.release_statuses  # 1xx: interim
        return "released"
    assert isinstance(plan, Complete)
    stored = decode_response(plan.stored)
    assert stored.status == status
    retry = begin(policy, request)  # the retry that gets the record
    assert isinstance(retry, Exchange)
    replay = decided(retry, Replay(plan.stored), data.body)
    assert isinstance(replay, Response)
    check_response(replay, {status})
    sent = (
        data.response_body if data.response_body is not None and status not in (204, 304) else b""
    )
    assert replay.body == sent  # a 204 or 304 carries no body, whatever the app gave
    for name, _ in stored.headers:
        assert name.lower() not in policy.header_denylist, name
    return "completed"


def describe(data: Input) -> dict[str, Any]:
    """A readable dump of an input, for a failing atheris case."""
    return {name: getattr(data, name) for name in Input.__dataclass_fields__}
