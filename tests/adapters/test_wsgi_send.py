"""A complete answer sent through WSGI: its status line carries its own phrase, else the
standard one, else "Unknown" (a status no RFC names)."""

from __future__ import annotations

import io
from http import HTTPStatus
from typing import Any

import fakeredis
import pytest

from idemkey import RedisStore
from idemkey.adapters._wsgi_response import send
from idemkey.adapters.wsgi import IdempotencyMiddleware
from idemkey.http import Response


@pytest.mark.parametrize(
    ("response", "line"),
    [
        (Response(409, [], b""), f"409 {HTTPStatus(409).phrase}"),
        (Response(422, [], b""), f"422 {HTTPStatus(422).phrase}"),  # renamed in Python 3.13
        (Response(503, [], b""), f"503 {HTTPStatus(503).phrase}"),
        (Response(201, [], b"", "Charged OK"), "201 Charged OK"),
        (Response(599, [], b""), "599 Unknown"),
    ],
)
def test_the_status_line_has_the_answers_phrase_or_the_standard_one(
    response: Response, line: str
) -> None:
    sent: list[Any] = []
    body = send(lambda status, headers, exc_info=None: sent.append((status, headers)), response)
    assert sent == [(line, response.headers)]
    assert body == [response.body]


def test_the_middlewares_own_answers_carry_the_standard_phrase() -> None:
    # As a user's server sees it: a key that is not one is refused before Redis is asked.
    def app(environ: Any, start_response: Any) -> list[bytes]:
        raise AssertionError("the app ran for a refused key")

    guarded = IdempotencyMiddleware(app, RedisStore(fakeredis.FakeRedis()))
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/charges",
        "HTTP_IDEMPOTENCY_KEY": "two words",
        "wsgi.input": io.BytesIO(b""),
    }
    sent: list[str] = []
    guarded(environ, lambda status, headers, exc_info=None: sent.append(status))
    assert sent == [f"400 {HTTPStatus(400).phrase}"]
