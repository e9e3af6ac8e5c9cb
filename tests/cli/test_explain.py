"""The operator's commands explain themselves (issue 22 item 4), through ``main([...])`` or
``python -m idemkey`` against the session's real redis-server.

* ``inspect KEY --route R`` finds a record the Flask extension stored under its default scope,
  and says every name it tried when none holds the key;
* ``stats`` under an empty prefix names the prefixes it sees;
* ``doctor`` against an HTTP server says it is not Redis, in words;
* ``--json`` errors are JSON on every command; ``--version``; demo and serve help agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis
from flask import Flask

from idemkey import RedisStore
from idemkey.adapters.flask import Idemkey
from idemkey.cli import COMMANDS
from tests.cli.conftest import CliRunner, http_record

ROOT = Path(__file__).resolve().parents[2]


def _at(url: str, prefix: str) -> tuple[str, ...]:
    return ("--redis-url", url, "--prefix", prefix)


def _flask_app(redis_url: str, prefix: str) -> Flask:
    # The README's Flask quick start with the default scope (no IDEMKEY_SCOPE).
    idem = Idemkey()
    app = Flask(__name__)
    app.config["IDEMKEY_REDIS_URL"] = redis_url
    app.config["IDEMKEY_PREFIX"] = prefix

    @app.post("/charges")
    @idem.idempotent
    def create_charge() -> tuple[dict[str, str], int]:
        return {"id": "ch_1"}, 201

    idem.init_app(app)
    return app


@pytest.fixture
def flask_app(redis_url: str, prefix: str) -> Iterator[Flask]:
    app = _flask_app(redis_url, prefix)
    yield app
    app.extensions["idemkey"].store.client.close()


# ---- inspect ------------------------------------------------------------------------------


def test_inspect_finds_a_record_stored_under_the_default_scope(
    idemkey: CliRunner,
    flask_app: Flask,
    redis_url: str,
    prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = flask_app.test_client()
    with caplog.at_level("WARNING", logger="idemkey"):  # the once-per-process no-credential hint
        first = client.post("/charges", json={"amount": 1}, headers={"Idempotency-Key": "k-1"})
        signed = client.post(
            "/charges",
            json={"amount": 1},
            headers={"Idempotency-Key": "k-2", "Authorization": "Bearer sk_1"},
        )
    assert first.status_code == signed.status_code == 201

    run = idemkey("inspect", "k-1", "--route", "/charges", *_at(redis_url, prefix))
    assert run.code == 0, run.out + run.err
    assert run.out.startswith("found under scope <default scope, no credentials>, POST /charges\n")
    assert "state     complete" in run.out
    assert "status    201" in run.out

    # A request with a credential: its default scope is a digest of it, which -H recomputes.
    blind = idemkey("inspect", "k-2", "--route", "/charges", *_at(redis_url, prefix))
    assert blind.code == 1
    assert "no record for key 'k-2' under any of the 2 names tried:" in blind.out
    assert "<default scope, no credentials>, POST /charges" in blind.out
    assert "'' (empty), POST /charges" in blind.out
    assert "-H with the request's credential header" in blind.out
    found = idemkey(
        "inspect", "k-2", "--route", "/charges", "-H", "Authorization: Bearer sk_1", "--json",
        *_at(redis_url, prefix),
    )  # fmt: skip
    assert found.code == 0, found.err
    view = json.loads(found.out)  # scope and route given: one record named, its view
    assert (view["exists"], view["state"], view["status"]) == (True, "complete", 201)


def test_inspect_says_which_scopes_and_routes_hold_the_key(
    idemkey: CliRunner, store: RedisStore, redis_url: str, prefix: str
) -> None:
    http_record(store, "order-5", scope="acct_1", route="/charges")
    http_record(store, "order-5", scope="acct_2", route="/refunds")
    run = idemkey(
        "inspect", "order-5", "--scope", "acct_1", "--scope", "acct_2", "--route", "/charges",
        "--route", "/refunds", *_at(redis_url, prefix),
    )  # fmt: skip
    assert run.code == 0, run.err
    found = [line for line in run.out.splitlines() if line.startswith("found under")]
    assert found == [
        "found under scope 'acct_1', POST /charges",
        "found under scope 'acct_2', POST /refunds",
    ]
    assert "the key is held by 2 records" in run.out
    report = json.loads(idemkey("inspect", "order-5", "--scope", "acct_1", "--scope", "acct_2",
                                "--route", "/charges", "--route", "/refunds", "--json",
                                *_at(redis_url, prefix)).out)  # fmt: skip
    assert [(r["scope"], r["route"], r["state"]) for r in report["records"]] == [
        ("acct_1", "/charges", "complete"),
        ("acct_2", "/refunds", "complete"),
    ]
    assert len(report["tried"]) == 4
    assert report["hint"] is None
    # forget will not guess which of them is meant
    refused = idemkey("forget", "order-5", "--scope", "acct_1", "--scope", "acct_2",
                      "--route", "/charges", "--route", "/refunds", "--yes",
                      *_at(redis_url, prefix))  # fmt: skip
    assert refused.code == 1
    assert "held by 2 records" in refused.err
    assert refused.err.rstrip().endswith("nothing deleted")
    # nor will cancel, and both records are still there
    refused = idemkey("cancel", "order-5", "--scope", "acct_1", "--scope", "acct_2",
                      "--route", "/charges", "--route", "/refunds", "--yes",
                      *_at(redis_url, prefix))  # fmt: skip
    assert refused.code == 1
    assert "held by 2 records" in refused.err
    assert refused.err.rstrip().endswith("nothing cancelled")
    assert len(list(store.records())) == 2


def test_inspect_without_a_route_says_what_it_tried(
    idemkey: CliRunner, redis_url: str, prefix: str
) -> None:
    run = idemkey("inspect", "k", *_at(redis_url, prefix))
    assert run.code == 1
    assert run.err == ""
    assert "scope '' (empty), GUARD" in run.out  # a guard() record is all it can name
    assert "--route (the route template, or the path)" in run.out


# ---- stats --------------------------------------------------------------------------------


def test_stats_under_an_empty_prefix_names_the_prefixes_it_sees(
    idemkey: CliRunner, store: RedisStore, redis_url: str, prefix: str
) -> None:
    http_record(store, "order-1")
    http_record(store, "order-2", complete=False)  # one key too: the lease is a field
    run = idemkey("stats", "--redis-url", redis_url, "--prefix", prefix + "-typo")
    assert run.code == 0, run.err
    assert f'no records under prefix "{prefix}-typo"' in run.out
    assert f'"{prefix}" (2 keys)' in run.out
    assert "pass --prefix" in run.out
    report = json.loads(
        idemkey("stats", "--json", "--redis-url", redis_url, "--prefix", prefix + "-typo").out
    )
    assert report["records"] == 0
    assert report["other_prefixes"][prefix] == 2
    assert report["other_prefixes_keys_scanned"] > 0
    # With records under the prefix, no other prefix is looked for.
    assert "other_prefixes" not in json.loads(
        idemkey("stats", "--json", *_at(redis_url, prefix)).out
    )


def test_stats_scan_for_other_prefixes_is_bounded(
    store: RedisStore, real_client: redis.Redis, prefix: str
) -> None:
    from idemkey.cli.stats import other_prefixes

    real_client.mset({f"{prefix}-noise:{i}": b"x" for i in range(3000)})
    try:
        _, looked = other_prefixes([("node", real_client)], limit=1000)
        assert looked <= 1000
    finally:
        real_client.delete(*[f"{prefix}-noise:{i}" for i in range(3000)])


# ---- doctor -------------------------------------------------------------------------------


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(404)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{server.server_address[1]}/0"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_doctor_against_an_http_server_says_it_is_not_redis(http_server: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "IDEMKEY_REDIS_URL"}
    for extra in ([], ["--json"]):
        result = subprocess.run(
            [sys.executable, "-m", "idemkey", "doctor", "--redis-url", http_server, *extra],
            capture_output=True, text=True, timeout=60, cwd=ROOT, env=env, check=False,
        )  # fmt: skip
        assert result.returncode == 3
        assert result.stdout == ""
        assert "Traceback" not in result.stderr
        (line,) = result.stderr.splitlines()
        message = json.loads(line)["error"] if extra else line
        assert "this is not a Redis server: its answer is not the Redis protocol" in message
        assert "check the host and port" in message


# ---- --json errors, --version, help -------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("demo", "--redis-url", "ftp://x"),
        ("serve", "--port", "70000"),
        ("probe", "ftp://example.com/x", "-d", "{}"),
        ("inspect",),
        ("forget", "--digest", "xyz"),
        ("stats", "--sample", "-1", "--redis-url", "redis://127.0.0.1:1"),
        ("doctor",),  # no Redis named
        ("doctor", "--redis-url", "redis://127.0.0.1:1/0"),  # refused
        ("bench", "--redis-url"),  # no value (an unknown option is the suite's: bench --quick)
        ("no-such-command",),
    ],
)
def test_json_errors_are_json_on_every_command(idemkey: CliRunner, argv: tuple[str, ...]) -> None:
    run = idemkey(*argv, "--json")
    assert run.code in (2, 3), run.err
    assert run.out == ""
    (line,) = run.err.splitlines()
    error = json.loads(line)
    assert error["exit_code"] == run.code
    assert error["command"] == (argv[0] if argv[0] in COMMANDS else None)
    assert error["error"]
    assert not error["error"].startswith("idemkey")


def test_version(idemkey: CliRunner) -> None:
    run = idemkey("--version")
    assert run.code == 0
    assert run.out.startswith("idemkey ")
    assert run.out.endswith(" (the idemkey-redis distribution)\n")


@pytest.mark.parametrize("command", ["demo", "serve", "bench"])
def test_commands_that_never_read_the_env_url_do_not_offer_it(
    idemkey: CliRunner, command: str
) -> None:
    run = idemkey(command, "--help")
    assert run.code == 0
    text = " ".join(run.out.split())
    assert "default: $IDEMKEY_REDIS_URL" not in text  # they never read it
    assert "$IDEMKEY_REDIS_URL is not used" in text
    if command == "serve":
        assert "--port PORT port (default: 8000" in text
        assert "as for demo" not in text
