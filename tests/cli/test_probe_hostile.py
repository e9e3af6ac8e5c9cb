"""``idemkey probe`` against hostile servers: raw sockets answering what no server library would
send (JSON nested past what Python parses, digits that int() refuses, escape sequences in every
field a line shows, a body or a head that trickles in forever), and URLs holding a password.
The probe must end with a verdict or a one-line error, never an internal error (exit 70), print
nothing the terminal would act on, and keep ``--timeout`` as a deadline per request.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests._servers import free_port
from tests.cli.conftest import CliRunner, Run
from tests.client._loopback import LoopbackServer

ROOT = Path(__file__).resolve().parents[2]
CHARGE = '{"amount": 1000, "currency": "eur"}'
#: What a hostile server puts in a value: set the window title, clear the screen, turn the text
#: red, return the cursor, and reverse the rest of the line (a bidirectional override).
ESC = "\x1b]0;PWNED\x07\x1b[2J\x1b[31mRED\r\u202e"
SHOWN_ESC = "\\x1b]0;PWNED\\x07\\x1b[2J\\x1b[31mRED"  # as the probe must print it


@dataclass
class Request:
    head: bytes
    body: bytes

    def header(self, name: str) -> str | None:
        for line in self.head.split(b"\r\n")[1:]:
            field, _, value = line.partition(b":")
            if field.strip().lower() == name.lower().encode():
                return value.strip().decode("latin-1")
        return None


Handler = Callable[[Request, socket.socket, threading.Event], None]


class Hostile(LoopbackServer):
    """An HTTP/1.1 server on a free port, on raw sockets: ``handler`` writes whatever bytes it
    likes as the answer. ``requests`` counts the requests it read."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests = 0
        self.lock = threading.Lock()
        super().__init__("hostile-http")
        self.url += "/charges"

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            connection.settimeout(10)
            try:
                request = self._read(connection)
                if request is None:
                    return
                with self.lock:
                    self.requests += 1
                self.handler(request, connection, self._stop)
            except OSError:  # the probe gave up on this answer and closed
                pass

    @staticmethod
    def _read(connection: socket.socket) -> Request | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = connection.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        request = Request(head, b"")
        length = int(request.header("Content-Length") or 0)
        while len(body) < length:
            chunk = connection.recv(65536)
            if not chunk:
                return None
            body += chunk
        request.body = body
        return request


@pytest.fixture
def hostile() -> Iterator[Callable[[Handler], Hostile]]:
    servers: list[Hostile] = []

    def start(handler: Handler) -> Hostile:
        servers.append(Hostile(handler))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def answer(
    connection: socket.socket, status: str, body: bytes, *headers: bytes, kind: bytes = b"json"
) -> None:
    lines = [
        b"HTTP/1.1 " + status.encode(),
        b"Content-Type: application/" + kind,
        *headers,
        b"Content-Length: " + str(len(body)).encode(),
        b"Connection: close",
    ]
    connection.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + body)


def printable(run: Run) -> bool:
    """Whether every line printed is text a terminal shows as it is, acting on nothing."""
    return all(line.isprintable() for line in (run.out + run.err).splitlines())


def strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def line(run: Run, check: int) -> str:
    return next(line for line in run.out.splitlines() if line.split()[1:2] == [str(check)])


def probe_subprocess(*argv: str, limit: float = 30) -> tuple[Run, float]:
    """``python -m idemkey probe ...`` as a user runs it: killed after ``limit`` seconds (exit
    -9), so a probe that never ends fails the test instead of hanging it."""
    env = {k: v for k, v in os.environ.items() if k != "IDEMKEY_REDIS_URL"}
    started = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "idemkey", "probe", *argv],
            capture_output=True, text=True, timeout=limit, cwd=ROOT, env=env, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return Run(-9, out, ""), time.monotonic() - started
    return Run(result.returncode, result.stdout, result.stderr), time.monotonic() - started


# ---- JSON nested deeper than Python parses ------------------------------------------------


def test_deeply_nested_json_answers_get_a_verdict(
    idemkey: CliRunner, hostile: Callable[[Handler], Hostile]
) -> None:
    """A problem document nested 200000 deep, another per execution: json.loads raises
    RecursionError, not ValueError; the probe reads it as a body that is no JSON object."""
    count = itertools.count()

    def deep(request: Request, connection: socket.socket, stop: threading.Event) -> None:
        body = b'{"id": %d, "x": ' % next(count) + b"[" * 200_000 + b"]" * 200_000 + b"}"
        answer(connection, "201 Created", body, kind=b"problem+json")

    server = hostile(deep)
    run = idemkey("probe", server.url, "-d", CHARGE)
    assert run.code == 1, run.out + run.err
    assert "internal error" not in run.err
    assert "the retry ran again" in line(run, 2)
    assert "bytes differ from offset 7" in run.out
    assert run.out.splitlines()[-1].startswith("verdict: FAIL")


@pytest.mark.parametrize(
    "body", [b"[" * 100_000, b"[" * 100_000 + b"]" * 100_000], ids=["unclosed", "valid"]
)
def test_a_deeply_nested_local_body_is_no_internal_error(
    idemkey: CliRunner, tmp_path: Path, body: bytes
) -> None:
    data = tmp_path / "deep.json"
    data.write_bytes(body)
    run = idemkey("probe", "http://127.0.0.1:1/x", "--data-file", str(data))
    assert run.code == 2, run.err
    assert "give --edit BODY" in run.err
    url = f"http://127.0.0.1:{free_port()}/charges"
    edited = idemkey("probe", url, "--data-file", str(data), "--edit", '{"a": 2}')
    assert edited.code == 3, edited.err  # the arguments passed: it tried to connect
    assert "cannot connect" in edited.err


# ---- digits that int() refuses -------------------------------------------------------------


def test_a_superscript_retry_after_is_no_number(
    idemkey: CliRunner, hostile: Callable[[Handler], Hostile]
) -> None:
    """``Retry-After: \\xb2`` (latin-1 "²"): str.isdigit() says yes, float() says no."""
    count = itertools.count()

    def server(request: Request, connection: socket.socket, stop: threading.Event) -> None:
        n = next(count)
        if n == 1:
            answer(connection, "409 Conflict", b"{}", b"Retry-After: \xb2")
        else:
            replayed = [b"Idempotent-Replayed: true"] if n else []
            answer(connection, "201 Created", b'{"id": 1}', *replayed)

    run = idemkey("probe", hostile(server).url, "-d", CHARGE)
    assert "internal error" not in run.err
    assert run.code == 1, run.out + run.err  # check 3: an edited retry was replayed
    assert line(run, 2).startswith("PASS  2  same key again        replayed: 201"), run.out
    assert "(after 1 x 409, honouring Retry-After)" in line(run, 2)


# ---- escape sequences from the server ------------------------------------------------------


class Remembering:
    """Idempotent, and hostile in every value a check line shows: the first answer to a key
    carries a retention header whose value holds escapes (http.client ends the head at a name
    holding one); the second request with it gets 409 with such a Retry-After, later ones a
    replay with such a replay header; an edited body 422 and no key 400, as problems whose
    ``retry`` member holds escapes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.keys: dict[str, tuple[bytes, bytes, int]] = {}
        self.ids = itertools.count()

    def __call__(self, request: Request, connection: socket.socket, stop: threading.Event) -> None:
        retention = b"Idempotency-Retention: 1\x1b]0;PWNED\x07"
        problem = json.dumps({"type": "x", "retry": ESC}).encode()
        key = request.header("Idempotency-Key")
        if key is None:
            answer(connection, "400 Bad Request", problem, kind=b"problem+json")
            return
        with self.lock:
            n = next(self.ids)
            sent, made, seen = self.keys.get(key, (request.body, b"", 0))
            if not made:
                made = json.dumps({"id": n, ESC + "field": n}).encode()
            self.keys[key] = (sent, made, seen + 1)
        if sent != request.body:
            answer(connection, "422 Unprocessable Content", problem, kind=b"problem+json")
        elif seen == 0:
            answer(connection, "201 Created", made, retention)
        elif seen == 1:
            wait = b"Retry-After: 0" + ESC.replace("\r", "").encode()
            answer(connection, "409 Conflict", problem, wait, kind=b"problem+json")
        else:
            replayed = b"Idempotent-Replayed: true" + ESC.replace("\r", "").encode()
            answer(connection, "201 Created", made, replayed, retention)


_ids = itertools.count()


def every_time(request: Request, connection: socket.socket, stop: threading.Event) -> None:
    """Runs every request, answering a fresh id under a field name that holds escapes."""
    n = next(_ids)
    answer(connection, "201 Created", json.dumps({"id": n, ESC + "field": n}).encode())


def bad_status(request: Request, connection: socket.socket, stop: threading.Event) -> None:
    connection.sendall(b"HTTP/1.1 2\x1b]0;PWNED\x07\x1b[2J01 Created\r\nContent-Length: 0\r\n\r\n")


def _remembering() -> Handler:
    return Remembering()


@pytest.mark.parametrize(
    ("make", "code", "expected", "anywhere"),
    [
        (
            _remembering,
            0,
            {
                1: ["Idempotency-Retention: 1\\x1b]0;PWNED\\x07"],
                2: ["Idempotent-Replayed: true" + SHOWN_ESC, "Idempotency-Retention: 1\\x1b]0;"],
                3: ["retry: " + SHOWN_ESC + "\\r\\u202e"],
                4: ["retry: " + SHOWN_ESC + "\\r\\u202e"],
                5: ["(Retry-After: 0" + SHOWN_ESC],
            },
            [],
        ),
        # The per-field comparison of check 2's and check 5's different answers.
        (lambda: every_time, 1, {}, [SHOWN_ESC + "\\r\\u202efield: "]),
        (lambda: bad_status, 1, {1: ["no answer: BadStatusLine: HTTP/1.1 2\\x1b]0;PWNED"]}, []),
    ],
    ids=["headers-and-problems", "field-names", "status-line"],
)
def test_escape_sequences_from_the_server_are_printed_escaped(
    idemkey: CliRunner,
    hostile: Callable[[Handler], Hostile],
    make: Callable[[], Handler],
    code: int,
    expected: dict[int, list[str]],
    anywhere: list[str],
) -> None:
    url = hostile(make()).url
    run = idemkey("probe", url, "-d", CHARGE)
    assert run.code == code, run.out + run.err
    assert printable(run), repr(run.out + run.err)
    for check, shown in expected.items():
        for text in shown:
            assert text in line(run, check), (text, line(run, check))
    for text in anywhere:
        assert text in run.out, (text, run.out)
    # The JSON report's strings too: a CI job prints its summaries.
    report = json.loads(idemkey("probe", url, "-d", CHARGE, "--json").out)
    assert report["checks"], report
    assert all(s.isprintable() for s in strings(report)), report


# ---- --timeout is a deadline per request ---------------------------------------------------


def trickle_body(request: Request, connection: socket.socket, stop: threading.Event) -> None:
    connection.sendall(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n\r\n")
    while not stop.wait(0.2):  # one byte at a time, without end: 8 MiB would take weeks
        connection.sendall(b"x")


def trickle_head(request: Request, connection: socket.socket, stop: threading.Event) -> None:
    connection.sendall(b"HTTP/1.1 201 Created\r\n")
    while not stop.wait(0.2):  # a header line that never ends
        connection.sendall(b"X")


@pytest.mark.parametrize(
    ("handler", "said"),
    [
        (trickle_body, "body not complete within 1 s"),
        (trickle_head, "no answer within 1 s"),
    ],
    ids=["body", "head"],
)
def test_timeout_is_a_deadline_for_a_trickling_answer(
    hostile: Callable[[Handler], Hostile], handler: Handler, said: str
) -> None:
    server = hostile(handler)
    run, took = probe_subprocess(server.url, "-d", CHARGE, "--timeout", "1", limit=30)
    assert run.code == 1, (run.code, run.out, run.err)
    assert f"FAIL  1  first request         {said}" in run.out
    assert took < 15, took
    assert server.requests == 1  # check 1 failed: nothing else sent


# ---- credentials in the URL ----------------------------------------------------------------


def test_a_url_with_credentials_is_refused_and_its_password_never_printed(
    idemkey: CliRunner, hostile: Callable[[Handler], Hostile]
) -> None:
    """http.client ignores a URL's user information: the probe would run unauthenticated
    without a word. It refuses such a URL instead, naming -H, and prints no password."""
    server = hostile(every_time)
    netloc = server.url.split("/")[2]
    for extra in ((), ("--json",)):
        run = idemkey(
            "probe", f"http://alice:S3cretPassw0rd@{netloc}/charges", "-d", CHARGE, *extra
        )
        assert run.code == 2, run.out + run.err
        assert run.out == ""
        assert len(run.err.splitlines()) == 1, run.err
        assert "S3cretPassw0rd" not in run.err
        assert "alice:***@" in run.err
        assert "-H 'Authorization: Basic " in run.err
    user_only = idemkey("probe", f"http://alice@{netloc}/charges", "-d", CHARGE)
    assert user_only.code == 2
    assert "-H 'Authorization: Basic " in user_only.err
    assert server.requests == 0
    # A URL bad for another reason too: still no password in the line.
    for bad in ("ftp://alice:S3cretPassw0rd@host/x", "http://alice:S3cretPassw0rd@host/a b"):
        run = idemkey("probe", bad, "-d", CHARGE)
        assert run.code == 2
        assert "S3cretPassw0rd" not in run.err, run.err


def test_a_password_in_the_query_is_not_printed(idemkey: CliRunner) -> None:
    url = f"http://127.0.0.1:{free_port()}/charges?password=S3cretPassw0rd&x=1"
    run = idemkey("probe", url, "-d", CHARGE)
    assert run.code == 3, run.err
    assert "S3cretPassw0rd" not in run.err
    assert "?password=***&x=1: cannot connect" in run.err


# ---- bodies cut short, and past the cap ---------------------------------------------------


def test_a_body_cut_short_is_no_answer_not_a_second_execution(
    idemkey: CliRunner, hostile: Callable[[Handler], Hostile]
) -> None:
    """A replay declaring 1022 bytes and sending 500 (then closing) is a failed answer that
    says so, never a different body (a second execution)."""
    count = itertools.count()
    body = b'{"id":"ch_1","pad":"' + b"x" * 1000 + b'"}'

    def cut(request: Request, connection: socket.socket, stop: threading.Event) -> None:
        first = next(count) == 0
        head = (
            b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n" % len(body)
            + (b"" if first else b"Idempotent-Replayed: true\r\n")
            + b"Connection: close\r\n\r\n"
        )
        connection.sendall(head + (body if first else body[:500]))

    run = idemkey("probe", hostile(cut).url, "-d", CHARGE)
    assert "body cut short: 500 of 1022 bytes" in line(run, 2), run.out
    assert "second execution" not in run.out


def test_bodies_past_the_cap_are_never_called_byte_equal(
    idemkey: CliRunner, hostile: Callable[[Handler], Hostile]
) -> None:
    """Each execution answers other bytes after the first 8 MiB: the probe compares only the
    first 8 MiB, so it must not call a replay byte-equal (PASS) on them."""
    count = itertools.count()

    def big(request: Request, connection: socket.socket, stop: threading.Event) -> None:
        n = next(count)
        body = b"a" * (8 * 1024 * 1024) + b"%d" % n
        marker = b"Idempotent-Replayed: true\r\n" if n else b""
        head = b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n%sConnection: close\r\n\r\n"
        connection.sendall(head % (len(body), marker) + body)

    run = idemkey("probe", hostile(big).url, "-d", CHARGE)
    assert "byte-equal" not in line(run, 2), run.out
    assert line(run, 2).split()[0] != "PASS", run.out
    assert "past the first 8 MiB" in line(run, 2), run.out
    assert line(run, 5).split()[0] == "INCONCLUSIVE", run.out  # never "one execution"
    assert "first 8 MiB (the rest not compared)" in line(run, 3), run.out
