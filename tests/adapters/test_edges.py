"""Issue 10 through real servers: the request body a framework already read, short and broken
bodies, joined key field lines (gunicorn and werkzeug, Flask extension and WSGI middleware).

Each server runs ``tests/adapters/edge_apps.py`` in its own process; the handler counts its
runs in Redis, so "ran once" is read from where the work happened.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING

import pytest

from tests.adapters.edge_servers import Raw, Server, servers

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.redis
__all__ = ["servers"]  # the fixture, imported

WSGI_SERVERS = [
    pytest.param(("gunicorn", "flask"), id="gunicorn-flask"),
    pytest.param(("gunicorn", "wsgi"), id="gunicorn-wsgi"),
    pytest.param(("werkzeug", "flask"), id="werkzeug-flask"),
    pytest.param(("werkzeug", "wsgi"), id="werkzeug-wsgi"),
]


@pytest.fixture(params=WSGI_SERVERS)
def wsgi_server(request: pytest.FixtureRequest, servers: Callable[[str, str], Server]) -> Server:
    return servers(*request.param)


def new_key() -> str:
    return "k" + uuid.uuid4().hex[:16]


def code(reply: Raw) -> str:
    assert reply.header("Content-Type") == "application/problem+json", (reply, reply.body)
    return str(json.loads(reply.body)["code"])


FORM = [("Content-Type", "application/x-www-form-urlencoded")]


# ---- 10: two Idempotency-Key field lines ----------------------------------------------------


@pytest.mark.parametrize(
    "where", [*WSGI_SERVERS, pytest.param(("uvicorn", "asgi"), id="uvicorn-asgi")]
)
def test_two_key_field_lines_are_refused_on_every_server(
    servers: Callable[[str, str], Server], where: tuple[str, str]
) -> None:
    """gunicorn and werkzeug join `"x` and `y"` into one value, `"x,y"`, which must not pass
    as a key; uvicorn keeps two lines, refused as such."""
    server = servers(*where)
    key = new_key()
    headers = [("Idempotency-Key", f'"{key}'), ("Idempotency-Key", 'y"'), *FORM]
    reply = server.post("/charges", b"amount=10", headers)
    assert reply.status == 400, reply
    assert code(reply) == "invalid_key"
    assert server.runs(f'"{key},y"') == server.runs(f'"{key}, y"') == 0


# ---- 2: a framework read the body before the view --------------------------------------------


@pytest.mark.parametrize("path", ["/form", "/stream-read"])
@pytest.mark.parametrize("server", ["gunicorn", "werkzeug"])
def test_flask_body_read_before_the_view_is_still_fingerprinted(
    servers: Callable[[str, str], Server], server: str, path: str
) -> None:
    """A before_request hook parsed request.form (or read request.stream): another body with the
    same key is still another request (422), never a replay of the first."""
    app = servers(server, "flask")
    key = new_key()
    first = app.post(path, b"amount=10", [("Idempotency-Key", key), *FORM])
    assert first.status == 201, first
    same = app.post(path, b"amount=10", [("Idempotency-Key", key), *FORM])
    assert same.status == 201, same
    assert same.header("Idempotent-Replayed") == "true"
    assert same.body == first.body
    other = app.post(path, b"amount=99", [("Idempotency-Key", key), *FORM])
    assert other.status == 422, other
    assert code(other) == "key_reused"
    assert app.runs(key) == 1


def test_flask_view_still_sees_the_parsed_form(servers: Callable[[str, str], Server]) -> None:
    app = servers("gunicorn", "flask")
    reply = app.post("/form", b"amount=10", [("Idempotency-Key", new_key()), *FORM])
    assert reply.status == 201
    assert json.loads(reply.body)["amount"] == "10"


# ---- 3: Content-Length 24, 22 bytes sent, connection closed ---------------------------------


def test_short_body_is_400_incomplete_body_and_never_runs(wsgi_server: Server) -> None:
    key = new_key()
    head = (
        "POST /charges HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
        f"Idempotency-Key: {key}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        "Content-Length: 24\r\n\r\n"
    ).encode()
    reply = wsgi_server.send(head + b"amount=10&currency=eu", close_write=True)  # 21 of 24
    assert reply.status == 400, reply
    assert code(reply) == "incomplete_body"
    assert wsgi_server.runs(key) == 0
    # The honest full retry runs: nothing was stored for the short one.
    full = wsgi_server.post(
        "/charges", b"amount=10&currency=eur&x", [("Idempotency-Key", key), *FORM]
    )
    assert full.status == 201, full
    assert wsgi_server.runs(key) == 1


# ---- 9: malformed or aborted chunked uploads ------------------------------------------------

CHUNKED_HEAD = (
    "POST /charges HTTP/1.1\r\nHost: t\r\nConnection: close\r\nIdempotency-Key: {key}\r\n"
    "Content-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n\r\n"
)
BROKEN_CHUNKS = {
    "bad-size": (b"zz\r\namount=10\r\n0\r\n\r\n", False),
    "no-terminator": (b"9\r\namount=10XX0\r\n\r\n", False),
    "closed-mid-chunk": (b"20\r\namount=10", True),
}


@pytest.mark.parametrize("case", BROKEN_CHUNKS)
def test_broken_chunked_body_is_a_400_problem_never_a_500(wsgi_server: Server, case: str) -> None:
    key = new_key()
    chunks, close_write = BROKEN_CHUNKS[case]
    try:
        reply = wsgi_server.send(
            CHUNKED_HEAD.format(key=key).encode() + chunks, close_write=close_write
        )
    except (ValueError, ConnectionError):
        reply = None  # the server itself refused the stream before any app saw it
    if reply is not None:
        assert reply.status == 400, (reply, wsgi_server.log_text()[-3000:])
        if reply.header("Content-Type") == "application/problem+json":
            assert code(reply) in ("invalid_body", "incomplete_body")
    assert "Traceback" not in wsgi_server.log_text(), wsgi_server.log_text()[-3000:]
    assert wsgi_server.runs(key) == 0
