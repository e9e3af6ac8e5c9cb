"""Helpers for the command-line tests: run ``idemkey.cli.main`` and make records to look at."""

from __future__ import annotations

import os
import selectors
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from idemkey import Policy, RedisStore
from idemkey._codec import StoredResponse, encode_response
from idemkey._core import Record, record_for
from idemkey.cli import main
from tests._servers import AppServer


@dataclass
class Run:
    code: int
    out: str
    err: str


CliRunner = Callable[..., Run]


@pytest.fixture
def idemkey(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    """``idemkey(*argv)`` runs the command line in-process and returns code, stdout, stderr."""
    monkeypatch.delenv("IDEMKEY_REDIS_URL", raising=False)

    def run(*argv: str) -> Run:
        code = main(list(argv))
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


@pytest.fixture
def store(real_client: redis.Redis, prefix: str) -> Iterator[RedisStore]:
    """A store on the session server, writing under the test's prefix."""
    made = RedisStore(real_client, Policy(prefix=prefix))
    yield made
    made.close()


def http_record(
    store: RedisStore,
    key: str,
    *,
    scope: str = "acct_1",
    route: str = "/charges",
    status: int = 201,
    body: bytes = b'{"id":"ch_1","amount":1000}',
    complete: bool = True,
) -> Record:
    """A record as the HTTP adapters write it: claimed, and completed with a response."""
    record = record_for(store.policy.prefix, scope, "POST", route, key)
    claimed = store.claim(record, "fp-" + key, heartbeat=False)
    assert type(claimed).__name__ == "Claimed"
    if complete:
        headers = (("Content-Type", "application/json"), ("Location", "/charges/ch_1"))
        stored = encode_response(StoredResponse(status, headers, body))
        assert store.complete(record, claimed.owner, stored)  # type: ignore[union-attr]
    return record


# ---- the console: a real headless browser, and the console run as a user runs it ---------

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
#: What a DNS rebinding produces: a name of the attacker's that resolves to 127.0.0.1.
EVIL = "evil.example"


@pytest.fixture
def chromium() -> Iterator[Callable[..., Any]]:
    """``chromium(*flags)``: a headless Chromium (Debian's, through Selenium), quit after the
    test. Skips, saying why, where chromium, chromedriver or Selenium is missing."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("no chromium/chromedriver on PATH (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    drivers: list[Any] = []

    def start(*flags: str) -> Any:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
            options.add_argument(flag)
        for flag in flags:
            options.add_argument(flag)
        service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
        drivers.append(webdriver.Chrome(options=options, service=service))
        return drivers[-1]

    try:
        yield start
    finally:
        for driver in drivers:
            driver.quit()


@pytest.fixture
def browser(chromium: Callable[..., Any]) -> Any:
    return chromium()


@pytest.fixture
def rebinding_browser(chromium: Callable[..., Any]) -> Any:
    """A browser in which :data:`EVIL` resolves to 127.0.0.1, as after a DNS rebinding."""
    return chromium(f"--host-resolver-rules=MAP {EVIL} 127.0.0.1")


@pytest.fixture
def console(redis_url: str, prefix: str, tmp_path: Path) -> Iterator[Callable[..., AppServer]]:
    """``console(*options)``: ``python -m idemkey console`` on a free port, until the test
    ends."""
    servers: list[AppServer] = []

    def start(*extra: str) -> AppServer:
        def command(port: int) -> list[str]:
            return [sys.executable, "-m", "idemkey", "--redis-url", redis_url, "--prefix",
                    prefix, "console", "--port", str(port), "--refresh", "0.5", *extra]  # fmt: skip

        server = AppServer(
            command,
            log=tmp_path / f"console-{len(servers)}.log",
            cwd=ROOT,
            redis_url=redis_url,
            prefix=prefix,
            name="the console",
            health="/api/status",
        )
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.close()


@pytest.fixture
def serve_lines() -> Iterator[Callable[..., list[str]]]:
    """``serve_lines(*argv)``: ``python -m idemkey *argv serve --port 0``, without
    ``$IDEMKEY_REDIS_URL``; returns the lines it printed up to its ``idemkey inspect`` line
    and the blank line after it (where it serves, and its store, first), read with a deadline.
    Every server is stopped after the test."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*argv: str) -> list[str]:
        env = {k: v for k, v in os.environ.items() if k != "IDEMKEY_REDIS_URL"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "idemkey", *argv, "serve", "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
        )  # fmt: skip
        procs.append(proc)
        assert proc.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 30
        printed = b""
        # Raw reads: a buffered readline() may hold lines that select() no longer sees.
        while b"idemkey inspect" not in printed or not printed.endswith(b"\n\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(timeout=left):
                pytest.fail(f"idemkey serve printed no inspect line within 30 s: {printed!r}")
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                pytest.fail(f"idemkey serve exited: {printed!r}")
            printed += chunk
        return printed.decode().splitlines()

    try:
        yield start
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
