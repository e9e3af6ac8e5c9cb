"""Issue 35: a retry sent the moment the client has read the whole answer is a replay, on every
server users run (never ``409 in_flight`` because the record is still being completed).

PEP 3333 lets a WSGI server send each block before it asks the app's iterable for the next,
so a client can hold a whole sized answer before the iterable is exhausted; the WSGI middleware
completes the record once the declared ``Content-Length`` is in hand, before that last block
goes out. The client here is a real one on loopback: two keep-alive connections, the first
request on one, the retry on the other (a connection pool's second connection), sent as soon as
the first answer's last byte is read. The loops are bounded by count and by time.
"""

from __future__ import annotations

import contextlib
import http.client
import time
import uuid
from typing import TYPE_CHECKING

import pytest
import redis

from tests.adapters.edge_servers import Server, servers

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.redis
__all__ = ["servers"]  # the fixture, imported

PAIRS = 300
BIG_PAIRS = 40
EMPTY_PAIRS = 100
#: A safety bound only: 300 pairs take 1-4 s per server on a loaded 2-core box.
DEADLINE = 60.0

SERVED = [
    pytest.param(("gunicorn", "wsgi"), id="gunicorn-wsgi"),
    pytest.param(("waitress", "wsgi"), id="waitress-wsgi"),
    pytest.param(("werkzeug", "wsgi"), id="werkzeug-wsgi"),
    pytest.param(("granian", "wsgi"), id="granian-wsgi"),
    pytest.param(("uvicorn", "asgi"), id="uvicorn-asgi"),
    pytest.param(("hypercorn", "asgi"), id="hypercorn-asgi"),
    pytest.param(("daphne", "asgi"), id="daphne-asgi"),
    pytest.param(("granian", "asgi"), id="granian-asgi"),
    pytest.param(("waitress", "flask"), id="waitress-flask"),
    pytest.param(("granian", "flask"), id="granian-flask"),
    pytest.param(("gunicorn", "flask"), id="gunicorn-flask"),
]
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def post(connection: http.client.HTTPConnection, path: str, key: str) -> tuple[int, str, bytes]:
    """POST and read the whole answer: (status, Idempotent-Replayed, body)."""
    connection.request("POST", path, b"amount=10", {**FORM, "Idempotency-Key": key})
    response = connection.getresponse()
    body = response.read()
    return response.status, response.getheader("Idempotent-Replayed") or "", body


def pairs(
    server: Server, path: str, count: int, status: int = 201
) -> tuple[list[str], list[tuple[int, str]]]:
    """``count`` pairs of "POST, read it all, POST the same at once" (bounded by
    :data:`DEADLINE`): the keys, and each retry's (status, Idempotent-Replayed)."""
    first = http.client.HTTPConnection("127.0.0.1", server.port, timeout=15)
    again = http.client.HTTPConnection("127.0.0.1", server.port, timeout=15)
    keys: list[str] = []
    retries: list[tuple[int, str]] = []
    deadline = time.monotonic() + DEADLINE
    with contextlib.closing(first), contextlib.closing(again):
        while len(keys) < count and time.monotonic() < deadline:
            key = "r" + uuid.uuid4().hex[:16]
            answered, _, _ = post(first, path, key)
            assert answered == status, (answered, server.log_text()[-2000:])
            answered, replayed, _ = post(again, path, key)
            keys.append(key)
            retries.append((answered, replayed))
    return keys, retries


def runs(server: Server, keys: list[str]) -> list[int]:
    client = redis.Redis.from_url(server.redis_url)
    with contextlib.closing(client):
        return [int(n or 0) for n in client.mget([f"{server.prefix}:runs:{k}" for k in keys])]


@pytest.mark.parametrize("where", SERVED)
def test_a_retry_right_after_the_answer_is_a_replay(
    servers: Callable[[str, str], Server], where: tuple[str, str]
) -> None:
    server = servers(*where)
    keys, retries = pairs(server, "/charges", PAIRS)
    assert len(keys) == PAIRS, f"only {len(keys)} pairs in {DEADLINE} s"
    in_flight = sum(1 for status, _ in retries if status == 409)
    assert in_flight == 0, f"{in_flight} of {PAIRS} immediate retries got 409"
    assert retries == [(201, "true")] * PAIRS
    assert runs(server, keys) == [1] * PAIRS


@pytest.mark.parametrize("where", [p for p in SERVED if p.values[0][1] == "wsgi"])
def test_a_retry_right_after_an_oversized_answer_is_a_replay_without_its_body(
    servers: Callable[[str, str], Server], where: tuple[str, str]
) -> None:
    """2 MiB in 8 blocks with a Content-Length, over max_response_bytes (1 MiB): not kept, and
    the retry at once still replays (status, headers, Idempotent-Body-Not-Kept), never runs."""
    server = servers(*where)
    keys, retries = pairs(server, "/big", BIG_PAIRS)
    assert len(keys) == BIG_PAIRS, f"only {len(keys)} pairs in {DEADLINE} s"
    assert retries == [(201, "true")] * BIG_PAIRS, [s for s, _ in retries if s != 201]
    assert runs(server, keys) == [1] * BIG_PAIRS


@pytest.mark.parametrize("where", SERVED)
def test_a_retry_right_after_a_204_is_a_replay(
    servers: Callable[[str, str], Server], where: tuple[str, str]
) -> None:
    """The head is the whole answer, and granian sends it before it pulls the empty body: the
    WSGI middleware completes the record before it hands the response over (11 of 300 got 409
    on granian before); the Flask extension completes before the view's response leaves it,
    the ASGI middleware once its final body message is sent: every adapter, one test."""
    server = servers(*where)
    keys, retries = pairs(server, "/empty", EMPTY_PAIRS, status=204)
    assert len(keys) == EMPTY_PAIRS, f"only {len(keys)} pairs in {DEADLINE} s"
    assert retries == [(204, "true")] * EMPTY_PAIRS, [s for s, _ in retries if s != 204]
    assert runs(server, keys) == [1] * EMPTY_PAIRS
