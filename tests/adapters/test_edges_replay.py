"""Issue 10, item 7, through real servers: a replay is the first answer again, status line,
header order and header set included (only ``Idempotent-Replayed`` added)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from idemkey._codec import StoredResponse, decode_response
from tests.adapters.edge_servers import ASGI_SERVED, WSGI_SERVED, Raw, Server, servers

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.redis
__all__ = ["servers"]  # the fixture, imported

WSGI = WSGI_SERVED
ALL = [*WSGI_SERVED, *ASGI_SERVED]
# Added by the server to every answer it sends, first or replayed.
SERVER_HEADERS = {"date", "server", "connection"}


def new_key() -> str:
    return "k" + uuid.uuid4().hex[:16]


def app_headers(reply: Raw) -> list[tuple[str, str]]:
    return [(n.lower(), v) for n, v in reply.headers if n.lower() not in SERVER_HEADERS]


def first_and_replay(server: Server, path: str) -> tuple[Raw, Raw]:
    key = new_key()
    headers = [("Idempotency-Key", key), ("Content-Type", "application/json")]
    first = server.post(path, b'{"amount": 10}', headers)
    replay = server.post(path, b'{"amount": 10}', headers)
    assert replay.header("Idempotent-Replayed") == "true", replay
    assert server.runs(key) == 1
    return first, replay


@pytest.fixture(params=ALL)
def any_server(request: pytest.FixtureRequest, servers: Callable[[str, str], Server]) -> Server:
    return servers(*request.param)


@pytest.fixture(params=WSGI)
def wsgi_server(request: pytest.FixtureRequest, servers: Callable[[str, str], Server]) -> Server:
    return servers(*request.param)


def replayed_lines(server: Server, first: Raw) -> list[tuple[str, str]]:
    """The header lines a replay of ``first`` carries: the first answer's, in its order, then
    Idempotent-Replayed. waitress sorts every answer's lines by name (same-named lines keep their
    order: a stable sort), so there Idempotent-Replayed takes its place by name."""
    lines = [*app_headers(first), ("idempotent-replayed", "true")]
    if server.name.startswith("waitress-"):
        lines.sort(key=lambda line: line[0])
    return lines


def test_replayed_204_has_no_content_length(any_server: Server) -> None:
    first, replay = first_and_replay(any_server, "/empty")
    assert first.status == replay.status == 204
    assert first.header("Content-Length") is None
    assert replay.header("Content-Length") is None  # RFC 9110 section 8.6
    assert app_headers(replay) == replayed_lines(any_server, first)


def test_custom_reason_phrase_is_replayed(wsgi_server: Server) -> None:
    """granian sends only the status code on: its standard phrase goes out, first and replay."""
    first, replay = first_and_replay(wsgi_server, "/reason")
    phrase = "Created" if wsgi_server.name.startswith("granian-") else "Charged OK"
    assert (first.status, first.reason) == (201, phrase)
    assert (replay.status, replay.reason) == (201, phrase)
    assert replay.body == first.body


def test_header_order_and_lines_are_replayed(any_server: Server) -> None:
    first, replay = first_and_replay(any_server, "/charges")
    assert first.status == replay.status == 201
    assert replay.body == first.body
    assert app_headers(replay) == replayed_lines(any_server, first)


# Records written before the reason phrase was stored (format 1, four fields), as bytes.
TODAYS_RECORDS = {
    b"\x01\x94\xcc\xc9\x93\x92\xacContent-Type\xb0application/json\x92\xa4Link\xab</a>; "
    b'rel=a\x92\xa4Link\xab</b>; rel=b\xc4\x08{"id":1}\xc3': StoredResponse(
        201,
        (("Content-Type", "application/json"), ("Link", "</a>; rel=a"), ("Link", "</b>; rel=b")),
        b'{"id":1}',
    ),
    b"\x01\x94\xcc\xc8\x91\x92\xacContent-Type\xaatext/plain\xc4\x00\xc2": StoredResponse(
        200, (("Content-Type", "text/plain"),), b"", body_kept=False
    ),
}


@pytest.mark.parametrize("stored", TODAYS_RECORDS)
def test_records_in_the_previous_format_still_decode(stored: bytes) -> None:
    decoded = decode_response(stored)
    assert decoded == TODAYS_RECORDS[stored]
    assert decoded.reason == ""
