"""The sans-IO HTTP exchange (idemkey/http/), without Redis or a framework.

Each test is one row of docs/design.md#http-decisions decided by ``begin`` / ``Exchange`` alone; the
adapter suite (tests/adapters/test_suite.py) then proves the same rows through every adapter.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from idemkey import Event, Policy, StoredResponse, StoreError
from idemkey.http import (
    BODY_NOT_KEPT_HEADER,
    REPLAYED_HEADER,
    RETRY,
    BodyCopy,
    Complete,
    Exchange,
    Headers,
    Release,
    Request,
    Response,
    begin,
    content_length,
    problem,
)
from idemkey.http._answers import plan_for
from idemkey.policy import credential_scope
from idemkey.records import Claimed, InFlight, Mismatch, Replay, decode_response, encode_response
from tests._exchanges import decided


def request(
    method: str = "POST",
    path: str = "/charges",
    headers: list[tuple[str, str]] | None = None,
    query: str = "",
) -> Request:
    if headers is None:
        headers = [("Idempotency-Key", "k1"), ("Content-Type", "application/json")]
    return Request(method, path, query, Headers(headers))


def exchange(policy: Policy | None = None, **kwargs: Any) -> Exchange:
    step = begin(policy or Policy(), request(**kwargs))
    assert isinstance(step, Exchange)
    return step


def problem_body(response: Response) -> dict[str, Any]:
    assert dict(response.headers)["Content-Type"] == "application/problem+json"
    body: dict[str, Any] = json.loads(response.body)
    assert set(body) == {"type", "title", "status", "detail", "code", "retention", "retry"}
    assert body["retention"] == 86_400  # Policy().ttl, in whole seconds
    assert body["retry"] == RETRY[body["code"]]
    assert body["status"] == response.status
    assert body["type"] == f"urn:idemkey:problem:{body['code']}"
    assert dict(response.headers)["Content-Length"] == str(len(response.body))
    return body


# ---- begin: before anything is read --------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"])
def test_unguarded_methods_pass_through_even_with_a_key(method: str) -> None:
    assert begin(Policy(), request(method)) is None


def test_a_missing_key_is_400_or_passes_when_not_required() -> None:
    answer = begin(Policy(), request(headers=[]))
    assert isinstance(answer, Response)
    assert answer.status == 400
    assert problem_body(answer)["code"] == "missing_key"
    assert begin(Policy(require_key=False), request(headers=[])) is None


@pytest.mark.parametrize(
    "values",
    [[""], ["a" * 256], ["caf\xe9"], ["a b"], ["k1", "k2"], ['"unterminated']],
    ids=["empty", "too-long", "non-ascii", "space", "two-lines", "bad-sf-string"],
)
def test_invalid_keys_are_400(values: list[str]) -> None:
    answer = begin(Policy(), request(headers=[("Idempotency-Key", v) for v in values]))
    assert isinstance(answer, Response)
    assert answer.status == 400
    assert problem_body(answer)["code"] == "invalid_key"


def test_quoted_and_bare_keys_name_the_same_record() -> None:
    bare = exchange(headers=[("Idempotency-Key", "abc")])
    quoted = exchange(headers=[("idempotency-key", '"abc"')])
    assert bare.record == quoted.record
    strict = begin(Policy(strict_header=True), request(headers=[("Idempotency-Key", "abc")]))
    assert isinstance(strict, Response)
    assert strict.status == 400


def test_scope_and_route_separate_records() -> None:
    alice = exchange(headers=[("Idempotency-Key", "k"), ("Authorization", "Bearer alice")])
    bob = exchange(headers=[("Idempotency-Key", "k"), ("Authorization", "Bearer bob")])
    refunds = exchange(
        headers=[("Idempotency-Key", "k"), ("Authorization", "Bearer alice")], path="/refunds"
    )
    assert len({alice.record, bob.record, refunds.record}) == 3


def test_the_default_scope_digests_credentials_and_never_shows_them() -> None:
    scope = credential_scope(request(headers=[("Authorization", "Bearer secret")]))
    assert "secret" not in scope
    assert scope != credential_scope(request(headers=[("Authorization", "Bearer other")]))
    assert scope != credential_scope(request(headers=[("Cookie", "Bearer secret")]))
    assert scope == credential_scope(request(headers=[("authorization", "Bearer secret")]))


@pytest.mark.parametrize(
    "name",
    ["X-Auth-Token", "Api-Key", "X-Api-Key", "Proxy-Authorization", "X-Session-Id",
     "X-Client-Secret", "Private-Token", "X-Amz-Security-Token", "Ocp-Apim-Subscription-Key"],
)  # fmt: skip
def test_the_default_scope_digests_every_header_named_as_a_credential(name: str) -> None:
    alice = exchange(headers=[("Idempotency-Key", "k"), (name, "alice")])
    bob = exchange(headers=[("Idempotency-Key", "k"), (name, "bob")])
    anonymous = exchange(headers=[("Idempotency-Key", "k")])
    assert len({alice.record, bob.record, anonymous.record}) == 3
    assert "alice" not in credential_scope(request(headers=[(name, "alice")]))


def test_the_default_scope_ignores_header_order_ordinary_headers_and_the_key() -> None:
    tenant = [("Api-Key", "a"), ("X-Auth-Token", "t"), ("Cookie", "c")]
    one = credential_scope(request(headers=[("Idempotency-Key", "k1"), *tenant]))
    shuffled = [
        ("Accept", "*/*"),
        *reversed(tenant),
        ("Keep-Alive", "5"),
        ("Idempotency-Key", "k2"),
    ]
    assert credential_scope(request(headers=shuffled)) == one
    # The idempotency key is no credential, whatever the policy names its header.
    custom = Policy(header="X-Request-Key")
    a = exchange(custom, headers=[("X-Request-Key", "k1"), ("X-Auth-Token", "t")])
    b = exchange(custom, headers=[("X-Request-Key", "k2"), ("X-Auth-Token", "t")])
    assert a.scope == b.scope
    ordinary = [("Sec-WebSocket-Key", "w"), ("X-Idempotency-Key", "x"), ("Content-Type", "a/b")]
    assert credential_scope(request(headers=ordinary)) == credential_scope(request(headers=[]))


def test_the_default_scope_reads_a_wsgi_environ_as_it_reads_headers() -> None:
    from idemkey.adapters._environ import request_of

    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/charges", "CONTENT_TYPE": "a/b",
               "HTTP_X_AUTH_TOKEN": "t", "HTTP_IDEMPOTENCY_KEY": "k"}  # fmt: skip
    headers = [("X-Auth-Token", "t"), ("Idempotency-Key", "other")]
    assert credential_scope(request_of(environ)) == credential_scope(request(headers=headers))


def test_the_default_scope_of_the_first_three_credentials_is_unchanged() -> None:
    # Authorization, X-Api-Key and Cookie alone keep the digest every earlier release gave
    # them, so records written before an upgrade are still found after it.
    import hashlib

    headers = [("Cookie", "c=1"), ("Authorization", "Bearer x"), ("Idempotency-Key", "k")]
    before = hashlib.blake2b(b"8:Bearer x;;3:c=1;", digest_size=16).hexdigest()
    assert credential_scope(request(headers=headers)) == before
    none = hashlib.blake2b(b";;;", digest_size=16).hexdigest()
    assert credential_scope(request(headers=[("Idempotency-Key", "k")])) == none
    # A second Cookie line (ASGI keeps them apart) counts too.
    two = credential_scope(request(headers=[*headers, ("Cookie", "d=2")]))
    assert two not in (before, credential_scope(request(headers=[*headers, ("Cookie", "d=3")])))


def test_a_scope_that_is_not_a_string_is_a_500_problem_and_nothing_is_claimed() -> None:
    # The app's bug (None for an anonymous user): a problem answer, never a traceback.
    answer = begin(Policy(scope=lambda request: None), request())  # type: ignore[arg-type,return-value]
    assert isinstance(answer, Response)
    assert answer.status == 500
    assert json.loads(answer.body)["code"] == "invalid_scope"


# ---- the body and the fingerprint ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("12", 12),
        (" 12\t", 12),
        ("9" * 18, 999_999_999_999_999_999),
        ("1" + "0" * 30, 10**30),
        # Past the digits int() converts (4 300 by default): a length past every limit
        # (10**18), not int()'s ValueError; leading zeros are digits too.
        ("9" * 5000, 10**18),
        ("0" * 5000 + "5", 5),
        ("0" * 5000, 0),
        ("", None),
        ("-1", None),
        ("1e3", None),
        ("1\xb3", None),
        ("0\x1c", None),
        ("١٢", None),
    ],
)
def test_content_length_is_ascii_digits_or_nothing(value: str, expected: int | None) -> None:
    assert content_length(Headers([("Content-Length", value)])) == expected


def test_too_large_is_413_with_a_problem_body() -> None:
    assert exchange(Policy(max_request_bytes=10)).received(b"x" * 10) is None
    answer = exchange(Policy(max_request_bytes=10)).received(b"x" * 11)
    assert answer is not None
    assert answer.status == 413
    assert problem_body(answer)["code"] == "request_too_large"


def test_the_fingerprint_covers_body_path_query_and_content_type() -> None:
    base = exchange(query="a=1&b=2")
    fp = base.fingerprint(b"{}")
    assert fp == exchange(query="b=2&a=1").fingerprint(b"{}")  # parameter order: same request
    assert fp != base.fingerprint(b"{ }")
    assert fp != exchange(query="a=1&b=3").fingerprint(b"{}")
    assert fp != exchange(path="/charges/2", query="a=1&b=2").fingerprint(b"{}")
    other_type = exchange(
        headers=[("Idempotency-Key", "k1"), ("Content-Type", "text/plain")], query="a=1&b=2"
    )
    assert fp != other_type.fingerprint(b"{}")


# ---- what the claim means ------------------------------------------------------------------


def test_claimed_runs_the_handler() -> None:
    step = exchange()
    claimed = Claimed("owner", 3, False)
    assert decided(step, claimed) is None
    assert step.claim is claimed
    assert step.call is not None
    assert step.call.fence == 3
    step.fail("the test ends here")  # the claim's call is no longer current


def test_a_replay_is_byte_identical_with_recomputed_length_and_a_marker() -> None:
    stored = StoredResponse(
        201,
        (("Content-Type", "application/json"), ("Content-Length", "99"), ("X-Charge-Id", "ch_1")),
        b'{"id":"ch_1"}',
    )
    answer = decided(exchange(), Replay(encode_response(stored)))
    assert isinstance(answer, Response)
    assert answer.status == 201
    assert answer.body == b'{"id":"ch_1"}'
    assert answer.headers == [  # in the stored order; the length set where it stood
        ("Content-Type", "application/json"),
        ("Content-Length", "13"),
        ("X-Charge-Id", "ch_1"),
        (REPLAYED_HEADER, "true"),
    ]


def test_a_replay_adds_no_content_length_the_first_answer_lacked() -> None:
    stored = StoredResponse(204, (("X-Run", "1"),), b"", reason="Done")
    answer = decided(exchange(), Replay(encode_response(stored)))
    assert isinstance(answer, Response)
    assert answer.headers == [("X-Run", "1"), (REPLAYED_HEADER, "true")]
    assert answer.reason == "Done"


def test_a_replay_without_its_body_says_so() -> None:
    stored = StoredResponse(201, (("Content-Length", "5000000"),), b"", body_kept=False)
    answer = decided(exchange(), Replay(encode_response(stored)))
    assert isinstance(answer, Response)
    assert answer.body == b""
    assert (BODY_NOT_KEPT_HEADER, "true") in answer.headers
    assert ("Content-Length", "0") in answer.headers


def test_an_unreadable_stored_record_is_a_503_not_a_crash() -> None:
    answer = decided(exchange(), Replay(b"\x7fgarbage"))
    assert isinstance(answer, Response)
    assert answer.status == 503
    assert problem_body(answer)["code"] == "record_unreadable"


@pytest.mark.parametrize("status", [422, 400])
def test_a_mismatch_is_the_policy_status(status: int) -> None:
    answer = decided(exchange(Policy(mismatch_status=status)), Mismatch())
    assert isinstance(answer, Response)
    assert answer.status == status
    assert problem_body(answer)["code"] == "key_reused"


@pytest.mark.parametrize(("left", "header"), [(29.9, "1"), (0.2, "1"), (0.0, "1")])
def test_in_flight_is_409_with_retry_after(left: float, header: str) -> None:
    answer = decided(exchange(), InFlight(left))
    assert isinstance(answer, Response)
    assert answer.status == 409
    assert dict(answer.headers)["Retry-After"] == header
    assert problem_body(answer)["code"] == "in_flight"


def test_a_store_error_fails_closed_or_open() -> None:

    closed = exchange()._failed(StoreError("down"))
    assert isinstance(closed, Response)
    assert closed.status == 503
    assert dict(closed.headers)["Retry-After"] == "1"
    assert problem_body(closed)["code"] == "store_unavailable"
    events: list[Event] = []
    opened = exchange(Policy(on_store_error="open", on_event=events.append))
    assert opened._failed(StoreError("down")) is None
    assert [event.kind for event in events] == ["unprotected"]


# ---- after the handler: store or release ---------------------------------------------------


@pytest.mark.parametrize(
    ("status", "stored"),
    [
        (200, True),
        (201, True),
        (302, True),
        (402, True),
        (410, True),
        (400, False),
        (401, False),
        (404, False),
        (409, False),
        (422, False),
        (429, False),
        (500, False),
        (503, False),
        (99, False),
        (600, False),
    ],
)
def test_finish_stores_outcomes_and_releases_the_rest(status: int, stored: bool) -> None:
    plan = plan_for(Policy(), status, [("Content-Type", "text/plain")], b"body")
    assert isinstance(plan, Complete if stored else Release)


def test_store_server_errors_keeps_5xx() -> None:
    plan = plan_for(Policy(store_server_errors=True), 503, [], b"down")
    assert isinstance(plan, Complete)
    assert decode_response(plan.stored).status == 503


def test_finish_drops_hop_by_hop_date_and_set_cookie_headers() -> None:
    headers = [
        ("Content-Type", "application/json"),
        ("Set-Cookie", "s=1"),
        ("Date", "x"),
        ("Connection", "close"),
        ("Transfer-Encoding", "chunked"),
        ("X-Id", "1"),
    ]
    plan = plan_for(Policy(), 201, headers, b"{}")
    assert isinstance(plan, Complete)
    kept = decode_response(plan.stored)
    assert kept.headers == (("Content-Type", "application/json"), ("X-Id", "1"))
    allow = plan_for(Policy(header_allowlist=frozenset({"X-ID"})), 201, headers, b"{}")
    assert isinstance(allow, Complete)
    assert decode_response(allow.stored).headers == (("X-Id", "1"),)


@pytest.mark.parametrize(
    "policy",
    [
        Policy(header_denylist=frozenset()),
        Policy(header_denylist=frozenset(), header_allowlist=frozenset({"connection", "x-a"})),
    ],
    ids=["empty-denylist", "allowlist"],
)
def test_finish_leaves_out_lines_no_server_replays_whatever_the_lists_say(policy: Policy) -> None:
    # What a replay refuses is never stored: a hop-by-hop line (waitress answers 500 for it) or
    # a value h11 refuses (uvicorn drops the connection), on every retry otherwise. A value's
    # leading or trailing OWS is no part of it (RFC 9110 5.5): kept without it.
    headers = [
        ("Connection", "close"),
        ("X-A", "1"),
        ("Transfer-Encoding", "chunked"),
        ("X-A", " padded"),
        ("X-A", "padded\t"),
        ("X-A", "a\x0bb"),
        ("X-A", "a \t b"),
    ]
    plan = plan_for(policy, 201, headers, b"{}")
    assert isinstance(plan, Complete)
    assert decode_response(plan.stored).headers == (
        ("X-A", "1"),
        ("X-A", "padded"),
        ("X-A", "padded"),
        ("X-A", "a \t b"),
    )


def test_finish_without_a_body_stores_status_and_headers_only() -> None:
    plan = plan_for(Policy(), 201, [("Content-Type", "text/csv")], None)
    assert isinstance(plan, Complete)
    assert decode_response(plan.stored) == StoredResponse(
        201, (("Content-Type", "text/csv"),), b"", body_kept=False
    )


def test_problem_bodies_are_rfc_9457() -> None:
    answer = problem(418, "teapot", "short and stout", [("Retry-After", "3")], retention=60)
    body = json.loads(answer.body)
    assert body == {
        "type": "urn:idemkey:problem:teapot",
        "title": "teapot",
        "status": 418,
        "detail": "short and stout",
        "code": "teapot",
        "retention": 60,
        "retry": "never",  # a code the table does not know: never retried blindly
    }
    assert ("Retry-After", "3") in answer.headers


def test_the_body_copy_keeps_one_block_or_a_sized_body_within_the_limit() -> None:
    single = BodyCopy(10)
    single.start([("Content-Type", "text/plain")])
    single.add(b"hello")
    single.add(b"")  # an empty final block (ASGI's more_body=False) is not a second block
    assert single.body() == b"hello"

    sized = BodyCopy(10)
    sized.start([("Content-Length", "6")])
    for block in (b"abc", b"def"):
        sized.add(block)
    assert sized.body() == b"abcdef"


def test_the_body_copy_is_dropped_when_streamed_or_too_large() -> None:
    streamed = BodyCopy(100)
    streamed.start([])
    streamed.add(b"one")
    streamed.add(b"two")  # several blocks, no length: a stream
    assert streamed.dropped
    assert streamed.body() is None
    assert not streamed.too_large

    large = BodyCopy(4)
    large.start([("content-length", "5")])
    large.add(b"12345")
    assert large.too_large
    assert large.body() is None


def test_the_body_copy_counts_size_after_it_is_dropped() -> None:
    stream = BodyCopy(10)
    stream.start([])
    for _ in range(4):
        stream.add(b"1234")  # dropped as a stream at the second block, still measured
    assert stream.too_large  # so a drain of an endless body stops


def test_headers_from_latin1_hold_what_decoded_pairs_give() -> None:
    raw = [(b"Content-Type", b"a/b"), (b"Cookie", b"c=1"), (b"cookie", b"\xe9=2"), (b"X-K", b"")]
    built = Headers.from_latin1(raw)
    assert isinstance(built, Headers)
    decoded = Headers([(n.decode("latin-1"), v.decode("latin-1")) for n, v in raw])
    assert dict(built.items()) == dict(decoded.items())
    assert built.get_all("COOKIE") == ["c=1", "\xe9=2"] == decoded.get_all("cookie")
    assert list(built.raw_names()) == list(decoded.raw_names()) == ["content-type", "cookie", "x-k"]


def test_an_exchange_is_its_own_request_not_a_value() -> None:
    # A Struct since 0.4 (its fields set in C by begin), but compared and hashed as the one
    # request it is: two exchanges of the same request are two, and an adapter may key by one.
    first, second = begin(Policy(), request()), begin(Policy(), request())
    assert isinstance(first, Exchange)
    assert isinstance(second, Exchange)
    assert first != second
    assert first == first
    assert len({first, second, first}) == 2
    assert (first.record, first.declared, first.label) == (second.record, None, "<unknown>")
    first.state = first.state  # mutable: every transition moves it
    # Its repr names the record, never the key or a header (client input, credentials).
    seen = begin(Policy(), request(headers=[("Idempotency-Key", "k-secret"), ("Cookie", "sid=s3")]))
    assert isinstance(seen, Exchange)
    assert repr(seen) == f"<Exchange POST <unknown> {seen.record.digest}: reading the body>"


def test_the_request_and_its_answers_are_frozen_values() -> None:
    # Frozen msgspec Structs since 0.4 (built in C; a frozen dataclass cost ~0.9 us each):
    # what Policy.scope receives and what an adapter sends still cannot change under it.
    seen = request()
    with pytest.raises(AttributeError):
        seen.path = "/other"  # type: ignore[misc]
    assert seen == request()
    assert msgspec.structs.replace(seen, route="/charges/{id}").route == "/charges/{id}"
    assert seen.route == ""
    answer = Response(201, [("Content-Type", "application/json")], b"{}")
    with pytest.raises(AttributeError):
        answer.status = 500  # type: ignore[misc]
    assert answer == Response(201, [("Content-Type", "application/json")], b"{}")
    assert answer.reason == ""
    assert Complete(b"x") == Complete(b"x")
    assert Release("x") == Release("x")
    with pytest.raises(AttributeError):
        Release("x").reason = "y"  # type: ignore[misc]
