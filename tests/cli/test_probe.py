"""``idemkey probe`` over real HTTP: idemkey's own demo app passes every check, through the Flask
extension on werkzeug's threaded server and through the ASGI middleware on uvicorn (both on the
session's real Redis); small deliberately broken servers fail the check that names their bug.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis
from werkzeug.serving import make_server

from idemkey import RedisStore
from idemkey.cli.demo_app import create_app, demo_policy, running
from tests._servers import AppServer, free_port
from tests.cli.conftest import CliRunner, Run

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

ROOT = Path(__file__).resolve().parents[2]
CHARGE = '{"amount": 1000, "currency": "eur"}'
TENANT = ("--other-tenant-header", "Account: acct_other")
# The demo's payment takes 0.2 s, so the requests of check 5 surely overlap on a loaded machine
# (without overlap the check says "inconclusive", a warning, and these tests want every PASS).
SLOW = ("-H", "Demo-Delay: 0.2")
VERDICTS = ("PASS", "WARN", "INCONCLUSIVE", "FAIL", "SKIP")


def _verdicts(run: Run) -> dict[int, str]:
    """Check number -> verdict, from the text output's check lines."""
    found = {}
    for line in run.out.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[0] in VERDICTS and parts[1].isdigit():
            found[int(parts[1])] = parts[0]
    return found


def _line(run: Run, check: int) -> str:
    return next(line for line in run.out.splitlines() if line.split()[1:2] == [str(check)])


# ---- idemkey's own demo app ---------------------------------------------------------------


@pytest.fixture
def flask_demo(real_client: redis.Redis, prefix: str) -> Iterator[str]:
    store = RedisStore(real_client, demo_policy(prefix))
    try:
        with running(create_app(store)) as base:
            yield base
    finally:
        store.close()


def test_the_flask_demo_passes_every_check(idemkey: CliRunner, flask_demo: str) -> None:
    run = idemkey("probe", f"{flask_demo}/charges", "--data", CHARGE, *TENANT, *SLOW)
    assert run.code == 0, run.out + run.err
    assert run.err == ""
    assert _verdicts(run) == dict.fromkeys(range(1, 7), "PASS"), run.out
    assert "Idempotent-Replayed: true" in _line(run, 2)
    assert "422" in _line(run, 3)
    assert "requires a key: 400" in _line(run, 4)
    # What the server says beyond the draft: the problem's retry and retention members.
    assert "retry: new_key, retention: " in _line(run, 3)
    assert "retry: new_key, retention: " in _line(run, 4)
    assert run.out.splitlines()[-1].startswith("verdict: PASS: every check holds")


def test_the_operators_page_shows_what_the_probe_prints_of_the_demo(
    idemkey: CliRunner, flask_demo: str
) -> None:
    """docs/operators.md's probe of `idemkey serve` ("real output"): each check's line up to
    the body it quotes, which the page trims (checks 3 and 4 lacked the retry and retention)."""
    import re

    page = (Path(__file__).resolve().parents[2] / "docs" / "operators.md").read_text("utf-8")
    block = re.search(r"```console\n\$ idemkey probe .*?```", page, re.S)
    assert block is not None
    run = idemkey("probe", f"{flask_demo}/charges", "--data", CHARGE, *TENANT, *SLOW)
    for check in (3, 4):
        shown = next(line for line in block[0].splitlines() if line.startswith(f"PASS  {check} "))
        assert _line(run, check).split(", body")[0] == shown.split(", body")[0]


def test_the_probe_reports_a_retention_header_and_a_marked_first_answer(
    idemkey: CliRunner, real_client: redis.Redis, prefix: str
) -> None:
    policy = demo_policy(prefix).replace(
        retention_header="Idempotency-Retention", mark_first_responses=True, ttl=3600.0
    )
    store = RedisStore(real_client, policy)
    try:
        with running(create_app(store)) as base:
            run = idemkey("probe", f"{base}/charges", "--data", CHARGE, *SLOW)
    finally:
        store.close()
    assert run.code == 0, run.out + run.err
    assert "Idempotent-Replayed: false, Idempotency-Retention: 3600" in _line(run, 1)
    assert "Idempotent-Replayed: true, Idempotency-Retention: 3600" in _line(run, 2)
    assert "retry: new_key, retention: 3600 s" in _line(run, 3)


def test_json_output_for_ci(idemkey: CliRunner, flask_demo: str) -> None:
    run = idemkey(
        "probe", f"{flask_demo}/charges", "-d", CHARGE, "--json", "--concurrency", "3", *SLOW
    )
    assert run.code == 0, run.out + run.err
    report = json.loads(run.out)
    assert report["verdict"] == "PASS"
    assert report["exit_code"] == 0
    assert [c["verdict"] for c in report["checks"]] == ["PASS"] * 5 + ["SKIP"]
    assert report["edited_body"] == "amount: 1000 -> 1001"
    assert report["requests_sent"] <= report["max_requests"] == 8 + 3 - 1  # no tenant check
    assert "real records" in report["warning"]


@pytest.fixture
def uvicorn_demo(
    redis_url: str, prefix: str, real_client: redis.Redis, tmp_path: Path
) -> Iterator[str]:
    """The demo app behind the ASGI middleware, on a uvicorn process."""

    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "uvicorn", "--factory",
                "idemkey.cli.demo_app.asgi_app:from_environment", "--host", "127.0.0.1",
                "--port", str(port), "--log-level", "warning"]  # fmt: skip

    env = {"IDEMKEY_REDIS_URL": redis_url, "IDEMKEY_PREFIX": prefix}
    log = tmp_path / "uvicorn.log"
    with AppServer(
        command, log=log, cwd=ROOT, env=env, name="uvicorn", health="/charges", timeout=20
    ) as server:
        yield server.url


def test_the_asgi_demo_on_uvicorn_passes_every_check(
    idemkey: CliRunner, uvicorn_demo: str, real_client: redis.Redis, prefix: str
) -> None:
    run = idemkey("probe", f"{uvicorn_demo}/charges", "--data", CHARGE, *TENANT, *SLOW)
    assert run.code == 0, run.out + run.err
    assert _verdicts(run) == dict.fromkeys(range(1, 7), "PASS"), run.out
    assert "Idempotent-Replayed: true" in _line(run, 2)
    # The records are the middleware's, in the session's Redis.
    assert list(real_client.scan_iter(match=f"{prefix}:*", count=1000))


# ---- deliberately broken servers ----------------------------------------------------------


class BrokenPayments:
    """A payments endpoint with one idempotency bug (or none at all), as a plain WSGI app.

    ``none``: no idempotency; ``no-fingerprint``: a cache by key alone (no body, no tenant);
    ``edited-runs``: a retry whose body differs runs again and overwrites the cache;
    ``racy``: check-then-act without a lock, so duplicates arriving together all run.
    """

    def __init__(self, bug: str) -> None:
        self.bug = bug
        self.cache: dict[object, tuple[bytes, bytes]] = {}
        self.lock = threading.Lock()  # the naive cache's, around the whole exchange
        self.counting = threading.Lock()
        self.runs = 0

    def charge(self, body: bytes) -> bytes:
        if self.bug == "racy":
            time.sleep(0.3)  # the payment provider: duplicates arrive while it works
        with self.counting:
            self.runs += 1
        data = json.loads(body)
        return json.dumps({"id": f"ch_{uuid.uuid4().hex[:8]}", "amount": data["amount"]}).encode()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        key = environ.get("HTTP_IDEMPOTENCY_KEY")
        tenant = environ.get("HTTP_ACCOUNT", "")
        status, answer, replayed = self.answer(body, key, tenant)
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(answer)))]
        if replayed:
            headers.append(("Idempotent-Replayed", "true"))
        start_response(status, headers)
        return [answer]

    def answer(self, body: bytes, key: str | None, tenant: str) -> tuple[str, bytes, bool]:
        if self.bug == "none":
            return "201 Created", self.charge(body), False
        if key is None:
            return "400 Bad Request", b'{"code": "missing_key"}', False
        if self.bug == "no-fingerprint":
            with self.lock:  # one at a time: only the missing fingerprint is wrong
                if key in self.cache:
                    return "201 Created", self.cache[key][1], True
                made = self.charge(body)
                self.cache[key] = (body, made)
                return "201 Created", made, False
        record = (tenant, key)
        cached = self.cache.get(record)  # racy: read, then run, then write
        if cached is not None and cached[0] == body:
            return "201 Created", cached[1], True
        if cached is not None and self.bug != "edited-runs":
            return "422 Unprocessable Content", b'{"code": "key_reused"}', False
        made = self.charge(body)
        self.cache[record] = (body, made)
        return "201 Created", made, False


@pytest.fixture
def broken() -> Iterator[dict[str, str]]:
    """One server per bug, on real ports (werkzeug's threaded server); name -> base URL."""
    servers, bases = [], {}
    for bug in ("none", "no-fingerprint", "edited-runs", "racy"):
        server = make_server("127.0.0.1", 0, BrokenPayments(bug), threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        bases[bug] = f"http://127.0.0.1:{server.socket.getsockname()[1]}"
    yield bases
    for server in servers:
        server.shutdown()
        server.server_close()


def test_no_idempotency_at_all(idemkey: CliRunner, broken: dict[str, str]) -> None:
    run = idemkey("probe", broken["none"] + "/charges", "-d", CHARGE, *TENANT)
    assert run.code == 1, run.out + run.err
    verdicts = _verdicts(run)
    assert (verdicts[2], verdicts[3], verdicts[5]) == ("FAIL", "FAIL", "FAIL"), run.out
    assert "the retry ran again" in _line(run, 2)
    assert 'id: "ch_' in run.out  # the per-field comparison shows the new id
    assert "an edited retry was executed" in _line(run, 3)
    assert verdicts[4] == "WARN"
    assert "runs without a key" in _line(run, 4)
    assert "concurrent duplicates ran 5 times" in _line(run, 5)
    assert run.out.splitlines()[-1].startswith("verdict: FAIL: checks [2, 3, 5] FAILED")


def test_a_naive_cache_replays_an_edited_retry_and_leaks_across_tenants(
    idemkey: CliRunner, broken: dict[str, str]
) -> None:
    run = idemkey("probe", broken["no-fingerprint"] + "/charges", "-d", CHARGE, *TENANT)
    assert run.code == 1, run.out + run.err
    verdicts = _verdicts(run)
    assert (verdicts[1], verdicts[2], verdicts[4]) == ("PASS", "PASS", "PASS"), run.out
    assert verdicts[3] == "FAIL"
    assert "an edited retry was replayed" in _line(run, 3)
    assert verdicts[6] == "FAIL"
    assert "another tenant was served the first tenant's response" in _line(run, 6)


def test_an_edited_retry_answered_with_2xx(idemkey: CliRunner, broken: dict[str, str]) -> None:
    run = idemkey("probe", broken["edited-runs"] + "/charges", "-d", CHARGE, "--json")
    assert run.code == 1, run.out + run.err
    checks = {c["check"]: c for c in json.loads(run.out)["checks"]}
    assert [checks[n]["verdict"] for n in (1, 2, 4)] == ["PASS"] * 3
    assert checks[3]["verdict"] == "FAIL"
    assert "an edited retry was executed" in checks[3]["summary"]
    assert ': 201, body {"id": "ch_' in checks[3]["summary"]


def test_concurrent_duplicates_run_twice(idemkey: CliRunner, broken: dict[str, str]) -> None:
    run = idemkey("probe", broken["racy"] + "/charges", "-d", CHARGE, *TENANT)
    assert run.code == 1, run.out + run.err
    verdicts = _verdicts(run)
    assert verdicts == {1: "PASS", 2: "PASS", 3: "PASS", 4: "PASS", 5: "FAIL", 6: "PASS"}, run.out
    assert "concurrent duplicates ran" in _line(run, 5)


class SameAnswer:
    """An endpoint that always answers ``{"ok": true}``, as a plain WSGI app (no idemkey).

    ``idempotent=False``: runs every request. ``True``: one answer per key and body, 422 for
    another body, 400 without a key; it marks no replay. ``runs`` counts executions.
    """

    def __init__(self, idempotent: bool) -> None:
        self.idempotent = idempotent
        self.lock = threading.Lock()
        self.seen: dict[str, bytes] = {}
        self.runs = 0

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        key = environ.get("HTTP_IDEMPOTENCY_KEY")
        with self.lock:
            status = "201 Created"
            if not self.idempotent:
                self.runs += 1
            elif key is None:
                status = "400 Bad Request"
            elif self.seen.setdefault(key, body) != body:
                status = "422 Unprocessable Content"
            elif len(self.seen) > self.runs:
                self.runs += 1
        answer = b'{"ok": true}'
        start_response(status, [("Content-Type", "application/json")])
        return [answer]


@pytest.fixture(params=[False, True], ids=["runs-every-time", "idempotent-unmarked"])
def same_answer(request: pytest.FixtureRequest) -> Iterator[tuple[str, SameAnswer]]:
    app = SameAnswer(request.param)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.socket.getsockname()[1]}/charges", app
    server.shutdown()
    server.server_close()


def test_the_same_answer_every_time_is_never_passed_as_a_replay(
    same_answer: tuple[str, SameAnswer],
) -> None:
    # As a user runs it: `idemkey probe URL -d BODY`, in a shell, against a real server.
    url, app = same_answer
    result = subprocess.run(
        [sys.executable, "-m", "idemkey", "probe", url, "-d", CHARGE],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "IDEMKEY_REDIS_URL"},
        check=False,
    )
    run = Run(result.returncode, result.stdout, result.stderr)
    verdicts = _verdicts(run)
    # Check 2 and check 5 saw byte-equal answers and no Idempotent-Replayed header: a replay
    # and a second execution look the same, so neither may pass.
    assert (verdicts[2], verdicts[5]) == ("INCONCLUSIVE", "INCONCLUSIVE"), run.out
    assert "cannot tell a replay from a second execution" in _line(run, 2)
    assert "cannot tell one execution from 5" in _line(run, 5)
    assert "what would tell: a replay header" in run.out
    assert "a body that differs per execution" in run.out
    last = run.out.splitlines()[-1]
    if not app.idempotent:  # it ran every time, and took the edited retry (check 3)
        assert app.runs == 9
        assert verdicts[3] == "FAIL"
        assert run.code == 1, run.out + run.err
        assert last.startswith("verdict: FAIL: checks [3] FAILED (inconclusive: [2, 5])"), last
    else:  # nothing failed, and nothing can be vouched for: exit status 4
        assert app.runs == 2
        assert (verdicts[3], verdicts[4]) == ("PASS", "PASS"), run.out
        assert run.code == 4, run.out + run.err
        assert last.startswith("verdict: INCONCLUSIVE: checks [2, 5] could not tell"), last


def test_an_inconclusive_probe_in_json(idemkey: CliRunner) -> None:
    app = SameAnswer(idempotent=True)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.socket.getsockname()[1]}/charges"
        run = idemkey("probe", url, "-d", CHARGE, "--json")
    finally:
        server.shutdown()
        server.server_close()
    report = json.loads(run.out)
    assert (run.code, report["verdict"], report["exit_code"]) == (4, "INCONCLUSIVE", 4)
    assert report["worst"] == "INCONCLUSIVE"
    checks = {c["check"]: c for c in report["checks"]}
    assert [checks[n]["verdict"] for n in range(1, 7)] == [
        "PASS", "INCONCLUSIVE", "PASS", "PASS", "INCONCLUSIVE", "SKIP"
    ]  # fmt: skip
    assert "a replay header" in checks[2]["details"][0]


# ---- arguments and reachability -----------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("probe",),
        ("probe", "ftp://example.com/x", "-d", CHARGE),
        ("probe", "http:///charges", "-d", CHARGE),
        ("probe", "http://127.0.0.1:99999/x", "-d", CHARGE),
        ("probe", "http://127.0.0.1:1/x", "-d", "plain text"),  # no --edit derivable
        ("probe", "http://127.0.0.1:1/x", "-d", CHARGE, "--edit", CHARGE),
        ("probe", "http://127.0.0.1:1/x", "-d", CHARGE, "--data-file", "f"),
        ("probe", "http://127.0.0.1:1/x", "--data-file", "/nonexistent/body.json"),
        ("probe", "http://127.0.0.1:1/x", "-d", CHARGE, "-H", "no colon"),
        ("probe", "http://127.0.0.1:1/x", "-d", CHARGE, "-H", "Idempotency-Key: mine"),
        ("probe", "http://127.0.0.1:1/x", "-d", CHARGE, "-H", "Content-Length: 3"),
        ("probe", "http://127.0.0.1:1/x", "-d", CHARGE, "-H", "Authorization: Bearer \u20ac"),
        ("probe", "http://127.0.0.1:1/a b", "-d", CHARGE),
        ("probe", "http://127.0.0.1:1/caf\u00e9", "-d", CHARGE),
        ("probe", "http://127.0.0.1:1/x", "-d", CHARGE, "--timeout", "nan"),
        (
            "probe",
            "http://127.0.0.1:1/x",
            "-d",
            CHARGE,
            "--other-tenant-header",
            "Idempotency-Key: k",
        ),
        ("probe", "http://127.0.0.1:1/x", "-d", CHARGE, "--timeout", "0"),
        ("probe", "http://127.0.0.1:1/x", "-d", CHARGE, "--timeout", "soon"),
        ("probe", "http://127.0.0.1:1/x", "-d", CHARGE, "--concurrency", "1"),
        ("probe", "http://127.0.0.1:1/x", "-d", CHARGE, "--concurrency", "500"),
        ("probe", "http://127.0.0.1:1/x", "-d", CHARGE, "--method", "PO ST"),
        ("probe", "http://127.0.0.1:1/x", "-d", CHARGE, "--replay-header", "a b"),
        ("probe", "http://127.0.0.1:1/x", "-d", CHARGE, "--other-tenant-header", "x"),
    ],
)
def test_bad_arguments_are_one_line(idemkey: CliRunner, argv: tuple[str, ...]) -> None:
    run = idemkey(*argv)
    assert run.code == 2, run.out + run.err
    assert run.out == ""
    assert len(run.err.splitlines()) == 1, run.err
    assert "Traceback" not in run.err


def test_a_probe_without_a_body_says_none_was_given(idemkey: CliRunner) -> None:
    run = idemkey("probe", "http://127.0.0.1:1/x")
    assert run.code == 2
    assert run.err.startswith("idemkey probe: no request body was given: give -d BODY"), run.err
    assert "this body" not in run.err
    # A body given, but none the edit can be derived from: that message, as before.
    given = idemkey("probe", "http://127.0.0.1:1/x", "-d", "[1, 2]")
    assert "none can be derived from this body" in given.err


def test_an_unreachable_endpoint_is_one_line_exit_3(idemkey: CliRunner) -> None:
    url = f"http://127.0.0.1:{free_port()}/charges"
    started = time.monotonic()
    run = idemkey("probe", url, "-d", CHARGE)
    assert run.code == 3
    assert run.err.splitlines() == [
        f"idemkey probe: {url}: cannot connect to 127.0.0.1:{url.split(':')[2].split('/')[0]}: "
        "Connection refused"
    ]
    assert time.monotonic() - started < 10
    unknown = idemkey("probe", "http://no-such-host.invalid/x", "-d", CHARGE, "--json")
    assert unknown.code == 3
    assert len(unknown.err.splitlines()) == 1
    assert unknown.out == ""


def test_python_m_idemkey_probe_unreachable_has_no_traceback() -> None:
    env = {k: v for k, v in os.environ.items() if k != "IDEMKEY_REDIS_URL"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "idemkey",
            "probe",
            f"http://127.0.0.1:{free_port()}/",
            "-d",
            CHARGE,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert result.returncode == 3
    assert len(result.stderr.splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_help_states_the_bound_and_the_warning(idemkey: CliRunner) -> None:
    run = idemkey("probe", "--help")
    assert run.code == 0
    text = " ".join(run.out.split())
    assert "never sends more than 8 + N requests (13 with the default N=5)" in text
    assert "creates real records on the target" in text
    assert "exit status: 0" in text


def test_a_silent_endpoint_fails_check_1_after_the_timeout(idemkey: CliRunner) -> None:
    # The kernel completes the TCP handshake for a listening socket nobody accepts from: the
    # endpoint is reachable (not exit 3) and never answers.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/charges"
        started = time.monotonic()
        run = idemkey("probe", url, "-d", CHARGE, "--timeout", "0.5")
    assert run.code == 1, run.out + run.err
    assert "FAIL  1  first request         no answer within 0.5 s" in run.out
    assert _verdicts(run) == {1: "FAIL", **dict.fromkeys(range(2, 7), "SKIP")}
    assert time.monotonic() - started < 10


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1, and its key."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    options = [
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=127.0.0.1",
    ]
    files = ["-keyout", str(key), "-out", str(cert)]
    subprocess.run(
        [openssl, *options, "-addext", "subjectAltName=IP:127.0.0.1", *files],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return str(cert), str(key)


def test_https_verifies_the_certificate(
    idemkey: CliRunner, tls_files: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = make_server(
        "127.0.0.1", 0, BrokenPayments("no-fingerprint"), threaded=True, ssl_context=tls_files
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{server.socket.getsockname()[1]}/charges"
    try:
        untrusted = idemkey("probe", url, "-d", CHARGE)
        assert untrusted.code == 3
        assert "CERTIFICATE_VERIFY_FAILED" in untrusted.err
        assert len(untrusted.err.splitlines()) == 1
        monkeypatch.setenv("SSL_CERT_FILE", tls_files[0])  # trust it, as a staging CA would be
        trusted = idemkey("probe", url, "-d", CHARGE)
    finally:
        server.shutdown()
        server.server_close()
    assert trusted.code == 1, trusted.out + trusted.err
    assert "an edited retry was replayed" in _line(trusted, 3)


def test_a_body_that_is_not_utf8_is_sent_as_the_bytes_given(tmp_path: Path) -> None:
    """``-d`` and ``--edit`` with a byte that is not UTF-8 (latin-1 form data): Python hands
    argv over with the byte as a lone surrogate; the probe sends the byte itself, as ``curl -d``
    does and as ``--data-file`` would, rather than failing with an internal error (exit 70)."""
    seen: list[bytes] = []

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        seen.append(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b'{"id": "ch_1"}']

    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.socket.getsockname()[1]}/charges"
        env = {k: v for k, v in os.environ.items() if k != "IDEMKEY_REDIS_URL"}
        result = subprocess.run(
            [sys.executable, "-m", "idemkey", "probe", url, "-d", b"amount=10&name=Ren\xe9e",
             "--edit", b"amount=11&name=Ren\xe9e"],
            capture_output=True, timeout=60, cwd=ROOT, env=env, check=False,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 1, result.stderr  # this endpoint runs every retry: check 2 fails
    assert b"Traceback" not in result.stderr
    assert set(seen) == {b"amount=10&name=Ren\xe9e", b"amount=11&name=Ren\xe9e"}
