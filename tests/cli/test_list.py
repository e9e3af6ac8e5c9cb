"""``idemkey list``, and the steps ``inspect`` and ``stats`` show, on the session server.

The user's path first: a request held in flight by the WSGI middleware behind a real server
(werkzeug) is listed with its method, route and scope, then listed complete once it answers.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from werkzeug.serving import make_server

from idemkey import RedisStore, guard
from idemkey.adapters.wsgi import IdempotencyMiddleware
from tests.cli.conftest import CliRunner
from tests.store.test_records import seed

pytestmark = pytest.mark.redis


@pytest.fixture
def held_app(store: RedisStore) -> Iterator[tuple[str, threading.Event]]:
    """A WSGI app under the middleware on a real werkzeug server; POST /charges waits for the
    event before it answers."""
    release = threading.Event()

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        if environ["PATH_INFO"] == "/charges":
            release.wait(30)
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b'{"id": "ch_1"}']

    server = make_server("127.0.0.1", 0, IdempotencyMiddleware(app, store), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", release
    finally:
        release.set()
        server.shutdown()
        thread.join(10)


def _wait_for(check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_list_shows_a_request_in_flight_then_complete(
    idemkey: CliRunner, redis_url: str, prefix: str, held_app: tuple[str, threading.Event]
) -> None:
    url, release = held_app
    base = ("--redis-url", redis_url, "--prefix", prefix)
    answers: list[httpx.Response] = []
    request = threading.Thread(
        target=lambda: answers.append(
            httpx.post(
                url + "/charges", content=b"{}", headers={"Idempotency-Key": "k1"}, timeout=30
            )
        )
    )
    request.start()
    try:

        def in_flight() -> Any:
            run = idemkey(*base, "list", "--json", "--state", "in_progress")
            return json.loads(run.out)["records"]

        (record,) = _wait_for(in_flight)
        assert (record["method"], record["route"]) == ("POST", "/charges")
        assert record["scope"]  # the default scope of a request without credentials
        assert record["lease_left"] > 0
        assert record["age"] >= 0
        text = idemkey(*base, "list", "--route", "/charges")
        assert text.code == 0
        assert "in_progress" in text.out
        assert "POST /charges" in text.out
    finally:
        release.set()
        request.join(30)
    assert answers[0].status_code == 201
    done = json.loads(idemkey(*base, "list", "--json").out)
    assert [r["state"] for r in done["records"]] == ["complete"]
    assert done["records"][0]["digest"] == record["digest"]
    assert json.loads(idemkey(*base, "list", "--json", "--route", "/charges").out)["count"] == 0


def test_list_filters_limit_and_empty(
    idemkey: CliRunner, redis_url: str, store: RedisStore
) -> None:
    base = ("--redis-url", redis_url, "--prefix", store.policy.prefix)
    for index in range(5):
        with guard(store, f"k{index}", scope="acct") as call:
            call.save(index)
    with contextlib.suppress(RuntimeError), guard(store, "failed", scope="acct") as call:
        call.step("reserve", lambda: 1)
        raise RuntimeError("after a step")
    released = json.loads(idemkey(*base, "list", "--json", "--state", "released").out)
    assert [(r["steps"], r["scope"]) for r in released["records"]] == [(["reserve"], "acct")]
    assert json.loads(idemkey(*base, "list", "--json", "--limit", "2").out)["count"] == 2
    assert json.loads(idemkey(*base, "list", "--json").out)["count"] == 6
    empty = idemkey(*base, "list", "--scope", "nobody")
    assert empty.code == 0
    assert "no record under prefix" in empty.out
    bad = idemkey(*base, "list", "--state", "stuck")
    assert bad.code == 2
    assert bad.err.count("\n") == 1


def test_inspect_and_stats_show_steps(
    idemkey: CliRunner, redis_url: str, store: RedisStore
) -> None:
    base = ("--redis-url", redis_url, "--prefix", store.policy.prefix)
    with contextlib.suppress(RuntimeError), guard(store, "order-1") as call:
        call.step("reserve", lambda: 1)
        call.step("charge", lambda: 2)
        raise RuntimeError("after two steps")
    shown = idemkey(*base, "inspect", "order-1", "--guard")
    assert shown.code == 0
    assert "steps     2 finished: charge, reserve" in shown.out
    view = json.loads(idemkey(*base, "inspect", "order-1", "--guard", "--json").out)
    assert view["steps"] == ["charge", "reserve"]
    stats = json.loads(idemkey(*base, "stats", "--json").out)
    assert stats["steps"] == {
        "records_with_steps": 1,
        "finished_steps": 2,
        "names": {"reserve": 1, "charge": 1},
    }
    assert "steps (1 records keep 2 finished steps)" in idemkey(*base, "stats").out


@pytest.mark.slow
def test_list_progress_on_a_large_keyspace(
    idemkey: CliRunner, redis_url: str, real_client: redis.Redis, prefix: str
) -> None:
    seed(real_client, prefix, 30_000)
    run = idemkey("--redis-url", redis_url, "--prefix", prefix, "list", "--state", "in_progress")
    assert run.code == 0
    assert run.out.count("in_progress") == 30
    assert "idemkey list: scanned" in run.err
    quiet = idemkey("--redis-url", redis_url, "--prefix", prefix, "list", "--no-progress",
                    "--limit", "1")  # fmt: skip
    assert quiet.err == ""


def test_list_uncertain_shows_what_each_entry_means(
    idemkey: CliRunner, redis_url: str, store: RedisStore
) -> None:
    base = ("--redis-url", redis_url, "--prefix", store.policy.prefix)
    assert "no uncertain outcome" in idemkey(*base, "list", "--uncertain").out
    with contextlib.suppress(RuntimeError), guard(store, "order-9") as call:
        call.step("reserve", lambda: 1)
        raise RuntimeError("card declined")

    def listed() -> Any:
        return json.loads(idemkey(*base, "list", "--uncertain", "--json").out)["uncertain"]

    (entry,) = _wait_for(listed)
    assert (entry["kind"], entry["steps"], entry["detail"]) == (
        "released_with_steps",
        ["reserve"],
        "card declined",
    )
    assert "compensate" in entry["action"]
    text = idemkey(*base, "list", "--uncertain").out
    assert "released_with_steps" in text
    assert "steps: reserve" in text
    assert "do: retry with the same key" in text


def test_list_and_console_columns_give_each_time_in_one_unit() -> None:
    """The text list and the console share one short form: one unit, ``-`` when unknown."""
    from idemkey.cli.readable import compact_seconds

    assert [compact_seconds(v) for v in (None, 0, 59.94, 60, 3599, 3600, 86399, 86400)] == [
        "-", "0.0s", "59.9s", "1m", "60m", "1.0h", "24.0h", "1.0d",
    ]  # fmt: skip


def test_the_no_other_prefix_line_names_the_bound_the_scan_keeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from idemkey.cli import listing

    assert "at most 20 000 keys per server" in listing._hint([])
    monkeypatch.setattr(listing, "HINT_SCAN_KEYS", 5_000)
    assert "at most 5 000 keys per server" in listing._hint([])


def test_list_uncertain_prints_stored_text_without_terminal_escapes(
    idemkey: CliRunner, redis_url: str, store: RedisStore
) -> None:
    """An uncertain entry is stored data: one written with raw redis-py (a route from a raw
    path, a detail from an error's text) puts no control character on the operator's screen."""
    from idemkey.store.uncertain import uncertain_stream

    prefix = store.policy.prefix
    hostile = "\x1b]0;owned\x07\x1b[2J"
    client = redis.Redis.from_url(redis_url)
    try:
        client.xadd(uncertain_stream(prefix), {
            "kind": "lease_lost" + hostile, "at": "1712345678901", "digest": "0" * 32 + hostile,
            "method": "POST", "route": "/charges/" + hostile, "scope": hostile,
            "steps": json.dumps(["charge" + hostile]), "detail": "card\ndeclined" + hostile,
        })  # fmt: skip
    finally:
        client.close()
    text = idemkey("--redis-url", redis_url, "--prefix", prefix, "list", "--uncertain").out
    assert "/charges/" in text
    assert "card" in text
    assert not any(ch in text for ch in "\x1b\x07"), repr(text)
    assert "\\x1b]0;owned\\x07" in text  # shown escaped, not dropped
    assert "card\\ndeclined" in text


def test_list_uncertain_shows_a_time_past_what_a_date_holds_as_no_date(
    idemkey: CliRunner, redis_url: str, store: RedisStore
) -> None:
    """An entry's ``at`` is stored data: 19 digits of milliseconds (a year past 9999) are no
    date, shown as such, and the entry still listed, not an internal error (exit 70)."""
    from idemkey.store.uncertain import uncertain_stream

    client = redis.Redis.from_url(redis_url)
    try:
        for at in ("1712345678901", "9" * 19):
            client.xadd(uncertain_stream(store.policy.prefix), {
                "kind": "lease_lost", "at": at, "record": "0" * 32, "method": "POST",
                "route": "/charges", "fence": "7",
            })  # fmt: skip
    finally:
        client.close()
    base = ("--redis-url", redis_url, "--prefix", store.policy.prefix, "list", "--uncertain")
    run = idemkey(*base)
    assert run.code == 0, run.err
    first, second = (line for line in run.out.splitlines() if "lease_lost" in line)
    assert first.startswith("(not a date)          lease_lost ")  # newest first, one column
    assert second.startswith("2024-04-05T19:34:38Z  lease_lost ")
    listed = json.loads(idemkey(*base, "--json").out)["uncertain"]
    assert [e["at"] for e in listed] == [9999999999999999.999, 1712345678.901]


def test_a_route_with_a_line_break_is_printed_as_the_filter_takes_it(
    idemkey: CliRunner, redis_url: str, store: RedisStore
) -> None:
    """A claim on the concrete path /charges%0Ax (no routes=): its origin keeps the line break
    as %0A, and `list` prints that, which `--route` finds (it printed %250Ax, found by no
    filter)."""
    from idemkey._core import record_for, record_origin

    base = ("--redis-url", redis_url, "--prefix", store.policy.prefix)
    record = record_for(store.policy.prefix, "t", "POST", "/charges\nx", "k")
    origin = record_origin("t\tenant", "POST", "/charges\nx", "k")
    store.claim(record, b"f" * 16, heartbeat=False, origin=origin)
    listed = idemkey(*base, "list").out
    assert "POST /charges%0Ax [t%09enant]" in listed, listed
    assert "%25" not in listed
    found = json.loads(idemkey(*base, "list", "--json", "--route", "/charges%0Ax").out)
    assert found["count"] == 1
    # White space is printed as %XX too: what is printed finds it, as what was sent does.
    for scope in ("t%09enant", "t\tenant"):
        found = json.loads(idemkey(*base, "list", "--json", "--scope", scope).out)
        assert found["count"] == 1, scope


def test_list_and_stats_print_stored_names_without_terminal_escapes(
    idemkey: CliRunner, redis_url: str, real_client: redis.Redis, prefix: str
) -> None:
    """A step name (a field ``s:<name>``) and the prefix of another record are stored data,
    any writer's: ``list`` and ``stats`` print them escaped, as ``inspect`` and
    ``list --uncertain`` do, so nothing clears the operator's screen or forges a row."""
    hostile = "\x1b[2J\x1b[31mFAKE\r\ncomplete  -  forged row\x07"
    real_client.hset(
        f"{prefix}:{{{'ab' * 16}}}", mapping={"fence": "5", "ns": "1", f"s:{hostile}": b"\x01\xc0"}
    )
    real_client.hset(f"\x1b]0;owned\x07{prefix}:{{{'cd' * 16}}}", "resp", b"\x01\xc0")
    base = ("--redis-url", redis_url)
    listed = idemkey(*base, "--prefix", prefix, "list", "--no-progress")
    stats = idemkey(*base, "--prefix", prefix, "stats", "--no-progress")
    others = idemkey(*base, "--prefix", prefix + "-none", "stats", "--no-progress")
    for run in (listed, stats, others):
        assert run.code == 0, run.err
        assert not any(c in run.out for c in "\x1b\r\x07"), repr(run.out)
        assert not any(line.startswith("complete") for line in run.out.splitlines())
    escaped = "\\x1b[2J\\x1b[31mFAKE\\r\\ncomplete  -  forged row\\x07"
    assert escaped in listed.out  # shown escaped, not dropped
    assert escaped in stats.out
    assert f'"\\u001b]0;owned\\u0007{prefix}" (1 keys)' in others.out
