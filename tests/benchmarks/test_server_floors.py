"""The real-server rows' own floors (issue 39): what they measure, and how they are reported.

The floor app must do exactly the floor's Redis work inside the server that runs idemkey: a
new key one claim and one complete, a replay one claim (checked on the session's Redis, real
gunicorn and uvicorn). A server row's target is its added latency over that in-server floor's;
the ratio to the bare floor of the benchmark process stays beside it, labelled old.
"""

from __future__ import annotations

import http.client
import os
import secrets
import time
from typing import Any

import pytest
import redis

from benchmarks.cases import PAYLOAD, Case
from benchmarks.report import build_cases, check_targets
from benchmarks.servers import HttpServer
from benchmarks.tables import added_table


def _evalsha_calls(admin: redis.Redis) -> int:
    stats = admin.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0))


def _settled(admin: redis.Redis, record: str, before: int, calls: int | None) -> int:
    """EVALSHA calls since ``before``, once ``record`` is complete and at least ``calls``
    were counted (a deadline of 10 s); a few ms more for a call that should not come."""
    deadline = time.monotonic() + 10.0
    while True:
        done = b"resp" in admin.hgetall(record)
        counted = _evalsha_calls(admin) - before
        if done and (calls is None or counted >= calls):
            time.sleep(0.05)  # an extra call, if the floor made one, lands in this time
            return _evalsha_calls(admin) - before
        assert time.monotonic() < deadline, (record, counted, done)
        time.sleep(0.005)  # polling a condition with a deadline


def _post(conn: http.client.HTTPConnection, path: str, key: str) -> None:
    conn.request("POST", path, PAYLOAD, {"Content-Type": "application/json",
                                         "Idempotency-Key": key})  # fmt: skip
    response = conn.getresponse()
    assert (response.status, response.read()[:6]) == (201, b'{"id":'), path


@pytest.mark.benchmark
@pytest.mark.redis
@pytest.mark.parametrize(
    ("kind", "app", "paths"),
    [
        ("gunicorn", "benchmarks.http_apps:make_wsgi()", ("/wsgi/floor", "/flask/floor")),
        ("uvicorn", "benchmarks.http_apps:make_asgi", ("/asgi/floor",)),
    ],
)
def test_the_in_server_floor_claims_and_completes_a_new_key_and_only_claims_a_replay(
    redis_url: str, kind: str, app: str, paths: tuple[str, ...]
) -> None:
    pytest.importorskip("gunicorn" if kind == "gunicorn" else "uvicorn")
    prefix = "bench-floor-" + secrets.token_hex(4)
    env = {"IDEMKEY_BENCH_REDIS_URL": redis_url, "IDEMKEY_BENCH_PREFIX": prefix}
    admin = redis.Redis.from_url(redis_url)
    server = HttpServer(kind, app, env)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    exact = not os.environ.get("IDEMKEY_REDIS_URL")  # the session's private server
    try:
        for path in paths:
            key = secrets.token_hex(8)
            # "load" first: its claim loads the scripts (NOSCRIPT, then SCRIPT LOAD).
            for request_key, calls in (("load", None), (key, 2), (key, 1), (key, 1)):
                before = _evalsha_calls(admin)
                _post(conn, path, request_key)
                # uvicorn's floor completes after the answer went out (as idemkey does):
                # wait for the record to be complete, and for the calls to be counted.
                settled = _settled(admin, f"{prefix}:floor:{{{request_key}}}", before, calls)
                if exact and calls is not None:
                    assert settled == calls, path
    finally:
        conn.close()
        server.close()
        for name in admin.scan_iter(f"{prefix}:*"):
            admin.delete(name)
        admin.close()


def _case(p50: int, **fields: Any) -> dict[str, Any]:
    return {"p50": p50, **fields}


def test_a_server_row_is_divided_by_its_in_server_floor_and_keeps_the_old_ratio() -> None:
    samples = {
        "floor.replay": [100_000] * 5,
        "gunicorn.wsgi.plain": [600_000] * 5,
        "gunicorn.wsgi.replay": [900_000] * 5,  # adds 300 us
        "gunicorn.wsgi.floor.replay": [850_000] * 5,  # the floor adds 250 us in the server
        "wsgi.plain": [50_000] * 5,
        "wsgi.replay": [160_000] * 5,  # adds 110 us in process
    }

    def case(name: str, **kw: Any) -> Case:
        return Case(name, "http", lambda i: None, **kw)

    cases = [
        Case("floor.replay", "core", lambda i: None),
        case("gunicorn.wsgi.plain"),
        case("gunicorn.wsgi.replay", floor="floor.replay", baseline="gunicorn.wsgi.plain",
             server_floor="gunicorn.wsgi.floor.replay"),
        Case("gunicorn.wsgi.floor.replay", "http-floor", lambda i: None, floor="floor.replay",
             baseline="gunicorn.wsgi.plain"),
        case("wsgi.plain"),
        case("wsgi.replay", floor="floor.replay", baseline="wsgi.plain"),
    ]  # fmt: skip
    out = build_cases(cases, samples, {})
    row = out["gunicorn.wsgi.replay"]
    assert row["added_x_server_floor"] == pytest.approx(300 / 250)
    assert row["added_x_floor"] == pytest.approx(3.0)  # the old column: the bare floor
    assert "added_x_server_floor" not in out["wsgi.replay"]
    targets = {t["target"]: t for t in check_targets(out, {})}
    assert targets["gunicorn.wsgi.replay adds <= 1.2x in-server floor"]["ok"] is True
    assert targets["wsgi.replay adds <= 1.2x floor"]["ok"] is True  # 1.10x
    assert not [t for t in targets if t.startswith("gunicorn.wsgi.floor.")]  # the reference
    table = "\n".join(added_table(out, [(n, c) for n, c in out.items() if "added_ns" in c]))
    assert "| gunicorn.wsgi.replay | 600 | 900 | 300 | 250 | 1.20x | 3.00x |" in table
    assert "| wsgi.replay | 50.0 | 160 | 110 | 100 | 1.10x | 1.10x |" in table
    assert "old: added x bare floor" in table
