"""With every option of issue 24 off, every harness answers byte for byte as before it.

``answers_before_24.json`` holds what main answered (before issue 24) to :data:`SCENARIO`, per
harness: status, header lines in order and body. Today's answers must equal them once the two
new problem members (``retention``, ``retry``) are taken out of problem bodies (and their
Content-Length counted again). Only the ``Date`` value is masked: it changes every second.

Regenerate (only when an answer is meant to change) from a tree of the older code::

    IDEMKEY_RECORD_ANSWERS=1 python -m pytest tests/adapters/test_answers_unchanged.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.adapters.test_suite import JSON, key, padded

if TYPE_CHECKING:
    from tests.adapters.harness import Harness, Reply

GOLDEN = Path(__file__).with_name("answers_before_24.json")
RECORD = os.environ.get("IDEMKEY_RECORD_ANSWERS") == "1"
NEW_MEMBERS = ("retention", "retry")

#: (method, path, headers, body): first answers, replays, refusals, pass-throughs.
SCENARIO: list[tuple[str, str, list[tuple[str, str]], bytes]] = [
    ("POST", "/charges", [JSON, key("a")], b'{"amount": 5}'),
    ("POST", "/charges", [JSON, key("a")], b'{"amount": 5}'),
    ("POST", "/charges", [JSON, key("a")], b'{"amount": 6}'),
    ("POST", "/charges", [JSON], b'{"amount": 5}'),
    ("POST", "/charges", [JSON, key("a b")], b'{"amount": 5}'),
    ("POST", "/charges", [JSON, key("x"), key("y")], b'{"amount": 5}'),
    ("POST", "/charges", [JSON, key("big")], padded(2049)),
    ("POST", "/charges", [JSON, key("bad")], b"not json"),
    ("GET", "/charges", [], b""),
    ("PATCH", "/charges/1", [JSON, key("p")], b'{"amount": 2}'),
    ("PATCH", "/charges/1", [JSON, key("p")], b'{"amount": 2}'),
    ("POST", "/declined", [key("d")], b""),
    ("POST", "/declined", [key("d")], b""),
    ("POST", "/fail500", [key("f")], b""),
    ("POST", "/status/404", [key("n")], b""),
    ("POST", "/big", [key("g")], b""),
    ("POST", "/big", [key("g")], b""),
    ("POST", "/stream", [key("s")], b""),
    ("POST", "/stream", [key("s")], b""),
    *[
        (method, f"/matrix/{kind}", [JSON, key(kind)], b"{}")
        for kind in ("json", "html", "redirect", "no-content", "cookies", "links")
        for method in ("POST", "POST")
    ],
]


def normalised(reply: Reply) -> dict[str, Any]:
    headers = [[n, "<date>" if n.lower() == "date" else v] for n, v in reply.headers]
    body = reply.body
    content_type = reply.header("Content-Type") or ""
    if content_type == "application/problem+json" and not RECORD:
        document = json.loads(body)
        for member in NEW_MEMBERS:
            assert member in document, (member, document)
            del document[member]
        body = json.dumps(document, separators=(",", ":")).encode()
        headers = [[n, str(len(body)) if n.lower() == "content-length" else v] for n, v in headers]
    return {"status": reply.status, "headers": headers, "body": body.decode("latin-1")}


def answers(harness: Harness) -> list[dict[str, Any]]:
    return [
        normalised(harness.request(method, path, headers=headers, body=body))
        for method, path, headers, body in SCENARIO
    ]


def test_every_answer_is_as_before_but_the_two_problem_members(
    harness: Harness, harness_kind: tuple[str, str]
) -> None:
    name = "-".join(harness_kind)
    got = answers(harness)
    if RECORD:
        recorded = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        recorded[name] = got
        GOLDEN.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        pytest.skip("recorded")
    recorded = json.loads(GOLDEN.read_text())
    # A valkey-py or glide row answers as its redis-py twin did: the client library is not on
    # the wire.
    expected = recorded[name.replace("-valkey-py", "-redis").replace("-glide", "-redis")]
    for index, (mine, before) in enumerate(zip(got, expected, strict=True)):
        assert mine == before, (index, SCENARIO[index][:2])
