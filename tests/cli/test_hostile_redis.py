"""The commands against a server on the Redis URL that is not quite Redis: a raw socket speaking
RESP, answering what no Redis sends (digits that ``int()`` refuses, escape sequences in INFO
and CONFIG values, a SHA1 that is not the script's). The commands must end with a verdict or a
one-line Redis error (exit 3), never an internal error (exit 70), and print nothing the
terminal would act on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
from collections.abc import Callable, Iterator
from typing import BinaryIO

import pytest

from idemkey._core import record_for
from idemkey.store import SCRIPTS
from idemkey.store import diagnostics as dx
from tests.cli.conftest import CliRunner
from tests.client._loopback import LoopbackServer

#: Set the window title, clear the screen, turn the text red, return the cursor, and reverse
#: the rest of the line (a bidirectional override).
ESC = "\x1b]0;PWNED\x07\x1b[2J\x1b[31mRED\r\u202eevil"
SUPERSCRIPT_TWO = "\u00b2"  # str.isdigit() passes it; int() refuses it
#: What forget.lua answers for a record that does not exist.
NO_RECORD = b"*2\r\n:0\r\n$0\r\n\r\n"

Replies = dict[bytes, Callable[[list[bytes]], bytes]]


def bulk(value: str | bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return b"$%d\r\n%s\r\n" % (len(data), data)


def array(*values: str | bytes) -> bytes:
    return b"*%d\r\n" % len(values) + b"".join(bulk(v) for v in values)


def info(version: str = "7.0.15", role: str = "master") -> bytes:
    lines = [f"redis_version:{version}", "redis_mode:standalone", f"role:{role}",
             "cluster_enabled:0"]  # fmt: skip
    return bulk("\r\n".join(lines) + "\r\n")


def config(values: dict[str, str]) -> Callable[[list[bytes]], bytes]:
    return lambda args: array(args[2], values[args[2].decode()])


def real_sha(args: list[bytes]) -> bytes:
    return bulk(hashlib.sha1(args[2]).hexdigest())


SANE: dict[str, str] = {
    "maxmemory-policy": "noeviction",
    "maxmemory": "0",
    "save": "3600 1",
    "appendonly": "no",
}


class FakeRedis(LoopbackServer):
    """A RESP2 server on a free port answering each command from ``replies`` (by its upper-cased
    name), ``-ERR unknown command`` otherwise (redis-py's CLIENT SETINFO ignores it)."""

    def __init__(self, replies: Replies) -> None:
        self.replies = {b"PING": lambda args: b"+PONG\r\n", **replies}
        super().__init__("fake-redis")
        self.url = f"redis://127.0.0.1:{self._listener.getsockname()[1]}/0?protocol=2"

    def _serve(self, connection: socket.socket) -> None:
        connection.settimeout(None)  # a client may sit idle; close() shuts the socket down
        reader = connection.makefile("rb")
        with connection, reader, contextlib.suppress(OSError):  # OSError: shut down by close()
            while (args := self._command(reader)) is not None:
                reply = self.replies.get(args[0].upper())
                connection.sendall(reply(args) if reply else b"-ERR unknown command\r\n")

    @staticmethod
    def _command(reader: BinaryIO) -> list[bytes] | None:
        line = reader.readline()
        if not line.startswith(b"*"):
            return None  # the client hung up
        args = []
        for _ in range(int(line[1:])):
            length = int(reader.readline()[1:])
            args.append(reader.read(length + 2)[:length])
        return args


@pytest.fixture
def fake_redis() -> Iterator[Callable[[Replies], FakeRedis]]:
    servers: list[FakeRedis] = []

    def start(replies: Replies) -> FakeRedis:
        servers.append(FakeRedis(replies))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def doctor_replies(**overrides: Callable[[list[bytes]], bytes]) -> Replies:
    """A server doctor finds fit: a master, noeviction, RDB, the scripts load and run."""
    replies: Replies = {
        b"INFO": lambda args: info(),
        b"CONFIG": config(SANE),
        b"SCRIPT": real_sha,
        b"EVALSHA": lambda args: NO_RECORD,
    }
    replies.update({name.upper().encode(): reply for name, reply in overrides.items()})
    return replies


def _printable(text: str) -> bool:
    return all(c.isprintable() or c == "\n" for c in text)


# ---- digits that int() refuses --------------------------------------------------------------


@pytest.mark.parametrize("version", [f"7.2.{SUPERSCRIPT_TWO}", f"{SUPERSCRIPT_TWO}.0", "7\u0662"])
def test_a_version_with_digits_int_refuses_is_a_check(version: str) -> None:
    """A Check, never a ValueError (store.check() and doctor read the version with it): only
    ASCII digits count."""
    check = dx.check_version({"redis_version": version})
    assert check.verdict in ("OK", "WARN")
    assert version in check.detail


def test_doctor_on_a_superscript_version_is_no_internal_error(
    idemkey: CliRunner, fake_redis: Callable[[Replies], FakeRedis]
) -> None:
    server = fake_redis(doctor_replies(info=lambda args: info(f"7.2.{SUPERSCRIPT_TWO}")))
    run = idemkey("doctor", "--redis-url", server.url, "--pings", "1")
    assert run.code == 0, run.err
    assert f"redis 7.2.{SUPERSCRIPT_TWO}" in run.out


def test_a_time_reply_int_refuses_is_a_redis_error(
    idemkey: CliRunner, fake_redis: Callable[[Replies], FakeRedis]
) -> None:
    """redis-py's own TIME callback int()s the reply and raises ValueError: a Redis answer
    idemkey cannot read (exit 3, one line), not a bug of idemkey's (70)."""
    server = fake_redis(
        {
            b"EXISTS": lambda args: b":1\r\n",
            b"HGETALL": lambda args: b"*0\r\n",
            b"PTTL": lambda args: b":-2\r\n",
            b"HGET": lambda args: b"$-1\r\n",
            b"TIME": lambda args: array(SUPERSCRIPT_TWO, "0"),
        }
    )
    run = idemkey("inspect", "--digest", "a" * 32, "--redis-url", server.url)
    assert run.code == 3, run.err
    assert len(run.err.splitlines()) == 1
    assert run.err.startswith(f"idemkey inspect: {server.url}: ")
    assert "ValueError" in run.err
    assert _printable(run.err)
    run = idemkey("inspect", "--digest", "a" * 32, "--redis-url", server.url, "--json")
    assert (run.code, json.loads(run.err)["exit_code"]) == (3, 3)


def test_a_value_error_of_idemkeys_own_is_still_a_bug(
    idemkey: CliRunner, fake_redis: Callable[[Replies], FakeRedis], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a ValueError raised reading a reply is Redis's: one of idemkey's code stays 70."""

    def broken(*args: object) -> dx.Check:
        return dx.Check("mode", "OK", str(int("not a number")))

    monkeypatch.setattr(dx, "check_mode", broken)
    run = idemkey("doctor", "--redis-url", fake_redis(doctor_replies()).url, "--pings", "1")
    assert run.code == 70, run.err
    assert "internal error: ValueError" in run.err


# ---- what the server reports, printed ------------------------------------------------------


def test_doctor_prints_what_the_server_reports_escaped(
    idemkey: CliRunner, fake_redis: Callable[[Replies], FakeRedis]
) -> None:
    settings = {**SANE, "save": f"3600 1 {ESC}", "maxmemory-policy": f"allkeys-lru{ESC}"}
    server = fake_redis(
        doctor_replies(
            info=lambda args: info(f"7.2.0{ESC}", f"master{ESC}"), config=config(settings)
        )
    )
    run = idemkey("doctor", "--redis-url", server.url, "--pings", "1")
    assert run.code in (0, 1), run.err
    assert _printable(run.out), run.out
    assert "\\x1b]0;PWNED\\x07\\x1b[2J" in run.out  # shown, as Python escapes
    assert "\\u202eevil" in run.out
    run = idemkey("doctor", "--redis-url", server.url, "--pings", "1", "--json")
    checks = {c["name"]: c for c in json.loads(run.out)["checks"]}
    # The JSON keeps the value as read (json.dumps escapes it; INFO's parser ends it at \r).
    assert checks["role"]["detail"].startswith("master\x1b]0;PWNED\x07")


# ---- scripts --------------------------------------------------------------------------------


def test_doctor_fails_a_sha1_that_is_not_the_scripts(
    idemkey: CliRunner, fake_redis: Callable[[Replies], FakeRedis]
) -> None:
    """SCRIPT LOAD answers the SHA1 of the text it loaded: any other answer is not a server
    that runs idemkey's scripts."""
    server = fake_redis(doctor_replies(script=lambda args: bulk("0" * 40)))
    run = idemkey("doctor", "--redis-url", server.url, "--pings", "1")
    assert run.code == 1, run.out
    line = next(line for line in run.out.splitlines() if line[6:].startswith("scripts"))
    assert line.startswith("FAIL ")
    assert "claim" in line


def test_doctor_fails_scripts_that_load_but_cannot_run(
    idemkey: CliRunner, fake_redis: Callable[[Replies], FakeRedis]
) -> None:
    refused = b"-NOPERM this user has no permissions to run the 'evalsha' command\r\n"
    server = fake_redis(doctor_replies(evalsha=lambda args: refused))
    run = idemkey("doctor", "--redis-url", server.url, "--pings", "1")
    assert run.code == 1, run.out
    line = next(line for line in run.out.splitlines() if line[6:].startswith("scripts"))
    assert line.startswith("FAIL ")
    assert "NoPermissionError" in line
    assert "evalsha" in line


def test_doctor_runs_forget_on_a_record_that_cannot_exist(
    idemkey: CliRunner, fake_redis: Callable[[Replies], FakeRedis]
) -> None:
    """The script run is forget.lua, force off, on a name under the prefix no record has."""
    seen: list[list[bytes]] = []

    def evalsha(args: list[bytes]) -> bytes:
        seen.append(args)
        return NO_RECORD

    server = fake_redis(doctor_replies(evalsha=evalsha))
    run = idemkey("--prefix", "shop", "doctor", "--redis-url", server.url, "--pings", "1")
    assert run.code == 0, run.out + run.err
    assert len(seen) == 1
    _, sha, numkeys, key, force = seen[0]
    assert sha.decode() == hashlib.sha1(SCRIPTS["forget"].encode()).hexdigest()
    assert (numkeys, force) == (b"1", b"0")
    assert key.startswith(b"shop:{doctor-")
    weird = fake_redis(doctor_replies(evalsha=lambda args: b":1\r\n"))
    run = idemkey("doctor", "--redis-url", weird.url, "--pings", "1")
    assert run.code == 1, run.out


# ---- counts and TTLs that are no integer: stats and list -------------------------------------

#: A completed record under the default prefix (only "fp" and "resp": no state, no fence).
RECORD = record_for("idemkey", "acct_1", "POST", "/charges", "k1").record_key.encode()


def record_replies(**overrides: Callable[[list[bytes]], bytes]) -> Replies:
    """A server holding RECORD alone, answering what stats and list send about it."""

    def hmget(args: list[bytes]) -> bytes:
        values = [b"f" * 16 if field == b"fp" else None for field in args[2:]]
        items = (b"$-1\r\n" if value is None else bulk(value) for value in values)
        return b"*%d\r\n" % len(values) + b"".join(items)

    replies: Replies = {
        b"DBSIZE": lambda args: b":1\r\n",
        b"SCAN": lambda args: b"*2\r\n" + bulk("0") + b"*1\r\n" + bulk(RECORD),
        b"HMGET": hmget,
        b"PTTL": lambda args: b":5000\r\n",
        b"TIME": lambda args: array("1700000000", "0"),
        b"MEMORY": lambda args: b":100\r\n",
    }
    replies.update({name.upper().encode(): reply for name, reply in overrides.items()})
    return replies


@pytest.mark.parametrize("command", ["stats", "list"])
def test_a_key_count_int_refuses_is_a_redis_error(
    idemkey: CliRunner, fake_redis: Callable[[Replies], FakeRedis], command: str
) -> None:
    """DBSIZE answering "²" (no Redis does): one line, exit 3, never an internal error."""
    server = fake_redis(record_replies(dbsize=lambda args: bulk(SUPERSCRIPT_TWO)))
    run = idemkey(command, "--redis-url", server.url)
    assert run.code == 3, run.err
    assert len(run.err.splitlines()) == 1
    assert run.err.startswith(f"idemkey {command}: {server.url}: ")
    assert "DBSIZE" in run.err
    assert _printable(run.err)


def test_stats_counts_a_record_whose_ttl_int_refuses_as_without_ttl(
    idemkey: CliRunner, fake_redis: Callable[[Replies], FakeRedis]
) -> None:
    server = fake_redis(record_replies(pttl=lambda args: bulk(SUPERSCRIPT_TWO)))
    run = idemkey("stats", "--redis-url", server.url, "--json")
    assert run.code == 0, run.err
    stats = json.loads(run.out)
    assert (stats["records"], stats["states"]["complete"]) == (1, 1)
    assert stats["ttl"]["no TTL"] == 1


def test_list_shows_a_record_whose_ttl_int_refuses_without_ttl(
    idemkey: CliRunner, fake_redis: Callable[[Replies], FakeRedis]
) -> None:
    server = fake_redis(record_replies(pttl=lambda args: bulk(SUPERSCRIPT_TWO)))
    run = idemkey("list", "--redis-url", server.url, "--json")
    assert run.code == 0, run.err
    listed = json.loads(run.out)
    assert [(r["key"], r["state"], r["ttl_left"]) for r in listed["records"]] == [
        (RECORD.decode(), "complete", None)
    ]


@pytest.mark.parametrize("command", ["stats", "list"])
def test_a_record_whose_fields_come_back_as_no_list_is_passed_over(
    idemkey: CliRunner, fake_redis: Callable[[Replies], FakeRedis], command: str
) -> None:
    """HMGET answering a string (no Redis does) is a stranger's key, never an internal error."""
    server = fake_redis(record_replies(hmget=lambda args: bulk("x")))
    run = idemkey(command, "--redis-url", server.url, "--json")
    assert run.code == 0, run.err
    found = json.loads(run.out)
    if command == "stats":
        assert (found["records"], found["states"]["other"]) == (1, 1)
    else:
        assert found["records"] == []


#: An error reply that would set the terminal's title, clear its screen and reverse its text.
HOSTILE_ERROR = "-ERR \x1b]0;PWNED\x07\x1b[2J\x1b[31mRED\u202eevil\r\n".encode()


@pytest.mark.parametrize("command", ["stats", "list"])
@pytest.mark.parametrize("failing", ["dbsize", "scan"])
def test_a_redis_error_reply_is_printed_escaped(
    idemkey: CliRunner, fake_redis: Callable[[Replies], FakeRedis], command: str, failing: str
) -> None:
    """The server's error text reaches the operator's terminal escaped, by every exit path
    (a RedisError, or a StoreError that quotes one): exit 3, one line."""
    server = fake_redis(record_replies(**{failing: lambda args: HOSTILE_ERROR}))
    run = idemkey(command, "--redis-url", server.url)
    assert run.code == 3, run.err
    assert len(run.err.splitlines()) == 1
    assert _printable(run.err)
    assert "\\x1b]0;PWNED\\x07\\x1b[2J" in run.err  # shown escaped, not dropped


def test_list_json_cut_off_by_a_redis_error_mid_scan_is_a_valid_incomplete_document(
    idemkey: CliRunner, fake_redis: Callable[[Replies], FakeRedis]
) -> None:
    """The first SCAN page is listed, the next SCAN fails: stdout stays one JSON document (a
    script piping it into jq reads it), marked incomplete; the error is the usual JSON object
    on stderr, exit 3. Before: stdout ended inside the records array."""

    def scan(args: list[bytes]) -> bytes:
        if args[1] != b"0":
            return b"-ERR the server went away mid-scan\r\n"
        return b"*2\r\n" + bulk("7") + b"*1\r\n" + bulk(RECORD)

    server = fake_redis(record_replies(scan=scan))
    run = idemkey("list", "--redis-url", server.url, "--json")
    assert run.code == 3, run.err
    listed = json.loads(run.out)
    assert [r["key"] for r in listed["records"]] == [RECORD.decode()]
    assert (listed["count"], listed["complete"]) == (1, False)
    error = json.loads(run.err)
    assert (error["command"], error["exit_code"]) == ("list", 3)
    assert "mid-scan" in error["error"]
    # A whole listing says so too: `jq -e .complete` tells the two apart.
    run = idemkey("list", "--redis-url", fake_redis(record_replies()).url, "--json")
    assert run.code == 0, run.err
    assert json.loads(run.out)["complete"] is True
