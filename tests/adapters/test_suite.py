"""docs/design.md#http-decisions, row by row, through every adapter (one parametrized suite).

Each test runs once per harness in ``tests/adapters/conftest.py`` (flask, wsgi, django,
starlette, fastapi, ... on real Redis, and ``wsgi-fakeredis``). A harness is a real app behind
a real adapter; ``executions`` counts how often a handler actually ran, which is what a user
of idempotency keys relies on.

A row marked ``@decision_only`` checks only a decision of the sans-IO exchange (which key is
valid, what is stored or released, which scope, what the options change, which events) and
runs on two harnesses, the bare WSGI and ASGI middleware (``DECISION_HARNESSES`` in
tests/adapters/harness.py). Every row that depends on what an adapter hands over or sends
back (key, method, path, query, header lines, body, chunked and streamed bytes, the problem
responses, concurrency, a store lost mid-request) stays on every harness.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pytest
import redis

from tests._servers import free_port, wait_until
from tests.adapters.harness import STREAM_CHUNKS, Reply, decision_only

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from idemkey import Event
    from idemkey.http import Request
    from tests._servers import RedisServer
    from tests.adapters.harness import Harness

JSON = ("Content-Type", "application/json")
NOT_STORED = {"content-length", "set-cookie", "date", "idempotent-replayed"}


def key(value: str) -> tuple[str, str]:
    return ("Idempotency-Key", value)


def charge(
    harness: Harness,
    idem: str | None,
    amount: int = 5,
    *,
    path: str = "/charges",
    method: str = "POST",
    headers: Sequence[tuple[str, str]] = (),
) -> Reply:
    sent = [JSON, *headers] + ([key(idem)] if idem is not None else [])
    return harness.request(method, path, headers=sent, body=b'{"amount": %d}' % amount)


def replayed(reply: Reply) -> bool:
    return reply.header("Idempotent-Replayed") == "true"


def comparable(reply: Reply) -> list[tuple[str, str]]:
    """Response headers a replay must repeat exactly, in order."""
    return [(n.lower(), v) for n, v in reply.headers if n.lower() not in NOT_STORED]


def assert_problem(reply: Reply, status: int, code: str) -> dict[str, Any]:
    """An RFC 9457 problem with our stable ``code`` member."""
    assert reply.status == status, reply
    assert reply.header("Content-Type") == "application/problem+json"
    body = json.loads(reply.body)
    assert body["status"] == status
    assert body["code"] == code
    assert body["type"].endswith(code)
    assert body["title"]
    assert body["detail"]
    return body


def in_thread(fn: Callable[[], Reply]) -> tuple[ThreadPoolExecutor, Any]:
    pool = ThreadPoolExecutor(1)
    return pool, pool.submit(fn)


# ---- first request and replay -----------------------------------------------------------------


def test_first_request_runs_once_and_retries_replay_byte_identical(harness: Harness) -> None:
    first = charge(harness, "k1")
    assert first.status == 201
    assert json.loads(first.body) == {"id": "ch_1", "amount": 5}
    assert first.header("X-Charge-Id") == "ch_1"
    assert first.header("Set-Cookie") is not None
    assert not replayed(first)
    for _ in range(2):
        again = charge(harness, "k1")
        assert again.status == 201
        assert again.body == first.body
        assert comparable(again) == comparable(first)
        assert replayed(again)
        assert again.header("Set-Cookie") is None  # a replay never hands out a session
        assert again.header("Date") is None  # not stored: the server sends a fresh one
    assert harness.executions["charges"] == 1


@decision_only
def test_quoted_and_bare_forms_are_the_same_key(harness: Harness) -> None:
    assert charge(harness, '"abc"').status == 201
    again = charge(harness, "abc")
    assert replayed(again)
    assert harness.executions["charges"] == 1


@decision_only
def test_other_keys_are_other_requests(harness: Harness) -> None:
    assert json.loads(charge(harness, "a").body)["id"] == "ch_1"
    assert json.loads(charge(harness, "b").body)["id"] == "ch_2"
    assert harness.executions["charges"] == 2


def test_patch_is_guarded(harness: Harness) -> None:
    first = charge(harness, "p", path="/charges/1", method="PATCH")
    assert first.status == 200
    again = charge(harness, "p", path="/charges/1", method="PATCH")
    assert replayed(again)
    assert again.body == first.body
    assert harness.executions["patch"] == 1


def test_key_reused_with_another_body_is_422_and_the_record_survives(harness: Harness) -> None:
    first = charge(harness, "k", amount=5)
    assert_problem(charge(harness, "k", amount=6), 422, "key_reused")
    again = charge(harness, "k", amount=5)
    assert replayed(again)
    assert again.body == first.body
    assert harness.executions["charges"] == 1


def test_key_reused_on_another_query_is_422(harness: Harness) -> None:
    charge(harness, "k", path="/charges?currency=eur")
    assert_problem(charge(harness, "k", path="/charges?currency=usd"), 422, "key_reused")
    assert harness.executions["charges"] == 1


def test_a_repeated_query_name_in_another_order_is_422(harness: Harness) -> None:
    # The app reads a repeated name as a list: its values in another order are another request.
    charge(harness, "k", path="/charges?sort=price&sort=date&currency=eur")
    other = charge(harness, "k", path="/charges?sort=date&sort=price&currency=eur")
    assert_problem(other, 422, "key_reused")
    assert replayed(charge(harness, "k", path="/charges?currency=eur&sort=price&sort=date"))
    assert harness.executions["charges"] == 1


# ---- concurrency --------------------------------------------------------------------------------


def test_retry_while_the_first_runs_is_409_with_retry_after(harness: Harness) -> None:
    pool, first = in_thread(lambda: harness.request("POST", "/slow", headers=[key("s")]))
    with pool:
        wait_until(lambda: harness.executions["slow"] == 1, 10, "the first request to start")
        busy = harness.request("POST", "/slow", headers=[key("s")])
        assert_problem(busy, 409, "in_flight")
        assert (busy.header("Retry-After") or "").isdigit()
        harness.gate.set()
        assert first.result(15).status == 201
    again = harness.request("POST", "/slow", headers=[key("s")])
    assert again.status == 201
    assert replayed(again)
    assert again.body == first.result().body
    assert harness.executions["slow"] == 1


@decision_only
def test_with_wait_a_duplicate_waits_and_replays(make_harness: Callable[..., Harness]) -> None:
    harness = make_harness(wait=10.0)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(harness.request, "POST", "/slow", headers=[key("w")])
        wait_until(lambda: harness.executions["slow"] == 1, 10, "the first request to start")
        second = pool.submit(harness.request, "POST", "/slow", headers=[key("w")])
        # The duplicate cannot finish while the first is parked on the gate: it waits (without
        # wait it would answer 409 at once). A bounded wait on a condition, not a sleep.
        done, _ = futures.wait([second], timeout=0.3)
        assert not done
        harness.gate.set()
        one, two = first.result(15), second.result(15)
    assert one.status == two.status == 201
    assert replayed(two)
    assert two.body == one.body
    assert harness.executions["slow"] == 1


def test_many_concurrent_duplicates_run_the_handler_once(harness: Harness) -> None:
    def send(_: int) -> Reply:
        return charge(harness, "hot")

    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(send, range(32)))
    assert harness.executions["charges"] == 1
    winners = [r for r in replies if r.status == 201]
    assert winners
    assert {r.body for r in winners} == {b'{"id":"ch_1","amount":5}'}
    for reply in replies:
        if reply.status != 201:
            assert_problem(reply, 409, "in_flight")


# ---- keys ---------------------------------------------------------------------------------------


def test_missing_key_is_400(harness: Harness) -> None:
    assert_problem(charge(harness, None), 400, "missing_key")
    assert harness.executions["charges"] == 0


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param([key("a"), key("b")], id="several-field-lines"),
        pytest.param([key("clé")], id="non-ascii"),
    ],
)
def test_invalid_key_as_the_adapter_hands_it_over_is_400(
    harness: Harness, headers: list[tuple[str, str]]
) -> None:
    # How repeated lines and non-ASCII bytes reach the exchange is each adapter's own (a WSGI
    # server joins the lines and decodes latin-1, ASGI hands over bytes): on every harness.
    reply = harness.request("POST", "/charges", headers=[JSON, *headers], body=b'{"amount": 1}')
    assert_problem(reply, 400, "invalid_key")
    assert harness.executions["charges"] == 0


@decision_only
@pytest.mark.parametrize(
    "headers",
    [
        pytest.param([key("")], id="empty"),
        pytest.param([key('""')], id="empty-quoted"),
        pytest.param([key("k" * 256)], id="too-long"),
        pytest.param([key("a b")], id="space"),
        pytest.param([key('"unterminated')], id="bad-sf-string"),
    ],
)
def test_invalid_key_is_400(harness: Harness, headers: list[tuple[str, str]]) -> None:
    reply = harness.request("POST", "/charges", headers=[JSON, *headers], body=b'{"amount": 1}')
    assert_problem(reply, 400, "invalid_key")
    assert harness.executions["charges"] == 0


@decision_only
def test_longest_key_is_accepted(harness: Harness) -> None:
    assert charge(harness, "k" * 255).status == 201
    assert replayed(charge(harness, "k" * 255))


@decision_only
def test_strict_header_requires_the_quoted_form(make_harness: Callable[..., Harness]) -> None:
    harness = make_harness(strict_header=True)
    assert_problem(charge(harness, "bare"), 400, "invalid_key")
    assert charge(harness, '"quoted"').status == 201


@decision_only
def test_key_not_required_runs_unprotected(make_harness: Callable[..., Harness]) -> None:
    harness = make_harness(require_key=False)
    assert charge(harness, None).status == 201
    assert charge(harness, None).status == 201
    assert harness.executions["charges"] == 2
    assert charge(harness, "k").status == 201
    assert replayed(charge(harness, "k"))


@decision_only
@pytest.mark.parametrize(
    ("method", "path", "name", "status"),
    [
        ("GET", "/charges", "list", 200),
        ("PUT", "/charges/1", "put", 200),
        ("DELETE", "/charges/1", "delete", 204),
    ],
)
def test_other_methods_ignore_the_key(
    harness: Harness, method: str, path: str, name: str, status: int
) -> None:
    for value in ("same", "same", ""):  # even an invalid key is ignored
        reply = harness.request(method, path, headers=[key(value)])
        assert reply.status == status
        assert not replayed(reply)
    assert harness.executions[name] == 3


# ---- what the handler answers ---------------------------------------------------------------


def test_exception_releases_the_key(harness: Harness) -> None:
    for run in (1, 2):
        assert harness.request("POST", "/explode", headers=[key("x")]).status == 500
        assert harness.executions["explode"] == run


def test_500_releases_the_key(harness: Harness) -> None:
    for run in (1, 2):
        reply = harness.request("POST", "/fail500", headers=[key("x")])
        assert reply.status == 500
        assert not replayed(reply)
        assert harness.executions["fail500"] == run


@decision_only
def test_store_server_errors_option_stores_500(make_harness: Callable[..., Harness]) -> None:
    harness = make_harness(store_server_errors=True)
    first = harness.request("POST", "/fail500", headers=[key("x")])
    again = harness.request("POST", "/fail500", headers=[key("x")])
    assert again.status == 500
    assert replayed(again)
    assert again.body == first.body
    assert harness.executions["fail500"] == 1


def test_402_is_an_outcome_stored_and_replayed(harness: Harness) -> None:
    first = harness.request("POST", "/declined", headers=[key("d")])
    assert first.status == 402
    again = harness.request("POST", "/declined", headers=[key("d")])
    assert again.status == 402
    assert replayed(again)
    assert again.body == first.body
    assert harness.executions["declined"] == 1


@decision_only
@pytest.mark.parametrize("status", [400, 404, 409, 422, 429])
def test_never_began_4xx_releases_the_key(harness: Harness, status: int) -> None:
    for run in (1, 2):
        reply = harness.request("POST", f"/status/{status}", headers=[key("n")])
        assert reply.status == status
        assert not replayed(reply)
        assert harness.executions["status"] == run


@decision_only
@pytest.mark.parametrize("status", [200, 202, 302])
def test_2xx_and_3xx_are_stored(harness: Harness, status: int) -> None:
    first = harness.request("POST", f"/status/{status}", headers=[key("s")])
    again = harness.request("POST", f"/status/{status}", headers=[key("s")])
    assert first.status == again.status == status
    assert replayed(again)
    assert harness.executions["status"] == 1


@decision_only
def test_invalid_json_400_from_handler_is_released(harness: Harness) -> None:
    headers = [JSON, key("j")]
    assert harness.request("POST", "/charges", headers=headers, body=b"nope").status == 400
    # Fixed request, same key: the first attempt never began, so this one runs.
    assert harness.request("POST", "/charges", headers=headers, body=b"{}").status == 400
    assert harness.executions["charges"] == 2


# ---- isolation ----------------------------------------------------------------------------------


def test_tenants_with_other_credentials_get_independent_records(harness: Harness) -> None:
    alice = [("Authorization", "Bearer alice")]
    bob = [("Authorization", "Bearer bob")]
    assert json.loads(charge(harness, "k", headers=alice).body)["id"] == "ch_1"
    assert json.loads(charge(harness, "k", headers=bob).body)["id"] == "ch_2"
    assert replayed(charge(harness, "k", headers=alice))
    assert json.loads(charge(harness, "k", headers=alice).body)["id"] == "ch_1"
    assert json.loads(charge(harness, "k").body)["id"] == "ch_3"  # no credentials: a third
    assert harness.executions["charges"] == 3


def forget_the_scope_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """The warning is logged once per process: make this test's request the first."""
    module = sys.modules.get("idemkey.http._scope")  # absent from a release without the warning
    if module is not None:
        monkeypatch.setattr(module, "_warned", False)


@decision_only
@pytest.mark.parametrize("credential", ["X-Auth-Token", "Api-Key"])
def test_the_default_scope_tells_tenants_apart_by_any_credential_header(
    harness: Harness, credential: str
) -> None:
    # No scope configured: tenant B sends tenant A's key and body with its own token.
    alice, bob = [(credential, "tok_alice")], [(credential, "tok_bob")]
    assert json.loads(charge(harness, "k", headers=alice).body)["id"] == "ch_1"
    theirs = charge(harness, "k", headers=bob)
    assert not replayed(theirs)
    assert json.loads(theirs.body)["id"] == "ch_2"
    # The header order and the key do not change a tenant's scope: its retry is a replay.
    again = charge(harness, "k", headers=[("Accept", "*/*"), *alice])
    assert replayed(again)
    assert json.loads(again.body)["id"] == "ch_1"
    assert harness.executions["charges"] == 2


@decision_only
def test_the_default_scope_warns_once_of_a_request_without_credentials(
    harness: Harness, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    forget_the_scope_warning(monkeypatch)

    def warnings() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "default scope" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="idemkey"):
        assert charge(harness, "a", headers=[("X-Auth-Token", "tok")]).status == 201
        assert warnings() == []
        assert charge(harness, "b").status == 201
        assert charge(harness, "c").status == 201
    [warning] = warnings()
    assert (warning.name, warning.levelno) == ("idemkey", logging.WARNING)
    assert "Policy(scope=...)" in warning.getMessage()


@decision_only
def test_a_configured_scope_never_warns_of_missing_credentials(
    make_harness: Callable[..., Harness],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    forget_the_scope_warning(monkeypatch)
    harness = make_harness(scope=lambda request: request.headers.get("x-tenant", ""))
    with caplog.at_level(logging.WARNING, logger="idemkey"):
        assert charge(harness, "a").status == 201
    assert not [r for r in caplog.records if "default scope" in r.getMessage()]


@decision_only
def test_custom_scope_callable(make_harness: Callable[..., Harness]) -> None:
    def tenant(request: Request) -> str:
        return request.headers.get("x-tenant", "")

    harness = make_harness(scope=tenant)
    acme = [("X-Tenant", "acme"), ("Authorization", "Bearer one")]
    assert charge(harness, "k", headers=acme).status == 201
    other = [("X-Tenant", "globex"), ("Authorization", "Bearer one")]
    assert not replayed(charge(harness, "k", headers=other))
    # Same tenant, another credential: the scope says it is the same tenant, so a replay.
    rotated = [("X-Tenant", "acme"), ("Authorization", "Bearer two")]
    assert replayed(charge(harness, "k", headers=rotated))
    assert harness.executions["charges"] == 2


def test_same_key_on_another_route_is_another_record(harness: Harness) -> None:
    assert charge(harness, "k").status == 201
    refund = charge(harness, "k", path="/refunds")
    assert refund.status == 201
    assert not replayed(refund)
    assert json.loads(refund.body)["id"] == "rf_1"
    assert harness.executions["charges"] == harness.executions["refunds"] == 1


# ---- retention ----------------------------------------------------------------------------------


@decision_only
def test_record_expires_after_ttl_and_the_handler_runs_again(
    make_harness: Callable[..., Harness], redis_url: str, prefix: str
) -> None:
    # The record carries the policy's ttl; its lapse is Redis's own expiry, brought forward
    # with PEXPIRE (tests/store/test_scripts.py checks the ttl each script sets).
    harness = make_harness(ttl=30.0)
    assert charge(harness, "t").status == 201
    assert replayed(charge(harness, "t"))
    client = redis.Redis.from_url(redis_url)
    with contextlib.closing(client):
        records = list(client.scan_iter(match=f"*{prefix}*", count=1000))
        assert records
        for record in records:
            assert 0 < client.pttl(record) <= 30_000
            client.pexpire(record, 1)
        wait_until(lambda: not client.exists(*records), 5, "the record to expire")
    assert not replayed(charge(harness, "t"))
    assert harness.executions["charges"] == 2


# ---- sizes --------------------------------------------------------------------------------------


def padded(size: int, amount: int = 5) -> bytes:
    body = b'{"amount": %d}' % amount
    return body[:-1] + b" " * (size - len(body)) + b"}"


def test_body_at_the_limit_is_accepted(harness: Harness) -> None:
    body = padded(2048)
    reply = harness.request("POST", "/charges", headers=[JSON, key("b")], body=body)
    assert reply.status == 201
    assert json.loads(reply.body)["amount"] == 5


def test_body_over_the_limit_is_413(harness: Harness) -> None:
    reply = harness.request("POST", "/charges", headers=[JSON, key("b")], body=padded(2049))
    assert_problem(reply, 413, "request_too_large")
    assert harness.executions["charges"] == 0


def test_chunked_body_over_the_limit_is_413(harness: Harness) -> None:
    headers = [JSON, key("b"), ("Transfer-Encoding", "chunked")]
    reply = harness.request("POST", "/charges", headers=headers, body=padded(5000))
    assert_problem(reply, 413, "request_too_large")
    assert harness.executions["charges"] == 0


def test_chunked_body_within_the_limit_reaches_the_handler(harness: Harness) -> None:
    headers = [JSON, key("c"), ("Transfer-Encoding", "chunked")]
    first = harness.request("POST", "/charges", headers=headers, body=b'{"amount": 7}')
    assert first.status == 201
    assert json.loads(first.body)["amount"] == 7
    assert replayed(harness.request("POST", "/charges", headers=headers, body=b'{"amount": 7}'))
    assert harness.executions["charges"] == 1


def test_oversized_response_passes_through_and_is_never_rerun(harness: Harness) -> None:
    first = harness.request("POST", "/big", headers=[key("big")])
    assert first.status == 201
    assert first.body == b"x" * 2049
    again = harness.request("POST", "/big", headers=[key("big")])
    assert again.status == 201
    assert again.body == b""
    assert replayed(again)
    assert again.header("Idempotent-Body-Not-Kept") == "true"
    assert again.header("Content-Type") == "application/octet-stream"
    assert harness.executions["big"] == 1


def test_streamed_response_passes_through_and_is_never_rerun(harness: Harness) -> None:
    first = harness.request("POST", "/stream", headers=[key("st")])
    assert first.status == 200
    assert first.body == b"".join(STREAM_CHUNKS)
    again = harness.request("POST", "/stream", headers=[key("st")])
    assert again.status == 200
    assert again.body == b""
    assert replayed(again)
    assert again.header("Idempotent-Body-Not-Kept") == "true"
    assert again.header("X-Stream") == "yes"
    assert harness.executions["stream"] == 1


# ---- Redis failures -----------------------------------------------------------------------------


def closed_port_url() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"


def test_store_down_is_503_and_the_handler_does_not_run(
    make_harness: Callable[..., Harness],
) -> None:
    harness = make_harness(redis_url=closed_port_url())
    reply = charge(harness, "k")
    assert_problem(reply, 503, "store_unavailable")
    assert (reply.header("Retry-After") or "").isdigit()
    assert harness.executions["charges"] == 0
    # Requests idemkey does not guard still work.
    assert harness.request("GET", "/charges").status == 200


@decision_only
def test_store_killed_between_requests_is_503(
    make_harness: Callable[..., Harness], private_redis_server: RedisServer
) -> None:
    harness = make_harness(redis_url=private_redis_server.url)
    assert charge(harness, "k").status == 201
    private_redis_server.kill()
    assert_problem(charge(harness, "k"), 503, "store_unavailable")
    assert_problem(charge(harness, "other"), 503, "store_unavailable")
    assert harness.executions["charges"] == 1


@decision_only
def test_store_down_open_runs_the_handler_unprotected(
    make_harness: Callable[..., Harness],
) -> None:
    events: list[Event] = []
    harness = make_harness(
        redis_url=closed_port_url(), on_store_error="open", on_event=events.append
    )
    assert charge(harness, "k").status == 201
    assert charge(harness, "k").status == 201
    assert harness.executions["charges"] == 2
    assert [e.kind for e in events] == ["unprotected", "unprotected"]


def test_store_lost_after_the_handler_ran_still_answers(
    make_harness: Callable[..., Harness], private_redis_server: RedisServer
) -> None:
    events: list[Event] = []
    lock = threading.Lock()

    def record(event: Event) -> None:
        with lock:
            events.append(event)

    harness = make_harness(redis_url=private_redis_server.url, on_event=record)
    pool, first = in_thread(lambda: harness.request("POST", "/slow", headers=[key("s")]))
    with pool:
        wait_until(lambda: harness.executions["slow"] == 1, 10, "the handler to start")
        private_redis_server.kill()
        harness.gate.set()
        reply = first.result(15)
    assert reply.status == 201  # the client still gets the real answer
    assert json.loads(reply.body) == {"route": "slow", "run": 1}
    assert "store_error" in [e.kind for e in events]


# ---- options and events ---------------------------------------------------------------------


@decision_only
def test_stripe_compatible_mismatch_status(make_harness: Callable[..., Harness]) -> None:
    harness = make_harness(mismatch_status=400)
    charge(harness, "k", amount=1)
    assert_problem(charge(harness, "k", amount=2), 400, "key_reused")


@decision_only
def test_events_name_records_by_digest_only(make_harness: Callable[..., Harness]) -> None:
    events: list[Event] = []
    lock = threading.Lock()

    def record(event: Event) -> None:
        with lock:
            events.append(event)

    harness = make_harness(on_event=record)
    secret = "sk_live_secret_key_value"
    charge(harness, secret)
    charge(harness, secret)
    charge(harness, secret, amount=9)
    harness.request("POST", "/explode", headers=[key("x")])
    kinds = [e.kind for e in events]
    assert kinds[:2] == ["claimed", "completed"]
    assert kinds[2:4] == ["replayed", "mismatch"]
    assert kinds[4:] == ["claimed", "released"]
    assert {e.method for e in events} == {"POST"}
    assert all(secret not in repr(e) for e in events)
