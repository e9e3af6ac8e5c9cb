"""What ``idemkey console`` shows of stored data, run as a user runs it (``python -m idemkey
console``) against the session's real Redis.

* The default scope is an unkeyed digest of the request's credential headers: shown, a weak
  Basic-auth password is one dictionary away. The page and ``/api/status`` show instead a
  label keyed by a secret of the console process: the same for one tenant within a console,
  nothing to guess against offline. A scope the app set (its tenant id) is shown as it is.
* The "By route" table holds at most ``MAX_LISTED`` rows, the rest folded into one: each
  keyed request to a new path (the concrete path, without ``routes=``) is a route of its own.
* A key of another type at ``<prefix>:uncertain`` leaves the records shown, with a note; a
  Redis that does not answer is an RFC 9457 problem from ``/api/status``.
* Stored text (route, steps, an uncertain entry's kind and detail) reaches the page as
  ``idemkey list`` prints it: a bidirectional override as an escape, never raw.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis

from idemkey import RedisStore, guard
from idemkey._core import Record, record_for
from idemkey._core._origin import record_origin
from idemkey.console import create_app
from idemkey.console._view import MAX_LISTED
from idemkey.http import Headers, Request
from idemkey.http._scope import NO_CREDENTIALS
from idemkey.policy import Policy, credential_scope
from idemkey.store.uncertain import uncertain_stream
from tests._servers import AppServer, free_port, no_retry
from tests.cli.test_console_guard import ask, own

pytestmark = pytest.mark.redis

BIDI = "\u202e"


def basic_auth_scope(user: str, password: str) -> str:
    """The default scope of a request that authenticates with HTTP Basic."""
    secret = base64.b64encode(f"{user}:{password}".encode()).decode()
    headers = Headers([("Authorization", f"Basic {secret}"), ("Idempotency-Key", "k")])
    return credential_scope(Request("POST", "/charges", "", headers))


def in_flight(store: RedisStore, key: str, scope: str, route: str = "/charges") -> Record:
    record = record_for(store.policy.prefix, scope, "POST", route, key)
    origin = record_origin(scope, "POST", route, key)
    store.claim(record, "fp", lease_ms=600_000, heartbeat=False, origin=origin)
    return record


def read(server: AppServer) -> tuple[str, str, dict[str, Any]]:
    """The page, the fragment it refreshes, and /api/status."""
    pages = [ask(server, path, own(server)) for path in ("/", "/fragment", "/api/status")]
    assert [status for status, _ in pages] == [200, 200, 200], pages
    return pages[0][1], pages[1][1], json.loads(pages[2][1])


def test_the_default_scope_is_shown_as_a_label_keyed_by_the_console(
    console: Callable[..., AppServer], store: RedisStore, real_client: redis.Redis
) -> None:
    alice = basic_auth_scope("alice", "sunshine7")
    records = {
        "alice-1": in_flight(store, "alice-1", alice),
        "alice-2": in_flight(store, "alice-2", alice),
        "acct": in_flight(store, "acct", "acct_1"),  # the app's own scope: its tenant id
        "anonymous": in_flight(store, "anonymous", NO_CREDENTIALS),
    }
    real_client.xadd(uncertain_stream(store.policy.prefix), {
        "kind": "lease_lost", "at": "1700000000000", "record": records["alice-1"].digest,
        "method": "POST", "route": "/charges", "scope": alice, "fence": "7",
    })  # fmt: skip
    server = console()
    page, fragment, status = read(server)
    for body in (page, fragment, json.dumps(status)):
        # Neither the digest nor any part of it a column could show: 12 hex digits and more.
        for start in range(len(alice) - 11):
            assert alice[start : start + 12] not in body
    scopes = {entry["client_key"]: entry["scope"] for entry in status["active"]}
    label = scopes["alice-1"]
    assert re.fullmatch(r"cred:[0-9a-f]{12}", label), label
    assert scopes["alice-2"] == label  # one tenant, one label: rows still group
    assert label != "cred:" + hashlib.blake2b(alice.encode(), digest_size=6).hexdigest()
    assert scopes["acct"] == "acct_1"
    assert scopes["anonymous"] == "(no credentials)"
    (entry,) = status["uncertain"]
    assert entry["scope"] == label
    assert page.count(f"<code>{label}</code>") == 2
    assert read(server)[2]["active"][0]["scope"] in set(scopes.values())  # stable: same labels
    assert {e["scope"] for e in read(server)[2]["active"]} == set(scopes.values())
    # Another console process has another secret: nothing carries over to compare against.
    other = {e["client_key"]: e["scope"] for e in read(console())[2]["active"]}
    assert other["alice-1"] != label
    assert other["alice-1"] == other["alice-2"]


def test_the_route_table_keeps_the_busiest_routes_and_folds_the_rest(
    console: Callable[..., AppServer], store: RedisStore
) -> None:
    extra = 30
    for n in range(MAX_LISTED + extra):  # one path per request, as a hostile client sends
        in_flight(store, f"k-{n}", "acct_1", route=f"/x/{n}")
    for n in range(3):
        in_flight(store, f"hot-{n}", "acct_1", route="/hot")
    page, fragment, status = read(console())
    routes = status["routes"]
    assert len(routes) == MAX_LISTED + 1
    assert routes[0] == {"route": "POST /hot", "counts": {"in_progress": 3}}
    folded = routes[-1]
    assert folded["route"] == f"({extra + 1} other routes)"
    assert folded["counts"] == {"in_progress": extra + 1}
    assert sum(sum(r["counts"].values()) for r in routes) == MAX_LISTED + extra + 3
    assert status["truncated"] is True
    for html in (page, fragment):
        table = html.split('<table id="routes">', 1)[1].split("</table>", 1)[0]
        assert table.count("<tr>") == 1 + MAX_LISTED + 1  # the header, the rows, the fold
        assert f"({extra + 1} other routes)" in table


def test_a_stranger_s_key_at_the_uncertain_stream_leaves_the_records_shown(
    console: Callable[..., AppServer], store: RedisStore, real_client: redis.Redis
) -> None:
    with guard(store, "job-1") as call:
        call.save("done")
    real_client.set(uncertain_stream(store.policy.prefix), "an app's own value")
    page, fragment, status = read(console())
    assert status["counts"]["complete"] == 1
    assert "WRONGTYPE" in status["uncertain_error"]
    assert status["uncertain"] == []
    for html in (page, fragment):
        assert 'id="count-complete">1<' in html
        assert "Redis is unavailable" not in html
        assert "the uncertain outcomes could not be read" in html


def test_a_redis_that_does_not_answer_is_a_problem_from_the_status_api() -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=2, retry=no_retry())
    store = RedisStore(client, Policy(prefix="nowhere"))

    async def fetch() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(store, port=8089))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8089") as c:
            return await c.get("/api/status")

    try:
        answer = asyncio.run(fetch())
    finally:
        store.close()
    assert answer.status_code == 503
    assert answer.headers["Content-Type"] == "application/problem+json"
    problem = answer.json()
    assert problem["status"] == 503
    assert problem["type"] == "about:blank"
    assert "Redis" in problem["detail"]
    assert "default-src 'none'" in answer.headers["Content-Security-Policy"]


def test_a_bidirectional_override_in_stored_text_reaches_the_page_escaped(
    console: Callable[..., AppServer], store: RedisStore, real_client: redis.Redis
) -> None:
    record = in_flight(store, "k-1", "acct_1", route=f"/charges/{BIDI}fdp.exe")
    real_client.hset(record.record_key, mapping={f"s:re{BIDI}serve": "x", "ns": "1"})  # a step
    with contextlib.suppress(RuntimeError), guard(store, "job-2") as call:
        call.step("reserve", lambda: 1)
        raise RuntimeError("after a step")
    real_client.xadd(uncertain_stream(store.policy.prefix), {
        "kind": f"lease{BIDI}_lost", "at": "1700000000000", "record": record.digest,
        "method": "POST", "route": f"/refunds/{BIDI}txt.exe", "scope": "acct_1", "fence": "7",
        "steps": json.dumps([f"ch{BIDI}arge"]), "detail": f"failed {BIDI}gnp.exe",
    })  # fmt: skip
    page, fragment, _ = read(console())
    for html in (page, fragment):
        assert BIDI not in html
        assert "/charges/%E2%80%AEfdp.exe" in html  # as `idemkey list` prints a route
        assert "/refunds/%E2%80%AEtxt.exe" in html
        assert "re\\u202eserve" in html  # as `idemkey list` prints steps
        assert "ch\\u202earge" in html
        assert "failed \\u202egnp.exe" in html
