"""Operators see the key a client sent: ``idemkey list``, ``idemkey inspect`` and the console
name the records in flight by it, escaped (keys are opaque client tokens, possibly hostile),
while a completed record keeps it only behind ``Policy(keep_key_after_completion=True)`` and
stays within its memory goal without it. Real redis-server, a real HTTP server running the
README's Flask app, the console as its own process.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import threading
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
import redis
from werkzeug.serving import make_server

from idemkey import Policy, RedisStore, guard
from idemkey._core import record_for
from idemkey.guard import GUARD_METHOD
from idemkey.http._scope import NO_CREDENTIALS
from tests._servers import AppServer, RedisServer, wait_until
from tests.cli.conftest import CliRunner
from tests.faults.test_url_clients import readme_flask_app

pytestmark = pytest.mark.redis

#: A key a hostile client could send: markup, the origin's own delimiters, a percent sign.
HOSTILE = '<b>x</b>%;"k:1'
ESCAPED = '<b>x</b>%25%3B"k:1'


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


def test_list_and_the_console_show_the_key_of_a_request_in_flight(
    redis_url: str, prefix: str, idemkey: CliRunner, console: Callable[..., AppServer]
) -> None:
    release = threading.Event()
    app = readme_flask_app(redis_url, prefix, view=lambda: release.wait(30))
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    answers: list[int] = []

    def send() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=30)
        body = json.dumps({"amount": 5})
        headers = {"Idempotency-Key": HOSTILE, "Content-Type": "application/json"}
        conn.request("POST", "/charges", body, headers)
        answers.append(conn.getresponse().status)
        conn.close()

    client = threading.Thread(target=send)
    client.start()
    try:
        listed = wait_until(
            lambda: (
                (run := idemkey("--redis-url", redis_url, "--prefix", prefix, "list"))
                and "in_progress" in run.out
                and run.out
            ),
            20,
            "the request in flight",
        )
        line = next(row for row in listed.splitlines() if row.startswith("in_progress"))
        assert line.endswith("  " + ESCAPED), line
        assert "POST /charges" in line

        shown = console()
        status = json.loads(_get(shown.url + "/api/status"))
        assert [s["client_key"] for s in status["active"]] == [ESCAPED]
        page = _get(shown.url + "/fragment")
        assert "&lt;b&gt;x&lt;/b&gt;%25%3B" in page  # escaped for the page
        assert "<b>x</b>" not in page  # the key is text on the page, never markup

        record = record_for(prefix, NO_CREDENTIALS, "POST", "/charges", HOSTILE)
        found = idemkey("--redis-url", redis_url, "--prefix", prefix, "inspect", "--digest",
                        record.digest)  # fmt: skip
        assert f"key       {ESCAPED}\n" in found.out, found.out
    finally:
        release.set()
        client.join(30)
        server.shutdown()
        app.extensions["idemkey"].store.client.close()
    assert answers == [201]
    # Completed: the key goes with the claim's fields (keep_key_after_completion is off).
    done = idemkey("--redis-url", redis_url, "--prefix", prefix, "list")
    line = next(row for row in done.out.splitlines() if row.startswith("complete"))
    assert line.endswith("  -"), line


def _complete_with_a_long_key(store: RedisStore, key: str) -> int:
    with guard(store, key, payload={"amount": 1}) as call:
        if not call.replayed:
            call.save(os.urandom(100))
    record = record_for(store.policy.prefix, "", GUARD_METHOD, "", key)
    return int(store.client.execute_command("MEMORY", "USAGE", record.key, "SAMPLES", "0"))


def test_a_completed_record_stays_within_its_goal_and_keeps_the_key_only_when_told(
    private_redis_server: RedisServer,
) -> None:
    client = private_redis_server.client()
    # The longest key a header carries (255), in characters of two UTF-8 bytes each: its
    # origin spans 9 fields of 64 bytes while in flight.
    key = "é" * 255
    try:
        plain = RedisStore(client, Policy(prefix="mem"))
        assert _complete_with_a_long_key(plain, key) <= 400  # the goal for a 100 B answer
        status = plain.record(key)
        assert status is not None
        assert status.state == "complete"
        assert status.client_key == ""

        kept = RedisStore(client, Policy(prefix="kept", keep_key_after_completion=True))
        _complete_with_a_long_key(kept, key)
        status = kept.record(key)
        assert status is not None
        assert status.state == "complete"
        assert status.client_key == key
        assert not status.key_cut
        assert status.age is None  # the claim's time is not a completed record's age
    finally:
        client.close()


def test_digest_only_keeps_no_key_and_a_new_claim_drops_the_old_origins_pieces(
    real_client: redis.Redis, prefix: str
) -> None:
    long_key = "order-" + "9" * 240
    with pytest.raises(RuntimeError), guard(RedisStore(real_client, Policy(prefix=prefix)),
                                            long_key):  # fmt: skip
        raise RuntimeError("failed: the record is released, its origin stays")
    store = RedisStore(real_client, Policy(prefix=prefix, keep_keys=False))
    status = store.record(long_key)
    assert status is not None
    assert status.client_key == long_key
    held = guard(store, long_key)
    held.__enter__()
    try:
        status = store.record(long_key)
        assert status is not None
        assert status.state == "in_progress"
        assert status.client_key == ""
        assert status.method == GUARD_METHOD
        fields = {k.decode() for k in real_client.hkeys(held.record.record_key)}
        assert fields & {"i1", "i2", "i3", "i4"} == set()  # the long origin's pieces went
        assert not any(long_key.encode() in v for v in real_client.hvals(held.record.record_key))
    finally:
        held.__exit__(RuntimeError, RuntimeError("stop"), None)
        store.close()


def test_an_empty_prefix_names_the_prefixes_that_hold_records(
    real_client: redis.Redis, prefix: str, redis_url: str, idemkey: CliRunner
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix + "-payments"))
    with guard(store, "k1") as call:
        if not call.replayed:
            call.save(1)
    # A prefix holding only a hint (a 0.2 lock string) holds no record: not named.
    real_client.set(f"{prefix}-lockonly:{{{'0' * 32}}}:lock", b"owner", px=60_000)
    empty = prefix + "-empty"
    run = idemkey("--redis-url", redis_url, "--prefix", empty, "--json", "list")
    answer: dict[str, Any] = json.loads(run.out)
    assert answer["count"] == 0
    assert prefix + "-payments" in answer["other_prefixes"]
    assert empty not in answer["other_prefixes"]
    assert prefix + "-lockonly" not in answer["other_prefixes"]
    text = idemkey("--redis-url", redis_url, "--prefix", empty, "list").out
    assert f'no record under prefix "{empty}" matches\n' in text
    assert "records are kept under other prefixes: " in text
    store.close()


def test_the_consoles_advice_follows_the_records_state_now(
    real_client: redis.Redis, prefix: str, console: Callable[..., AppServer]
) -> None:
    store = RedisStore(real_client, Policy(prefix=prefix))
    with contextlib.suppress(RuntimeError), guard(store, "order-5") as call:
        call.step("reserve", lambda: 1)
        raise RuntimeError("card declined")  # released with a finished step: uncertain
    shown = console()

    def entry() -> dict[str, Any]:
        found: list[dict[str, Any]] = json.loads(_get(shown.url + "/api/status"))["uncertain"]
        assert [e["kind"] for e in found] == ["released_with_steps"]
        return found[0]

    assert entry()["state_now"] == "released"
    assert "compensate the finished steps" in entry()["action"]
    with guard(store, "order-5") as call:  # the retry resumes after "reserve" and completes
        call.step("reserve", lambda: 1)
        call.save({"id": "o_5"})
    wait_until(lambda: entry()["state_now"] == "complete", 20, "the record completed")
    assert "compensate" not in entry()["action"]
    assert "completed the operation" in entry()["action"]
    page = _get(shown.url + "/fragment")
    assert "completed the operation" in page
    assert "compensate" not in page
    store.close()


def test_list_uncertain_advice_follows_the_records_state_now(
    real_client: redis.Redis, prefix: str, redis_url: str, idemkey: CliRunner
) -> None:
    """``idemkey list --uncertain`` gives the console's advice (``action_now``), not the one
    the entry was written with, in text and in JSON."""
    store = RedisStore(real_client, Policy(prefix=prefix))
    with contextlib.suppress(RuntimeError), guard(store, "order-6") as call:
        call.step("reserve", lambda: 1)
        raise RuntimeError("card declined")  # released with a finished step: uncertain
    # The entry is written off the caller's path (the store's keeper): listed once it landed
    # (CI read the stream before it did, once, under load).
    wait_until(lambda: len(store.uncertain()) == 1, 10, "the uncertain entry landed")
    argv = ("--redis-url", redis_url, "--prefix", prefix, "list", "--uncertain")
    before = idemkey(*argv).out
    assert "compensate the finished steps" in before
    with guard(store, "order-6") as call:  # the retry resumes after "reserve" and completes
        call.step("reserve", lambda: 1)
        call.save({"id": "o_6"})
    text = idemkey(*argv).out
    assert "compensate" not in text
    assert "completed the operation" in text
    (row,) = json.loads(idemkey(*argv[:4], "--json", *argv[4:]).out)["uncertain"]
    assert row["state_now"] == "complete"
    assert "completed the operation" in row["action"]
    store.close()
