"""The commands on a Redis URL whose password holds an unencoded '/', '?' or '#' (base64 secrets
hold '/'): the URL's host ends early, so the password was no password to redact, and each
command printed the URL as given, with the error of a port or database that was part of it
(``bad --redis-url redis://:Zm9v/YmFy@...: Port could not be cast to integer value as 'Zm9v'``),
or, where redis-py took the URL (a '#'), connected without the password and printed it beside
what went wrong. Such a URL is a bad argument (exit 2), printed without its user information.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from idemkey.store._url import redacted
from tests._servers import RedisServer
from tests.cli.conftest import CliRunner

ROOT = Path(__file__).resolve().parents[2]
#: How long a command may take to refuse the URL: an interpreter start and no round trip.
REFUSED_WITHIN = 30.0


@pytest.fixture
def address(redis_url: str) -> str:
    """``host:port`` of the session's Redis: a URL whose host ended early at a '#' connected
    to it (as the port before the '#', on localhost)."""
    parts = urlsplit(redis_url)
    return f"{parts.hostname}:{parts.port}"


def _unencoded(address: str) -> dict[str, tuple[str, list[str]]]:
    """(URL, the pieces of its password that may not be printed) by case."""
    port = address.rpartition(":")[2]
    return {
        "slash": (f"redis://:Zm9v/YmFy+c2VjcmV0@{address}/0", ["Zm9v", "YmFy", "c2VjcmV0"]),
        "hash": (f"redis://:Zm9v#YmFyc2VjcmV0@{address}/0", ["Zm9v", "YmFyc2VjcmV0"]),
        "question": (f"redis://default:Zm9v?YmFyc2Vj@{address}/0", ["Zm9v", "YmFyc2Vj"]),
        "digits-then-slash": (f"redis://:12345/c2VjcmV0@{address}/0", ["12345", "c2VjcmV0"]),
        "port-then-hash": (f"redis://:{port}#s3cret@{address}/0", ["s3cret"]),
        "at-then-slash": (f"redis://u:p@x9/s3cret@{address}/0", ["x9", "s3cret"]),
    }


CASES = ["slash", "hash", "question", "digits-then-slash", "port-then-hash", "at-then-slash"]
COMMANDS = {
    "doctor": ("doctor", "--pings", "1"),
    "stats": ("stats",),
    "list": ("list",),
    "inspect": ("inspect", "k", "--guard"),
}


def _refused_plainly(text: str, address: str, secrets: list[str]) -> None:
    assert f"bad --redis-url redis://***@{address}/0: " in text, text
    assert "percent-encoded" in text, text
    for secret in secrets:
        assert secret not in text, text


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", CASES)
def test_an_unencoded_password_is_a_bad_argument_and_never_printed(
    idemkey: CliRunner, address: str, case: str, command: str
) -> None:
    url, secrets = _unencoded(address)[case]
    run = idemkey(*COMMANDS[command], "--redis-url", url)
    for secret in secrets:
        assert secret not in run.out + run.err, (run.out, run.err)
    assert run.code == 2, (run.out, run.err)
    assert run.err.startswith(f"idemkey {command}: ")
    assert len(run.err.splitlines()) == 1
    _refused_plainly(run.err, address, secrets)


@pytest.mark.parametrize("case", CASES)
def test_an_unencoded_password_from_the_environment_in_json(
    idemkey: CliRunner, address: str, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, secrets = _unencoded(address)[case]
    monkeypatch.setenv("IDEMKEY_REDIS_URL", url)
    run = idemkey("stats", "--json")
    for secret in secrets:
        assert secret not in run.out + run.err, (run.out, run.err)
    assert run.code == 2
    answer = json.loads(run.out or run.err)
    assert answer["exit_code"] == 2
    _refused_plainly(answer["error"], address, secrets)


@pytest.mark.parametrize("command", [("demo",), ("serve", "--port", "0")], ids=["demo", "serve"])
def test_the_demo_refuses_an_unencoded_password_and_never_prints_it(
    address: str, prefix: str, command: tuple[str, ...]
) -> None:
    """Run as a user runs it, in a subprocess: redis-py took the '#' URL, so the demo played
    its story, and serve served (for ever), printing the URL with its password in it."""
    url, secrets = _unencoded(address)["port-then-hash"]
    env = {k: v for k, v in os.environ.items() if k != "IDEMKEY_REDIS_URL"}
    try:
        run = subprocess.run(
            [sys.executable, "-m", "idemkey", "--prefix", prefix, *command, "--redis-url", url],
            capture_output=True, text=True, cwd=ROOT, env=env, timeout=REFUSED_WITHIN,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{command[0]} did not refuse within {REFUSED_WITHIN:g} s: {exc.stdout!r}")
    for secret in secrets:
        assert secret not in run.stdout + run.stderr, (run.stdout, run.stderr)
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert run.stderr.startswith(f"idemkey {command[0]}: ConfigurationError: --redis-url cannot")
    assert "percent-encoded" in run.stderr
    assert len(run.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:Zm9v/YmFy+c2VjcmV0@localhost:6399/0", "redis://***@localhost:6399/0"),
        ("redis://:Zm9v#YmFyc2VjcmV0@localhost:6399/0", "redis://***@localhost:6399/0"),
        ("redis://default:Zm9v?YmFy@localhost:6399/0", "redis://***@localhost:6399/0"),
        ("REDIS://:12345/c2VjcmV0@localhost:6399/0", "REDIS://***@localhost:6399/0"),
        ("redis://:a/b@c@localhost:6399/0?password=d", "redis://***@localhost:6399/0?password=***"),
        ("redis://u:p@x9/s3cret@localhost:6399/0", "redis://***@localhost:6399/0"),
        ("redis://u:p@localhost:6399/0?password=pa@ss", "redis://***"),
        # The '@' may have been a query password's: nothing after '://' is shown.
        ("redis://localhost:6399/0?password=pa@ss", "redis://***"),
        ("user:pa/ss@localhost:6399", "***@localhost:6399"),
        # As before: the password of a well-formed URL, or of its query.
        ("redis://u:s3cret@localhost:6399/0", "redis://u:***@localhost:6399/0"),
        (
            "redis://localhost:6399/0?password=s3cret&db=1",
            "redis://localhost:6399/0?password=***&db=1",
        ),
        ("redis://localhost:6399/0", "redis://localhost:6399/0"),
        # redis-py reads a query's keys percent-decoded (parse_qs): each is its password.
        ("redis://localhost:6399/0?pa%73sword=s3cret", "redis://localhost:6399/0?pa%73sword=***"),
        (
            "redis://localhost:6399/0?db=1&%70assword=s3",
            "redis://localhost:6399/0?db=1&%70assword=***",
        ),
        ("redis://localhost:6399/0?pa%73sword=pa@ss", "redis://***"),
        ("localhost:6399/0?pa%73sword=pa@ss", "***"),
        # redis-py's other secret (the private key's passphrase), and keys it refuses, which
        # its refusal printed: any case or spelling of a key that names a secret.
        (
            "rediss://h:1/0?ssl_password=pw&ssl_cert_reqs=none",
            "rediss://h:1/0?ssl_password=***&ssl_cert_reqs=none",
        ),
        ("redis://h:1/0?PASSWORD=pw", "redis://h:1/0?PASSWORD=***"),
        (
            "redis://h:1/0?%20password=pw&password%00=pw",
            "redis://h:1/0?%20password=***&password%00=***",
        ),
        ("redis://h:1/0?token=pw&db=1", "redis://h:1/0?token=***&db=1"),
        ("redis://h:1/0?Secret=p@w", "redis://***"),
    ],
)
def test_redacted_hides_the_user_information_up_to_the_last_at_sign(url: str, shown: str) -> None:
    assert redacted(url) == shown


def test_a_query_password_with_an_escaped_key_is_never_printed(idemkey: CliRunner) -> None:
    """redis-py decodes ``pa%73sword`` to ``password``: the doctor printed its value."""
    run = idemkey(
        "doctor", "--pings", "1", "--redis-url", "redis://127.0.0.1:1/0?pa%73sword=s3cret"
    )
    assert "s3cret" not in run.out + run.err, (run.out, run.err)
    assert "?pa%73sword=***" in run.out + run.err, (run.out, run.err)


@pytest.mark.parametrize("query", ["ssl_password=s3cret&ssl_cert_reqs=none", "PASSWORD=s3cret"])
def test_a_secret_query_value_is_never_printed(idemkey: CliRunner, query: str) -> None:
    """redis-py takes ``ssl_password`` (a private key's passphrase) from the query, and the
    refusal of a key it does not take (``PASSWORD``) quoted the URL: both were printed."""
    scheme = "rediss" if query.startswith("ssl") else "redis"
    run = idemkey("doctor", "--pings", "1", "--redis-url", f"{scheme}://127.0.0.1:1/0?{query}")
    assert "s3cret" not in run.out + run.err, (run.out, run.err)
    assert "=***" in run.out + run.err, (run.out, run.err)


# ---- the demo and serve print where their store is: never its password ----------------------


@pytest.fixture
def password_urls(redis_server_factory: Callable[..., RedisServer]) -> dict[str, str]:
    """URLs of a Redis that needs the password s3cret, with the password where redis-py reads
    it: the user information, or the query (its key percent-encoded or not)."""
    server = redis_server_factory()
    with server.client() as admin:
        admin.config_set("requirepass", "s3cret")
    address = f"{server.host}:{server.port}"
    return {
        "user information": f"redis://:s3cret@{address}/0",
        "query": f"redis://{address}/0?password=s3cret",
        "query, key escaped": f"redis://{address}/0?pa%73sword=s3cret",
    }


PASSWORD_PLACES = ["user information", "query", "query, key escaped"]


@pytest.mark.parametrize("place", PASSWORD_PLACES)
def test_the_demo_names_its_store_without_the_password(
    idemkey: CliRunner, password_urls: dict[str, str], prefix: str, place: str
) -> None:
    url = password_urls[place]
    run = idemkey("--prefix", prefix, "demo", "--json", "--redis-url", url)
    assert "s3cret" not in run.out + run.err, (run.out, run.err)
    assert run.code == 0, (run.out, run.err)
    assert json.loads(run.out)["store"] == redacted(url)
    assert "***" in redacted(url)


@pytest.mark.parametrize("place", PASSWORD_PLACES)
def test_serve_names_its_store_without_the_password(
    serve_lines: Callable[..., list[str]], password_urls: dict[str, str], prefix: str, place: str
) -> None:
    url = password_urls[place]
    lines = serve_lines("--prefix", prefix, "--redis-url", url)
    assert "s3cret" not in "\n".join(lines), lines
    assert f"(store: {redacted(url)});" in lines[0], lines
