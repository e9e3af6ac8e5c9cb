"""What ``idemkey console`` answers to input it cannot use, run as a user runs it (``python -m
idemkey console``) against the session's real Redis: never a 500.

* stored data: an uncertain entry whose time is past what a date holds is shown as no date;
* a request body nested past what Python's JSON reader takes is the 400 problem every bad
  body gets;
* a path the console does not serve, and a method a path does not take, are RFC 9457 problems
  with the headers every other answer carries (CSP, nosniff), not Starlette's bare text;
* a ``--refresh`` a browser's timer cannot hold (past 2**31 - 1 ms it fires every few
  milliseconds, a SCAN each) is refused before any banner, exit status 2, and so is the same
  value given to ``create_app``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import subprocess
import sys
from collections.abc import Callable

import pytest
import redis

from idemkey import RedisStore
from idemkey.errors import ConfigurationError
from idemkey.store.uncertain import uncertain_stream
from tests._servers import HOST, AppServer, free_port
from tests.cli.conftest import ROOT
from tests.cli.test_console_guard import token_of

pytestmark = pytest.mark.redis

PROBLEM = "application/problem+json"


def send(
    server: AppServer, method: str, path: str, body: bytes | None = None, **headers: str
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One request to ``server`` under its own Host: status, headers and body."""
    connection = http.client.HTTPConnection(HOST, server.port, timeout=30)
    with contextlib.closing(connection):
        connection.request(method, path, body=body, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.headers, answer.read()


def assert_guarded(headers: http.client.HTTPMessage) -> None:
    """The headers every answer of the console carries."""
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Cache-Control"] == "no-store"


def test_an_uncertain_time_past_what_a_date_holds_is_no_date_not_a_500(
    console: Callable[..., AppServer], store: RedisStore, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        for at in ("9" * 19, "99999999999999999"):  # years past 9999: no datetime holds them
            client.xadd(uncertain_stream(store.policy.prefix), {
                "kind": "lease_lost", "at": at, "record": "0" * 32, "method": "POST",
                "route": "/charges", "fence": "7",
            })  # fmt: skip
    finally:
        client.close()
    server = console()
    for path in ("/", "/fragment"):
        status, _, body = send(server, "GET", path)
        assert status == 200, body[-300:]
        assert body.count(b"(not a date)") == 2
        assert body.count(b"lease_lost") >= 2
    status, _, body = send(server, "GET", "/api/status")
    assert status == 200
    assert sorted(e["at"] for e in json.loads(body)["uncertain"]) == [
        99999999999999.999, 9999999999999999.999
    ]  # the numbers as stored, in seconds  # fmt: skip


def test_a_step_name_with_a_lone_surrogate_is_shown_escaped_not_a_500(
    console: Callable[..., AppServer], store: RedisStore, redis_url: str
) -> None:
    """A foreign writer's entry whose steps JSON holds a lone surrogate (``"\\ud800"``, no
    UTF-8 encodes it): /api/status answers 200, valid JSON, the step escaped."""
    server = console()  # up first: its health check reads /api/status
    client = redis.Redis.from_url(redis_url)
    try:
        client.xadd(uncertain_stream(store.policy.prefix), {
            "kind": "lease_lost", "at": "1796687000000", "record": "0" * 31 + "1",
            "method": "POST", "route": "/charges", "steps": '["\\ud800", "charge"]',
            "detail": "boom",
        })  # fmt: skip
    finally:
        client.close()
    status, headers, body = send(server, "GET", "/api/status")
    assert status == 200, body[-300:]
    assert headers["Content-Type"] == "application/json"
    (entry,) = json.loads(body)["uncertain"]
    assert entry["steps"] == ["\\ud800", "charge"]  # the escape as text, backslash and all
    for path in ("/", "/fragment"):
        status, _, body = send(server, "GET", path)
        assert status == 200, body[-300:]


def test_a_forget_body_nested_too_deep_is_the_400_every_bad_body_gets(
    console: Callable[..., AppServer],
) -> None:
    server = console("--allow-forget")
    headers = {
        "Origin": f"http://127.0.0.1:{server.port}",
        "X-Idemkey-Token": token_of(server),
        "Content-Type": "application/json",
    }
    for body in (b"[" * 100_000 + b"]" * 100_000, b'{"digest": ' * 50_000, b"not json"):
        status, answer, text = send(server, "POST", "/api/forget", body, **headers)
        assert status == 400, text[:300]
        assert answer["Content-Type"] == PROBLEM
        assert json.loads(text)["detail"].startswith("the body must be JSON")
        assert_guarded(answer)
    assert send(server, "GET", "/api/status")[0] == 200  # still serving


def test_unknown_paths_and_methods_are_problems_with_the_security_headers(
    console: Callable[..., AppServer],
) -> None:
    server = console("--allow-forget")
    own = {"Origin": f"http://127.0.0.1:{server.port}", "X-Idemkey-Token": token_of(server)}
    for method, path, code, allow in (
        ("GET", "/nowhere", 404, None),
        ("HEAD", "/nowhere", 404, None),
        ("POST", "/nowhere", 404, None),
        ("GET", "/api/forget", 405, "POST"),
        ("DELETE", "/api/forget", 405, "POST"),
        ("PUT", "/api/status", 405, "GET, HEAD"),
    ):
        sent = None if method in ("GET", "HEAD") else b"{}"
        status, headers, body = send(server, method, path, sent, **own)
        assert status == code, (method, path, body)
        assert headers["Content-Type"] == PROBLEM, (method, path)
        assert_guarded(headers)
        assert headers["Allow"] == allow
        if method != "HEAD":
            problem = json.loads(body)
            assert problem["status"] == code
            assert path in problem["detail"]


def run_console(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The console as a user starts it; one that starts serving is a failure, after 30 s."""
    command = [sys.executable, "-m", "idemkey", "--redis-url", redis_url, "console", *args]
    return subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, timeout=30, stdin=subprocess.DEVNULL
    )


@pytest.mark.parametrize("refresh", ["inf", "nan", "2592000", "86400.5", "0.4", "-1"])
def test_a_refresh_a_browser_timer_cannot_hold_is_refused(redis_url: str, refresh: str) -> None:
    result = run_console(redis_url, "--port", str(free_port()), "--refresh", refresh)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""  # no banner: nothing was served
    assert result.stderr == (
        f"idemkey console: --refresh must be between 0.5 and 86400 seconds (a day), got "
        f"{float(refresh)!r}\n"
    )


def test_the_longest_refresh_reaches_the_page_as_a_timer_a_browser_holds(
    console: Callable[..., AppServer],
) -> None:
    status, _, page = send(console("--refresh", "86400"), "GET", "/")
    assert status == 200
    assert b"const every = 86400000;" in page  # under 2**31 - 1 ms


@pytest.mark.parametrize("refresh", [float("inf"), float("nan"), 2_592_000, 0.1, "3", True, None])
def test_create_app_refuses_a_refresh_the_page_cannot_use(
    store: RedisStore, refresh: object
) -> None:
    from idemkey.console import create_app

    with pytest.raises(ConfigurationError, match=r"refresh must be between 0\.5 and 86400"):
        create_app(store, refresh=refresh)  # type: ignore[arg-type]
    create_app(store, refresh=86_400)  # the bounds themselves are fine
    create_app(store, refresh=0.5)
