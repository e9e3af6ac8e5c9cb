"""Policy fields a caller sets and relies on, through every adapter on a real Redis.

Each test here was written against a change to the library that left the rest of the suite
green (a mutant): the default scope dropping the ``Cookie`` or ``X-Api-Key`` credential, the
503 ``Retry-After`` ignoring ``store_error_retry_after``, and ``Policy.header`` ignored in
favour of ``Idempotency-Key``. Each runs once per harness (flask, wsgi, django, starlette,
fastapi, litestar, and wsgi on fakeredis), like ``test_suite.py``; the ``Retry-After`` rows, a
decision, on the two of ``DECISION_HARNESSES`` (tests/adapters/harness.py).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from tests._servers import free_port
from tests.adapters.harness import decision_only
from tests.adapters.test_suite import assert_problem, charge, replayed

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.adapters.harness import Harness


# ---- the default scope: every credential header separates tenants ----------------------------


@pytest.mark.parametrize(
    ("credential", "alice", "bob"),
    [
        ("Cookie", "session=alice", "session=bob"),
        ("X-Api-Key", "key_alice", "key_bob"),
        ("Authorization", "Bearer alice", "Bearer bob"),
    ],
)
def test_two_tenants_with_one_key_never_share_a_record_under_the_default_scope(
    harness: Harness, credential: str, alice: str, bob: str
) -> None:
    """A tenant that authenticates by cookie or API key alone is its own scope by default."""
    first = charge(harness, "order-1", headers=[(credential, alice)])
    assert first.status == 201
    # Bob sends the same key with his own credential: his request runs, it is not Alice's replay.
    other = charge(harness, "order-1", headers=[(credential, bob)])
    assert other.status == 201
    assert not replayed(other)
    assert json.loads(other.body)["id"] == "ch_2"
    assert harness.executions["charges"] == 2
    # Alice's retry still gets her own stored answer.
    again = charge(harness, "order-1", headers=[(credential, alice)])
    assert replayed(again)
    assert again.body == first.body
    assert harness.executions["charges"] == 2


# ---- store_error_retry_after reaches the 503 -------------------------------------------------


@decision_only  # test_suite.py's 503 row checks Retry-After reaches the client on every harness
@pytest.mark.parametrize(("seconds", "header"), [(7.0, "7"), (2.5, "3"), (0.0, "1")])
def test_a_store_error_503_says_retry_after_the_configured_seconds(
    make_harness: Callable[..., Harness], seconds: float, header: str
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    harness = make_harness(redis_url=dead, store_error_retry_after=seconds)
    reply = charge(harness, "k")
    assert_problem(reply, 503, "store_unavailable")
    assert reply.header("Retry-After") == header
    assert harness.executions["charges"] == 0


# ---- Policy.header names the header that carries the key -------------------------------------


def test_a_custom_key_header_carries_the_key(make_harness: Callable[..., Harness]) -> None:
    harness = make_harness(header="X-Request-Key")
    first = charge(harness, None, headers=[("X-Request-Key", "abc")])
    assert first.status == 201
    again = charge(harness, None, headers=[("X-Request-Key", "abc")])
    assert replayed(again)
    assert again.body == first.body
    other_body = charge(harness, None, 9, headers=[("X-Request-Key", "abc")])
    assert_problem(other_body, 422, "key_reused")
    assert harness.executions["charges"] == 1


def test_with_a_custom_key_header_idempotency_key_is_not_the_key(
    make_harness: Callable[..., Harness],
) -> None:
    harness = make_harness(header="X-Request-Key")
    # The default header name is just another header now: the key is missing.
    reply = charge(harness, "abc")
    body = assert_problem(reply, 400, "missing_key")
    assert "X-Request-Key" in body["detail"]
    assert harness.executions["charges"] == 0
    # And it does not change which record a request with the configured header uses.
    first = charge(harness, "one", headers=[("X-Request-Key", "k")])
    second = charge(harness, "two", headers=[("X-Request-Key", "k")])
    assert replayed(second)
    assert second.body == first.body
    assert harness.executions["charges"] == 1
