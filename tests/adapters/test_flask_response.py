"""idemkey's own answers as Flask responses (``_flask_response.respond``), built without
werkzeug's per-header calls: the same response ``response_class(body, status, headers)``
gave, less the default Content-Type and a Content-Length the answer has not got; and a first
answer's body read as ``get_data()`` reads it (``body_of``)."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask
from flask import Response as FlaskResponse

from idemkey.adapters._flask_response import body_of, respond
from idemkey.http import Response

_ENVIRON = {"REQUEST_METHOD": "POST", "SERVER_NAME": "x", "SERVER_PORT": "80"}


class _Marked(FlaskResponse):
    """A response class that stores a body its own way."""

    def set_data(self, value: bytes | str) -> None:
        super().set_data(value + b"!" if isinstance(value, bytes) else value)


class _Unsized(FlaskResponse):
    automatically_set_content_length = False


def _sent(response: Any) -> tuple[str, list[tuple[str, str]], bytes]:
    """What the server is handed: status line, headers, body."""
    started: list[Any] = []
    body = b"".join(response(dict(_ENVIRON), lambda s, h, e=None: started.append((s, h))))
    return started[0][0], started[0][1], body


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        (  # a single length is werkzeug's spelling, where it stood
            [("content-type", "application/json"), ("content-length", "5"), ("X-A", "1")],
            [("content-type", "application/json"), ("Content-Length", "5"), ("X-A", "1")],
        ),
        (  # no Content-Type or -Length added
            [("X-A", "1"), ("Idempotent-Replayed", "true")],
            [("X-A", "1"), ("Idempotent-Replayed", "true")],
        ),
        (  # repeated lengths: one left, the first
            [("Content-Length", "5"), ("X", "y"), ("CONTENT-LENGTH", "5")],
            [("Content-Length", "5"), ("X", "y")],
        ),
        (  # repeated fields stay, in order
            [("Set-Cookie", "a=1"), ("Content-Type", "a"), ("Set-Cookie", "b=2")],
            [("Set-Cookie", "a=1"), ("Content-Type", "a"), ("Set-Cookie", "b=2")],
        ),
    ],
)
def test_an_answer_carries_exactly_its_headers(
    stored: list[tuple[str, str]], expected: list[tuple[str, str]]
) -> None:
    app = Flask("respond")
    with app.test_request_context("/", method="POST"):
        response = respond(app, Response(201, list(stored), b"hello", "Charged OK"))
        assert list(response.headers) == expected
        assert _sent(response) == ("201 Charged OK", expected, b"hello")
        assert response.get_data() == b"hello"


def test_a_status_without_its_phrase_is_werkzeugs() -> None:
    app = Flask("respond")
    with app.test_request_context("/", method="POST"):
        response = respond(app, Response(409, [("Content-Length", "2")], b"no"))
        assert (response.status, response.status_code) == ("409 CONFLICT", 409)


def test_an_answer_without_a_length_gets_none_from_werkzeug() -> None:
    app = Flask("respond")
    with app.test_request_context("/", method="POST"):
        response = respond(app, Response(200, [("X-A", "1")], b"hello"))
        assert not response.automatically_set_content_length
        assert _sent(response)[1] == [("X-A", "1")]


@pytest.mark.parametrize("value", ["bad\nvalue", "bad\rvalue"])
def test_a_header_value_with_a_line_break_is_refused_as_werkzeug_refuses_it(value: str) -> None:
    app = Flask("respond")
    with (
        app.test_request_context("/", method="POST"),
        pytest.raises(ValueError, match="must not contain newline"),
    ):
        respond(app, Response(200, [("Content-Length", "5"), ("X", value)], b"hello"))


def test_a_response_class_that_stores_its_body_its_own_way_stores_it() -> None:
    app = Flask("respond")
    app.response_class = _Marked
    with app.test_request_context("/", method="POST"):
        response = respond(app, Response(200, [("Content-Length", "5")], b"hello"))
        assert type(response) is _Marked
        assert _sent(response) == ("200 OK", [("Content-Length", "6")], b"hello!")


def test_a_response_class_without_automatic_lengths_keeps_the_stored_one() -> None:
    app = Flask("respond")
    app.response_class = _Unsized
    with app.test_request_context("/", method="POST"):
        response = respond(app, Response(200, [("content-length", "5")], b"hello"))
        assert _sent(response)[1] == [("content-length", "5")]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"hello", b"hello"),
        ("h\u00e9llo", "h\u00e9llo".encode()),
        (["a", b"b"], b"ab"),
        ((b"a", b"b"), b"ab"),
        ([bytearray(b"a"), b"b"], b"ab"),
        (iter([b"a"]), None),  # streamed: not kept
    ],
)
def test_a_first_answers_body_is_what_get_data_reads(body: Any, expected: bytes | None) -> None:
    response = FlaskResponse(body)
    assert body_of(response) == expected
    if expected is not None:
        assert response.get_data() == expected
