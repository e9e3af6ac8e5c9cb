"""The demo apps and the commands that run them, at their edges: a body nested deeper than JSON
parses (a 400 bad_json, not a 500), the ``idemkey inspect`` line ``serve`` prints (it runs as
printed: the prefix, no redacted password), and a Redis that cannot run the scripts (the demo
says so up front, exit 3, instead of playing every step against 503s).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from idemkey import AsyncRedisStore
from idemkey.cli.demo_app import create_app, demo_policy, http_client, open_store
from idemkey.cli.demo_app.asgi_app import create_asgi_app
from tests._servers import RedisServer
from tests.cli.conftest import CliRunner

ROOT = Path(__file__).resolve().parents[2]
#: Past what json.loads parses: it raises RecursionError, not ValueError.
DEEP = b"[" * 100_000 + b"]" * 100_000
#: How long the demo may take to refuse a Redis that cannot run the scripts: an interpreter
#: start and a few round trips, where playing the story against it took about 50 s (and serve
#: served for ever).
REFUSED_WITHIN = 30.0


# ---- deeply nested JSON --------------------------------------------------------------------


def test_the_flask_demo_app_answers_deeply_nested_json_with_bad_json() -> None:
    store, _, close = open_store(None, "deep")
    try:
        client = create_app(store).test_client()
        headers = {"Idempotency-Key": "deep", "Content-Type": "application/json"}
        answer = client.post("/charges", data=DEEP, headers=headers)
        assert (answer.status_code, answer.get_json(force=True)["code"]) == (400, "bad_json")
    finally:
        close()


def test_the_asgi_demo_app_answers_deeply_nested_json_with_bad_json() -> None:
    async def post() -> list[dict[str, Any]]:
        client = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
        app = create_asgi_app(AsyncRedisStore(client, demo_policy("deep")))
        chunks = [{"type": "http.request", "body": DEEP, "more_body": False}]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return chunks.pop(0) if chunks else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http", "method": "POST", "path": "/charges", "raw_path": b"/charges",
            "query_string": b"", "http_version": "1.1", "scheme": "http", "root_path": "",
            "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
            "headers": [(b"idempotency-key", b"deep"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(DEEP)).encode())],
        }  # fmt: skip
        try:
            await app(scope, receive, send)  # type: ignore[arg-type]
        finally:
            await client.aclose()
        return sent

    sent = asyncio.run(post())
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert (start["status"], json.loads(body)["code"]) == (400, "bad_json")


# ---- the inspect line serve prints -----------------------------------------------------------


@pytest.fixture
def serve(
    serve_lines: Callable[..., list[str]],
) -> Callable[..., tuple[str, str]]:
    """``serve(*argv)``: ``python -m idemkey *argv serve --port 0``; returns its base URL and
    the ``idemkey inspect`` line it printed."""

    def start(*argv: str) -> tuple[str, str]:
        lines = serve_lines(*argv)
        return lines[0].split()[4], next(x.strip() for x in lines if "idemkey inspect" in x)

    return start


def _charge(base: str, line: str) -> None:
    key = shlex.split(line)[2]
    answer = http_client.Client(base).request(
        "POST", "/charges", {"amount": 1000, "currency": "eur"}, {"Idempotency-Key": key}
    )
    assert answer.status == 201


def test_the_inspect_line_names_the_prefix(
    idemkey: CliRunner, serve: Callable[..., tuple[str, str]], redis_url: str, prefix: str
) -> None:
    base, line = serve("--prefix", prefix, "--redis-url", redis_url)
    _charge(base, line)
    words = shlex.split(line)
    assert words[0] == "idemkey"
    run = idemkey(*words[1:])
    assert run.code == 0, (line, run.out, run.err)
    assert "complete" in run.out


def test_the_inspect_line_never_carries_a_redacted_password(
    idemkey: CliRunner,
    serve: Callable[..., tuple[str, str]],
    redis_server_factory: Callable[..., RedisServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The password is not printed, so the line cannot hold it: it reads $IDEMKEY_REDIS_URL
    (the inspect command does), and says so, rather than show ``:***@`` as if it ran."""
    server = redis_server_factory()
    with server.client() as admin:
        admin.config_set("requirepass", "s3cret")
    url = f"redis://:s3cret@{server.host}:{server.port}/0"
    base, line = serve("--redis-url", url)
    _charge(base, line)
    assert "***" not in line
    assert "s3cret" not in line
    monkeypatch.setenv("IDEMKEY_REDIS_URL", url)
    run = idemkey(*shlex.split(line)[1:])
    assert run.code == 0, (line, run.out, run.err)


# ---- a Redis that cannot run the scripts ---------------------------------------------------


def _refused(url: str, command: tuple[str, ...]) -> str:
    """Run ``python -m idemkey *command`` as a user does; a subprocess, so that a serve that
    does not refuse is stopped at the deadline rather than serving for ever."""
    env = {k: v for k, v in os.environ.items() if k != "IDEMKEY_REDIS_URL"}
    try:
        run = subprocess.run(
            [sys.executable, "-m", "idemkey", *command, "--redis-url", url],
            capture_output=True, text=True, cwd=ROOT, env=env, timeout=REFUSED_WITHIN,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{command[0]} did not refuse within {REFUSED_WITHIN:g} s: {exc.stdout!r}")
    assert run.returncode == 3, (run.stdout, run.stderr)
    assert len(run.stderr.splitlines()) == 1, run.stderr
    assert "cannot run idemkey's scripts" in run.stderr
    return run.stderr


@pytest.mark.parametrize("command", [("demo",), ("serve", "--port", "0")], ids=["demo", "serve"])
def test_the_demo_refuses_a_replica_before_the_story(
    redis_server_factory: Callable[..., RedisServer], command: tuple[str, ...]
) -> None:
    primary = redis_server_factory()
    replica = redis_server_factory(["--replicaof", primary.host, str(primary.port)])
    assert "ReadOnlyError" in _refused(replica.url, command)


def test_the_demo_refuses_a_redis_whose_acl_denies_evalsha(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory()
    with server.client() as admin:
        admin.execute_command(
            "ACL", "SETUSER", "default", "on", "nopass", "~*", "&*", "+@all", "-evalsha", "-eval"
        )
    assert "NoPermissionError" in _refused(server.url, ("demo",))
