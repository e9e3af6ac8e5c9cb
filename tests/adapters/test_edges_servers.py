"""What each server does differently (docs/wsgi-asgi.md#what-each-server-does-differently), each
difference asserted as documented: short, broken and trailered request bodies, a key with a control
character, the reason phrase, the order of header lines.

The tables below are the page's table. An outcome is idemkey's problem (``("problem", code)``),
the server's own answer (``("server", status)``: not a problem document, the app never called),
a connection closed with no answer (``CLOSED``), or, on granian's WSGI interface only, a broken
chunked body read as a complete one (``RAN``). Whatever the server does, a request whose body
did not arrive whole never runs the handler, except where ``RAN`` says it does; then the
honest retry is refused (422), never run twice.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING

import pytest

from tests.adapters.edge_servers import ASGI_SERVED, WSGI_SERVED, Raw, Server, servers

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.redis
__all__ = ["servers"]  # the fixture, imported

CLOSED = ("closed", 0)
RAN = ("ran", 201)
INVALID_BODY = ("problem", "invalid_body")

#: A Content-Length body that arrives short (the client half-closes), per server.
SHORT_BODY: dict[str, tuple[str, object]] = {
    "gunicorn-wsgi": ("problem", "incomplete_body"),
    "werkzeug-wsgi": ("problem", "incomplete_body"),
    "granian-wsgi": ("problem", "incomplete_body"),
    "waitress-wsgi": CLOSED,  # waitress calls the app only once the whole body is in
    "uvicorn-asgi": CLOSED,
    # hypercorn: closed, or (when h11 sees the end of the stream first) its own 400; seen both
    # ways in one CI run.
    "hypercorn-asgi": ("closed or server", 400),
    "daphne-asgi": CLOSED,
    "granian-asgi": ("server", 500),  # http.disconnect to the app, then granian's own 500
}

CHUNKED_HEAD = (
    "POST /charges HTTP/1.1\r\nHost: t\r\nConnection: close\r\nIdempotency-Key: {key}\r\n"
    "Content-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n\r\n"
)
#: case -> (bytes after the head, half-close after sending)
BROKEN_CHUNKS = {
    "bad-size": (b"zz\r\namount=10\r\n0\r\n\r\n", False),
    "no-terminator": (b"9\r\namount=10XX0\r\n\r\n", False),
    "closed-mid-chunk": (b"20\r\namount=10", True),
}
#: A malformed or aborted chunked body, per server and case ("*": every case).
BROKEN_BODY: dict[str, dict[str, tuple[str, object]]] = {
    "gunicorn-wsgi": {"*": INVALID_BODY},
    "werkzeug-wsgi": {"*": INVALID_BODY},
    "waitress-wsgi": {"*": ("server", 400), "closed-mid-chunk": CLOSED},
    "granian-wsgi": {"*": RAN},  # its wsgi.input turns the stream error into EOF
    "uvicorn-asgi": {"*": ("server", 400), "closed-mid-chunk": CLOSED},
    # hypercorn: closed, or its own 400 when h11 sees the end of the stream first (both seen).
    "hypercorn-asgi": {"*": ("server", 400), "closed-mid-chunk": ("closed or server", 400)},
    "daphne-asgi": {"*": ("server", 400), "closed-mid-chunk": CLOSED},
    "granian-asgi": {"*": ("server", 500)},
}

#: A key with a control character (``k\x01x``): refused by idemkey, or by the server first.
CONTROL_KEY: dict[str, tuple[str, object]] = {
    "gunicorn-wsgi": ("server", 400),
    "werkzeug-wsgi": ("problem", "invalid_key"),
    "waitress-wsgi": ("server", 400),
    "granian-wsgi": ("server", 400),
    "uvicorn-asgi": ("problem", "invalid_key"),
    "hypercorn-asgi": ("problem", "invalid_key"),
    "daphne-asgi": ("problem", "invalid_key"),
    "granian-asgi": ("server", 400),
}

#: A Content-Length of 5 000 digits, past what int() converts (4 300 by default).
LONG_LENGTH: dict[str, tuple[str, object]] = {
    "gunicorn": ("server", 400),
    "werkzeug": ("problem", "request_too_large"),  # a length past every limit: 413
    "waitress": CLOSED,  # waitress's own int() raises; it logs it and closes
    "granian": ("server", 400),
    "uvicorn": ("server", 400),
    "hypercorn": ("server", 400),
    "daphne": CLOSED,
}
#: A keyed ``post`` (the method in lower case) to the Flask extension's ``/form``, whose
#: before_request hook parses the form: run once and replayed, or refused by the server first.
LOWER_CASE_METHOD: dict[str, tuple[str, object]] = {
    "gunicorn": ("server", 400),
    "werkzeug": RAN,  # werkzeug routes "post" to the POST view
    "waitress": ("server", 400),
    "granian": RAN,
}
#: The status of a problem an outcome names, when it is not 400.
PROBLEM_STATUS = {"request_too_large": 413}

WSGI_APPS = [p for p in WSGI_SERVED if p.values[0][1] == "wsgi"]
EVERY_SERVER = [*WSGI_APPS, *ASGI_SERVED]
FORM = [("Content-Type", "application/x-www-form-urlencoded")]


def new_key() -> str:
    return "k" + uuid.uuid4().hex[:16]


def send(server: Server, data: bytes, close_write: bool) -> Raw | None:
    """The answer, or None when the server closed the connection without one."""
    try:
        return server.send(data, close_write=close_write)
    except (ValueError, ConnectionError):
        return None


def assert_outcome(server: Server, reply: Raw | None, expected: tuple[str, object]) -> None:
    kind, value = expected
    log = server.log_text()[-2000:]
    assert "Traceback" not in log, log
    if kind == "closed":
        assert reply is None, reply
        return
    if kind == "closed or server":
        if reply is not None:
            assert reply.status == value, reply
            assert reply.header("Content-Type") != "application/problem+json", reply
        return
    assert reply is not None, f"no answer; expected {expected}"
    problem = reply.header("Content-Type") == "application/problem+json"
    if kind == "problem":
        assert (reply.status, problem) == (PROBLEM_STATUS.get(str(value), 400), True), reply
        assert json.loads(reply.body)["code"] == value
    elif kind == "server":
        assert (reply.status, problem) == (value, False), reply
    else:
        assert reply.status == value, reply


def key_of(where: tuple[str, str]) -> str:
    return f"{where[0]}-{where[1]}"


def form_head(key: str, length: object, method: str = "POST", path: str = "/charges") -> bytes:
    """A keyed form request's head, sent raw: its method and Content-Length as given."""
    return (
        f"{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
        f"Idempotency-Key: {key}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


@pytest.mark.parametrize("where", EVERY_SERVER)
def test_a_short_body_never_runs_and_its_full_retry_does(
    servers: Callable[[str, str], Server], where: tuple[str, str]
) -> None:
    server = servers(*where)
    key = new_key()
    body = b"amount=10&currency=eu"  # 21 of the 24 bytes announced
    reply = send(server, form_head(key, 24) + body, close_write=True)
    assert_outcome(server, reply, SHORT_BODY[key_of(where)])
    assert server.runs(key) == 0
    # The honest full retry runs: nothing was stored for the short one.
    full = server.post("/charges", b"amount=10&currency=eur&x", [("Idempotency-Key", key), *FORM])
    assert full.status == 201, full
    assert server.runs(key) == 1


@pytest.mark.parametrize("case", BROKEN_CHUNKS)
@pytest.mark.parametrize("where", EVERY_SERVER)
def test_a_broken_chunked_body_is_answered_as_documented(
    servers: Callable[[str, str], Server], where: tuple[str, str], case: str
) -> None:
    server = servers(*where)
    key = new_key()
    chunks, close_write = BROKEN_CHUNKS[case]
    reply = send(server, CHUNKED_HEAD.format(key=key).encode() + chunks, close_write)
    table = BROKEN_BODY[key_of(where)]
    expected = table.get(case, table["*"])
    assert_outcome(server, reply, expected)
    # The body the client meant (the broken uploads carry at most its first 9 bytes).
    full = server.post("/charges", b"amount=10&currency=eur", [("Idempotency-Key", key), *FORM])
    if expected == RAN:
        # granian handed the app what it had read as the whole body: the handler ran on it
        # and the record is stored, so the full retry is another request for this key.
        assert server.runs(key) == 1
        assert full.status == 422, full
        assert json.loads(full.body)["code"] == "key_reused"
        assert server.runs(key) == 1
    else:
        assert full.status == 201, full  # nothing stored for the broken one: the retry runs
        assert server.runs(key) == 1


@pytest.mark.parametrize("where", EVERY_SERVER)
def test_a_key_with_a_control_character_never_runs(
    servers: Callable[[str, str], Server], where: tuple[str, str]
) -> None:
    server = servers(*where)
    reply = server.post("/charges", b"amount=10", [("Idempotency-Key", "k\x01x"), *FORM])
    assert_outcome(server, reply, CONTROL_KEY[key_of(where)])
    assert server.runs("k\x01x") == 0


@pytest.mark.parametrize("where", [*WSGI_SERVED, *ASGI_SERVED])
def test_a_content_length_of_thousands_of_digits_never_runs(
    servers: Callable[[str, str], Server], where: tuple[str, str]
) -> None:
    server = servers(*where)
    key = new_key()
    reply = send(server, form_head(key, "9" * 5000) + b"amount=10", close_write=True)
    assert_outcome(server, reply, LONG_LENGTH[where[0]])
    assert server.runs(key) == 0


@pytest.mark.parametrize("server_name", ["gunicorn", "werkzeug", "waitress", "granian"])
def test_a_lower_case_method_is_guarded_as_its_server_routes_it(
    servers: Callable[[str, str], Server], server_name: str
) -> None:
    server = servers(server_name, "flask")
    key = new_key()
    request = form_head(key, 9, method="post", path="/form") + b"amount=10"
    expected = LOWER_CASE_METHOD[server_name]
    first = send(server, request, close_write=False)
    assert_outcome(server, first, expected)
    if expected == RAN:
        assert first is not None
        again = send(server, request, close_write=False)
        assert again is not None
        assert (again.status, again.header("Idempotent-Replayed")) == (201, "true"), again
        assert again.body == first.body
        assert server.runs(key) == 1
    else:
        assert server.runs(key) == 0


#: A well-formed chunked body ending in a trailer field (RFC 9112 7.1.2), per server: read
#: and run, or refused whole. werkzeug's dev server raises its own OSError on a trailer line
#: after the last chunk, so idemkey answers 400 ``invalid_body`` every time it is sent.
TRAILER_BODY: dict[str, tuple[str, object]] = {
    "gunicorn-wsgi": RAN,
    "werkzeug-wsgi": INVALID_BODY,
    "waitress-wsgi": RAN,
    "granian-wsgi": RAN,
    "uvicorn-asgi": RAN,
    "hypercorn-asgi": RAN,
    "daphne-asgi": RAN,
    "granian-asgi": RAN,
}
TRAILER_CHUNKS = b"9\r\namount=10\r\n0\r\nX-Checksum: 1234\r\n\r\n"


@pytest.mark.parametrize("where", EVERY_SERVER)
def test_a_chunked_body_with_a_trailer_is_answered_as_documented(
    servers: Callable[[str, str], Server], where: tuple[str, str]
) -> None:
    server = servers(*where)
    key = new_key()
    request = CHUNKED_HEAD.format(key=key).encode() + TRAILER_CHUNKS
    expected = TRAILER_BODY[key_of(where)]
    first = send(server, request, close_write=False)
    assert_outcome(server, first, expected)
    again = send(server, request, close_write=False)  # the same request, sent again
    if expected == RAN:
        assert first is not None
        assert again is not None
        assert (again.status, again.header("Idempotent-Replayed")) == (201, "true"), again
        assert again.body == first.body
        assert server.runs(key) == 1
    else:
        # Refused the same way every time: the server never reads a trailer, so a retry of
        # the same upload never runs; the same body without the trailer does.
        assert_outcome(server, again, expected)
        assert server.runs(key) == 0
        plain = server.post("/charges", b"amount=10", [("Idempotency-Key", key), *FORM])
        assert plain.status == 201, plain
        assert server.runs(key) == 1
