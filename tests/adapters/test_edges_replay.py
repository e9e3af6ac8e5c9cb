"""Issue 10, item 7, through real servers: a replay is the first answer again, status line,
header order and header set included (only ``Idempotent-Replayed`` added); a stored head no
server would send is the ``503 record_unreadable`` problem, never a server's failure."""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import TYPE_CHECKING

import pytest
import redis

from idemkey._codec import StoredResponse, decode_response, encode_response
from tests._servers import wait_until
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


@pytest.fixture(params=ASGI_SERVED)
def asgi_server(request: pytest.FixtureRequest, servers: Callable[[str, str], Server]) -> Server:
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


def _json_post(key: str) -> list[tuple[str, str]]:
    return [("Idempotency-Key", key), ("Content-Type", "application/json")]


def outcome(server: Server, path: str, key: str) -> str:
    """What a client gets: a status, a problem's status and code, or ``closed`` (the server
    dropped the connection with no answer)."""
    try:
        reply = server.post(path, b"{}", _json_post(key))
    except (OSError, ValueError):  # reset, or closed before a status line
        return "closed"
    if reply.header("Content-Type") == "application/problem+json":
        return f"{reply.status} {json.loads(reply.body)['code']}"
    return str(reply.status)


def completed_record(client: redis.Redis, server: Server, before: set[bytes]) -> bytes:
    """The record the last request made under ``server``'s prefix, once it holds a response."""
    found = wait_until(
        lambda: set(client.scan_iter(match=f"{server.prefix}:{{*")) - before, message="a record"
    )
    (record,) = found
    wait_until(lambda: client.hget(record, "resp"), message="the record's response")
    return record


JSON = (("Content-Type", "application/json"),)
#: Heads that decode as data but that servers refuse to send: waitress answers 500 for a
#: hop-by-hop line, uvicorn and hypercorn (h11) drop the connection on a 1xx or a value h11
#: refuses, gunicorn answers 500 for a control character (but HTAB) in a value or reason
#: phrase. Written by anything but idemkey (plan_for stores none of them).
REFUSED_HEADS = {
    "status-101": StoredResponse(101, JSON, b"x"),
    "status-103": StoredResponse(103, (), b""),
    **{
        f"hop-{name.lower()}": StoredResponse(201, (*JSON, (name, value)), b"{}")
        for name, value in [
            ("Connection", "close"),
            ("Keep-Alive", "timeout=5"),
            ("Proxy-Connection", "close"),
            ("TE", "trailers"),
            ("Trailer", "X-Sum"),
            ("Transfer-Encoding", "chunked"),
            ("Upgrade", "websocket"),
        ]
    },
    "value-leading-space": StoredResponse(201, (*JSON, ("X-Note", " padded")), b"{}"),
    "value-trailing-tab": StoredResponse(201, (*JSON, ("X-Note", "padded\t")), b"{}"),
    "value-vt": StoredResponse(201, (*JSON, ("X-Note", "a\x0bb")), b"{}"),
    # h11 sends these (uvicorn, hypercorn), and werkzeug's server, waitress and daphne: gunicorn
    # answers 500, granian's ASGI interface 500 and its WSGI one drops the line.
    "value-soh": StoredResponse(201, (*JSON, ("X-Note", "a\x01b")), b"{}"),
    "value-us": StoredResponse(201, (*JSON, ("X-Note", "a\x1fb")), b"{}"),
    "value-del": StoredResponse(201, (*JSON, ("X-Note", "a\x7fb")), b"{}"),
    "reason-soh": StoredResponse(201, JSON, b"{}", reason="Charged\x01OK"),
}


def test_a_stored_head_no_server_sends_is_a_503_problem_on_every_server(
    any_server: Server,
) -> None:
    """Not a 500 or a dropped connection on every retry for the record's whole retention: the
    record is unreadable, as other forged records are, and the handler does not run again."""
    got: dict[str, str] = {}
    with contextlib.closing(redis.Redis.from_url(any_server.redis_url)) as client:
        for case, forged in REFUSED_HEADS.items():
            key = new_key()
            before = set(client.scan_iter(match=f"{any_server.prefix}:{{*"))
            assert outcome(any_server, "/charges", key) == "201"
            record = completed_record(client, any_server, before)
            client.hset(record, "resp", encode_response(forged))
            got[case] = outcome(any_server, "/charges", key)
            assert any_server.runs(key) == 1, case
    assert got == dict.fromkeys(REFUSED_HEADS, "503 record_unreadable")


def test_an_app_value_h11_refuses_is_not_stored_to_fail_every_retry(asgi_server: Server) -> None:
    """An ASGI app sends a value with a leading space: uvicorn (h11) cannot send the first
    answer. The record keeps the value as a client reads it, without that space (RFC 9110
    5.5), so every retry is the replay, on every server."""
    key = new_key()
    with contextlib.closing(redis.Redis.from_url(asgi_server.redis_url)) as client:
        before = set(client.scan_iter(match=f"{asgi_server.prefix}:{{*"))
        outcome(asgi_server, "/padded", key)  # the server's own failure, or the answer
        stored = client.hget(completed_record(client, asgi_server, before), "resp")
    assert stored is not None
    assert ("x-note", "padded") in decode_response(stored).headers
    for _ in range(2):
        replay = asgi_server.post("/padded", b"{}", _json_post(key))
        assert (replay.status, replay.header("Idempotent-Replayed")) == (201, "true"), replay
        assert replay.header("X-Note") == "padded"
        # Under uvicorn the head's send raised in the app: the body was never sent, nor kept.
        if replay.header("Idempotent-Body-Not-Kept") != "true":
            assert json.loads(replay.body)["run"] == 1
    assert asgi_server.runs(key) == 1
