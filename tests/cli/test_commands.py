"""doctor, demo, serve, bench and error handling, end to end.

The demo runs for real: a werkzeug server on a free port, real HTTP requests, the embedded
fakeredis store or the session's real Redis.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import idemkey.client as idemkey_client
from idemkey import Policy
from idemkey.cli import stats as stats_command
from idemkey.cli.demo_app import http_client, payments
from tests._servers import RedisServer, free_port, retried_on_a_taken_port
from tests.cli.conftest import CliRunner, Run

ROOT = Path(__file__).resolve().parents[2]


def _python_m(*argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "IDEMKEY_REDIS_URL"}
    return subprocess.run(
        [sys.executable, "-m", "idemkey", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
        check=False,
    )


def _checks(run_out: str) -> dict[str, dict[str, str]]:
    return {c["name"]: c for c in json.loads(run_out)["checks"]}


# ---- doctor -------------------------------------------------------------------------------


def test_doctor_on_the_session_server(idemkey: CliRunner, redis_url: str) -> None:
    run = idemkey("doctor", "--redis-url", redis_url, "--pings", "5")
    assert run.code == 0, run.err
    lines = run.out.splitlines()
    assert lines[0] == f"idemkey doctor: {redis_url}"
    verdicts = {line.split()[0] for line in lines[1:-1]}
    assert verdicts <= {"OK", "WARN"}
    for name in ("server version", "mode", "role", "maxmemory-policy", "persistence",
                 "scripts", "round trip"):  # fmt: skip
        assert any(line[6:].startswith(name) for line in lines[1:-1]), name
    checks = _checks(idemkey("doctor", "--redis-url", redis_url, "--json").out)
    assert checks["scripts"]["verdict"] == "OK"
    assert checks["mode"]["detail"] == "standalone"
    assert "over 20 PINGs" in checks["round trip"]["detail"]


def test_doctor_prints_the_checks_and_scripts_the_operators_page_shows(
    idemkey: CliRunner, redis_url: str
) -> None:
    """docs/operators.md's "real output": the same checks in the same order, and the scripts
    line as printed (it named 5 scripts after there were 8)."""
    import re

    page = (ROOT / "docs" / "operators.md").read_text("utf-8")
    block = re.search(r"### `idemkey doctor`\n\n```\n(.*?)```", page, re.S)
    assert block is not None
    shown = [line for line in block[1].splitlines() if line[:4] in ("OK  ", "WARN", "FAIL")]
    real = [line for line in idemkey("doctor", "--redis-url", redis_url).out.splitlines()]
    real = [line for line in real if line[:4] in ("OK  ", "WARN", "FAIL")]
    assert [line[6:24] for line in shown] == [line[6:24] for line in real]
    scripts = [line for line in real if line[6:].startswith("scripts")]
    assert scripts == [line for line in shown if line[6:].startswith("scripts")]


def test_doctor_warns_about_an_evicting_server(
    idemkey: CliRunner, redis_server_factory: Callable[..., RedisServer]
) -> None:
    server = redis_server_factory(["--maxmemory-policy", "allkeys-lru"])
    run = idemkey("doctor", "--redis-url", server.url, "--pings", "3")
    assert run.code == 0  # a warning, not a failure
    line = next(line for line in run.out.splitlines() if "maxmemory-policy" in line)
    assert line.startswith("WARN ")
    assert "allkeys-lru" in line
    assert run.out.splitlines()[-1] == "verdict: WARN"


def test_doctor_all_ok_with_noeviction_and_aof(
    idemkey: CliRunner, redis_server_factory: Callable[..., RedisServer]
) -> None:
    server = redis_server_factory(["--appendonly", "yes", "--maxmemory-policy", "noeviction"])
    run = idemkey("doctor", "--redis-url", server.url, "--json", "--pings", "3")
    assert run.code == 0
    checks = _checks(run.out)
    # Every check OK; the round trip may WARN on a box loaded by the other test workers (a
    # median over 5 ms of three PINGs), which says nothing about the server's settings.
    not_ok = {name: c for name, c in checks.items() if c["verdict"] != "OK"}
    assert set(not_ok) <= {"round trip"}, not_ok
    assert json.loads(run.out)["verdict"] == ("WARN" if not_ok else "OK")
    assert checks["persistence"]["detail"] == "AOF"


def test_doctor_fails_on_a_replica(
    idemkey: CliRunner, redis_server_factory: Callable[..., RedisServer]
) -> None:
    primary = redis_server_factory()
    replica = redis_server_factory(["--replicaof", primary.host, str(primary.port)])
    run = idemkey("doctor", "--redis-url", replica.url, "--pings", "3")
    assert run.code == 1
    assert any(line.startswith("FAIL  role") for line in run.out.splitlines())
    assert run.out.splitlines()[-1] == "verdict: FAIL"


# ---- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("doctor",),
        ("stats",),
        ("inspect", "k", "--guard"),
        ("forget", "k", "--guard", "--yes"),
        ("demo",),
    ],
)
def test_unreachable_server_is_one_line(idemkey: CliRunner, argv: tuple[str, ...]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    run = idemkey(*argv, "--redis-url", url)
    assert run.code == 3
    assert run.out == ""
    assert len(run.err.splitlines()) == 1, run.err
    assert "Traceback" not in run.err
    assert "ConnectionError" in run.err
    assert url in run.err
    assert time.monotonic() - started < 10  # no retry storm


@pytest.mark.parametrize(
    "argv",
    [
        ("bogus",),
        ("stats", "--sample", "many"),
        ("doctor", "--pings", "0", "--redis-url", "redis://127.0.0.1:1"),
        ("doctor", "--redis-url", "http://example.com"),
        ("doctor",),  # no URL anywhere
        ("serve", "--port", "70000"),
    ],
)
def test_bad_arguments_are_one_line(idemkey: CliRunner, argv: tuple[str, ...]) -> None:
    run = idemkey(*argv)
    assert run.code == 2
    assert run.out == ""
    assert len(run.err.splitlines()) == 1, run.err
    assert "Traceback" not in run.err


@pytest.mark.parametrize(
    "argv",
    [
        ("list",),
        ("list", "--uncertain"),
        ("stats",),
        ("doctor", "--pings", "1"),
        ("inspect", "--digest", "0" * 32),
        ("inspect", "k", "--guard"),
        ("forget", "k", "--guard", "--yes"),
        ("cancel", "k", "--guard", "--yes"),
        ("console", "--port", "PORT"),  # a free port: the check comes before any serving
    ],
)
@pytest.mark.parametrize("prefix", ["a{b", "}", ""])
def test_a_prefix_policy_refuses_is_a_bad_argument_everywhere(
    idemkey: CliRunner, redis_url: str, argv: tuple[str, ...], prefix: str
) -> None:
    """Not "Redis unreachable or erroring" (exit 3, as list and console said), and not 0
    records read under a name no record can have (stats, doctor, inspect --digest)."""
    argv = tuple(str(free_port()) if arg == "PORT" else arg for arg in argv)
    run = idemkey(*argv, "--redis-url", redis_url, "--prefix", prefix)
    assert (run.code, run.out) == (2, "")
    assert run.err == (
        f"idemkey {argv[0]}: bad --prefix: Policy(prefix=...): expected a non-empty string with "
        f"no '{{' or '}}', got the string {prefix!r}\n"
    )
    as_json = json.loads(idemkey("--json", *argv, "--redis-url", redis_url, "--prefix", prefix).err)
    assert as_json["exit_code"] == 2
    assert as_json["error"].startswith("bad --prefix: Policy(prefix=...)")


def test_a_configuration_error_is_a_bad_argument_not_a_redis_error(
    idemkey: CliRunner, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ConfigurationError is an option that cannot work: exit 2, never 3, which says Redis
    is unreachable or erroring."""
    from idemkey.errors import ConfigurationError

    def refused(*args: object, **kwargs: object) -> None:
        raise ConfigurationError("Policy(x=...): expected y")

    monkeypatch.setattr(stats_command, "collect_stats", refused)
    run = idemkey("stats", "--redis-url", redis_url)
    assert (run.code, run.err) == (
        2,
        "idemkey stats: ConfigurationError: Policy(x=...): expected y\n",
    )


def test_a_bare_idemkey_prints_its_usage(idemkey: CliRunner) -> None:
    """Nothing to run: the commands offered, then the error, exit status 2 (as argparse)."""
    for argv in ((), ("--prefix", "p")):
        run = idemkey(*argv)
        assert run.code == 2
        assert run.out == ""
        assert run.err.startswith("usage: idemkey ")
        for command in ("inspect", "forget", "cancel", "console"):
            assert f"\n    {command} " in run.err
        assert run.err.endswith(
            "idemkey: the following arguments are required: COMMAND (see --help)\n"
        )
    assert idemkey("--json").err.count("\n") == 1  # with --json: one JSON object still


def test_the_url_comes_from_the_environment(
    idemkey: CliRunner, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IDEMKEY_REDIS_URL", redis_url)
    assert idemkey("doctor", "--pings", "1").code == 0


def test_passwords_are_not_printed(idemkey: CliRunner) -> None:
    url = f"redis://user:s3cret@127.0.0.1:{free_port()}/0"
    run = idemkey("stats", "--redis-url", url)
    assert run.code == 3
    assert "s3cret" not in run.err
    assert "user:***@127.0.0.1" in run.err


@pytest.mark.parametrize(
    ("url", "shown", "why"),
    [
        ("redis://u:s3cret@127.0.0.1:99999/0", "redis://u:***@127.0.0.1:99999/0", "Port out of"),
        ("redis://u:s3cret@127.0.0.1:abc/0", "redis://u:***@127.0.0.1:abc/0", "Port could not"),
        ("redis://:s3cret@[::1]:-1/0", "redis://:***@[::1]:-1/0", "Port"),
        ("redis://127.0.0.1:99999/0?password=s3cret", "?password=***", "Port out of"),
    ],
)
@pytest.mark.parametrize("command", ["list", "stats", "inspect", "console"])
def test_a_url_with_a_password_and_a_bad_port_is_a_bad_argument(
    idemkey: CliRunner, url: str, shown: str, why: str, command: str
) -> None:
    """The port is no port: a bad --redis-url (exit 2) as without a password, not an internal
    error (70) from printing it; and the password is never printed."""

    def attempt() -> Run:
        port = str(free_port())  # the console binds it, then fails on the URL, before serving
        argv = {"inspect": ("inspect", "k", "--guard"), "console": ("console", "--port", port)}
        run = idemkey(*argv.get(command, (command,)), "--redis-url", url)
        assert " is in use " not in run.err, run.err  # another process took the port first
        return run

    run = retried_on_a_taken_port(attempt)
    assert run.code == 2, run.err
    assert run.err.startswith(f"idemkey {command}: bad --redis-url ")
    assert shown in run.err
    assert why in run.err
    assert "s3cret" not in run.err
    assert len(run.err.splitlines()) == 1


def test_a_bug_is_one_line_unless_debugging(
    idemkey: CliRunner, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(stats_command, "collect_stats", broken)
    run = idemkey("stats", "--redis-url", redis_url)
    assert run.code == 70
    assert run.err == (
        "idemkey stats: internal error: RuntimeError: boom "
        "(set IDEMKEY_DEBUG=1 for the traceback)\n"
    )
    monkeypatch.setenv("IDEMKEY_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        idemkey("stats", "--redis-url", redis_url)


def test_python_m_reports_errors_without_traceback() -> None:
    result = _python_m("doctor", "--redis-url", f"redis://127.0.0.1:{free_port()}/0")
    assert result.returncode == 3
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    assert "Traceback" not in result.stderr


# ---- demo ---------------------------------------------------------------------------------


def test_demo_embedded(idemkey: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    # $IDEMKEY_REDIS_URL may name production: the demo writes to a Redis only when told on the
    # command line, and otherwise uses its embedded store.
    monkeypatch.setenv("IDEMKEY_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    run = idemkey("demo")
    assert run.code == 0, run.out + run.err
    assert "store: embedded fakeredis" in run.out
    for step in range(1, 8):
        assert f"\n{step}. " in run.out
    assert "FAILED" not in run.out
    assert "409 in_flight, Retry-After: 1" in run.out
    assert "-> 422 key_reused: RefusedError, not retried" in run.out
    # The retries are idemkey.client's: it says each one, and keeps the key and the bytes.
    assert "attempt 1 failed (timeout); retrying in" in run.out
    assert "attempt 2 failed (409 in_flight); retrying in" in run.out
    assert "-> 201 after 3 attempts, Idempotent-Replayed: true" in run.out
    assert "-> 400 missing_key" in run.out
    assert "every step behaved" in run.out


def test_demo_on_a_real_server_leaves_three_records(
    idemkey: CliRunner, real_client: redis.Redis, redis_url: str, prefix: str
) -> None:
    run = idemkey("demo", "--redis-url", redis_url, "--prefix", prefix, "--json")
    assert run.code == 0, run.out + run.err
    story = json.loads(run.out)
    assert story["ok"] is True
    assert [s["ok"] for s in story["steps"]] == [True] * 7
    stats = json.loads(idemkey("stats", "--redis-url", redis_url, "--prefix", prefix, "--json").out)
    assert stats["states"]["complete"] == 3  # three payments; the 422 and the 400 stored nothing
    assert stats["records"] == 3
    assert stats["ttl"]["1 min - 1 h"] == 3  # the demo keeps records 10 minutes


def test_demo_exits_non_zero_when_a_step_misbehaves(
    idemkey: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A misconfigured app: POST is not a guarded method, so the retry charges again.
    broken = Policy(methods=frozenset({"PATCH"}), scope=payments.account_scope)
    monkeypatch.setattr(payments, "demo_policy", lambda prefix: broken)
    # Its step 6 then retries timeouts until the client's deadline (15 s of real backoff):
    # what is checked here is the verdict, so that step gives up after 1 s.
    real_policy = idemkey_client.RetryPolicy

    def short(**options: Any) -> idemkey_client.RetryPolicy:
        return real_policy(**{**options, "deadline": 1.0})

    monkeypatch.setattr(idemkey_client, "RetryPolicy", short)
    run = idemkey("demo")
    assert run.code == 1
    assert "FAILED: expected the header Idempotent-Replayed: true" in run.out
    assert "did NOT behave" in run.out


def test_demo_without_flask_is_one_line(
    idemkey: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "flask", None)  # import raises ImportError
    run = idemkey("demo")
    assert run.code == 2
    assert run.err == "idemkey demo: the demo app needs flask: pip install 'idemkey-redis[demo]'\n"


def test_python_m_idemkey_demo() -> None:
    result = _python_m("demo")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every step behaved" in result.stdout
    assert result.stderr == ""


# ---- serve --------------------------------------------------------------------------------


@pytest.fixture
def served() -> Iterator[tuple[subprocess.Popen[str], str]]:
    env = {k: v for k, v in os.environ.items() if k != "IDEMKEY_REDIS_URL"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "idemkey", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    try:
        assert proc.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout=30):
            pytest.fail("idemkey serve printed nothing within 30 s")
        first = proc.stdout.readline()
        assert first.startswith("idemkey demo app on http://127.0.0.1:"), first
        yield proc, first.split()[4]
    finally:
        proc.terminate()
        proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_serve_runs_the_demo_app(served: tuple[subprocess.Popen[str], str]) -> None:
    _, base = served
    client = http_client.Client(base)
    body = {"amount": 700, "currency": "chf"}
    first = client.request("POST", "/charges", body, {"Idempotency-Key": "k1"})
    again = client.request("POST", "/charges", body, {"Idempotency-Key": "k1"})
    other_account = client.request(
        "POST", "/charges", body, {"Idempotency-Key": "k1", "Account": "acct_other"}
    )
    assert (first.status, again.status, other_account.status) == (201, 201, 201)
    assert again.body == first.body
    assert again.header("Idempotent-Replayed") == "true"
    assert other_account.body["id"] != first.body["id"]  # same key, other tenant: other record
    assert first.header("Location") == f"/charges/{first.body['id']}"
    assert client.request("GET", first.header("Location")).body == first.body
    assert client.charges()["count"] == 2


def test_demo_app_rejects_bad_input_with_problems(
    served: tuple[subprocess.Popen[str], str],
) -> None:
    client = http_client.Client(served[1])
    cases = [
        ({"amount": "10", "currency": "eur"}, {}, "bad_amount"),
        ({"amount": True, "currency": "eur"}, {}, "bad_amount"),
        ({"amount": 10, "currency": "xyz"}, {}, "bad_currency"),
        ([1, 2], {}, "bad_json"),
        ({"amount": 10, "currency": "eur"}, {"Demo-Delay": "60"}, "bad_delay"),
        ({"amount": 10, "currency": "eur"}, {"Demo-Delay": "nan"}, "bad_delay"),
    ]
    for body, headers, code in cases:
        answer = client.request("POST", "/charges", body, {"Idempotency-Key": code, **headers})
        assert (answer.status, answer.body["code"]) == (400, code)
        assert answer.header("Content-Type") == "application/problem+json"
    # A 400 means the request never began: the key is free to carry the corrected request.
    fixed = client.request(
        "POST", "/charges", {"amount": 10, "currency": "eur"}, {"Idempotency-Key": "bad_amount"}
    )
    assert fixed.status == 201


def test_serve_on_a_busy_port_is_one_line(idemkey: CliRunner) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        run = idemkey("serve", "--port", str(busy.getsockname()[1]))
    assert run.code == 1
    assert run.err.startswith("idemkey serve: cannot listen on 127.0.0.1:")
    assert len(run.err.splitlines()) == 1


# ---- bench --------------------------------------------------------------------------------


def test_bench_delegates_to_the_benchmarks_package(
    idemkey: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []
    fake = types.ModuleType("benchmarks")
    fake.__file__ = str(ROOT / "benchmarks" / "__init__.py")  # this checkout's suite
    fake.main = lambda argv: seen.append(argv) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "benchmarks", fake)
    monkeypatch.setenv("IDEMKEY_REDIS_URL", "redis://production:6379/0")  # never benchmarked
    assert idemkey("bench", "--", "--quick", "-k", "replay").code == 0
    assert idemkey("--redis-url", "redis://127.0.0.1:1/0", "bench", "--", "--quick").code == 0
    # Without "--" as well: the suite's arguments begin at the first one bench does not know.
    assert idemkey("bench", "--quick", "-k", "replay").code == 0
    assert idemkey("bench", "--redis-url", "redis://127.0.0.1:1/0", "--quick").code == 0
    assert idemkey("--prefix", "bench", "bench", "-k", "bench").code == 0
    assert seen == [
        ["--quick", "-k", "replay"],
        ["--redis-url", "redis://127.0.0.1:1/0", "--quick"],
        ["--quick", "-k", "replay"],
        ["--redis-url", "redis://127.0.0.1:1/0", "--quick"],
        ["-k", "bench"],
    ]


def test_bench_never_runs_another_benchmarks_package(
    idemkey: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[list[str]] = []
    other = types.ModuleType("benchmarks")
    other.__file__ = str(tmp_path / "benchmarks" / "__init__.py")  # some other project's
    other.main = lambda argv: seen.append(argv) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "benchmarks", other)
    run = idemkey("bench")
    assert (run.code, seen) == (2, [])
    assert len(run.err.splitlines()) == 1
    assert f"run `python -m benchmarks` from {ROOT}" in run.err


def test_bench_without_the_suite_is_one_line(
    idemkey: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    from idemkey.cli import bench

    monkeypatch.setattr(bench, "checkout", lambda: None)  # an installed idemkey: no checkout
    run = idemkey("bench")
    assert run.code == 2
    assert len(run.err.splitlines()) == 1
    assert "runs the benchmark suite of a source checkout" in run.err
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "benchmarks", None)  # import raises ImportError
    run = idemkey("bench")
    assert run.code == 2
    assert len(run.err.splitlines()) == 1
    assert "benchmark suite in" in run.err
    assert "is not importable" in run.err
