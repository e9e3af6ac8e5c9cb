"""Issue 10 through real servers: the request body a framework already read and joined key field
lines (every WSGI server with the Flask extension and the WSGI middleware, every ASGI server with
the ASGI middleware; short and broken bodies, which each server treats its own way, are in
test_edges_servers.py).

Each server runs ``tests/adapters/edge_apps.py`` in its own process; the handler counts its
runs in Redis, so "ran once" is read from where the work happened.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING

import pytest

from tests.adapters.edge_servers import ASGI_SERVED, WSGI, WSGI_SERVED, Raw, Server, servers

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.redis
__all__ = ["servers"]  # the fixture, imported

WSGI_SERVERS = WSGI_SERVED


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


@pytest.mark.parametrize("where", [*WSGI_SERVED, *ASGI_SERVED])
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
@pytest.mark.parametrize("server", WSGI)
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


# ---- 3 and 9, short and broken bodies: per server, in test_edges_servers.py ------------------
