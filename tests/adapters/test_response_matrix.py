"""The response-class matrix, replayed on every harness of the adapter suite.

JSON, HTML, a file, a redirect, a streamed body, a 204, two ``Set-Cookie`` lines and two
``Link`` lines: the retry gets the first answer's status, body, and header lines in their
order, plus ``Idempotent-Replayed: true``. Two documented exceptions: ``Set-Cookie`` (and
``Date``) are on the default ``header_denylist``, so a replay carries none (it must not hand
out a second session), and a streamed body is not kept (``Idempotent-Body-Not-Kept: true``,
empty body, same status and headers). Runs on the suite's fixtures (``tests/adapters/conftest.py``).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from tests.adapters.harness import MATRIX, STREAM_CHUNKS

if TYPE_CHECKING:
    from tests.adapters.harness import Harness, Reply

NOT_STORED = {"set-cookie", "date"}  # the default header_denylist's end-to-end headers
REPLAYED = ("Idempotent-Replayed", "true")


def send_twice(harness: Harness, path: str) -> tuple[Reply, Reply]:
    headers = [("Idempotency-Key", uuid.uuid4().hex), ("Content-Type", "application/json")]
    first = harness.request("POST", path, headers=headers, body=b"{}")
    replay = harness.request("POST", path, headers=headers, body=b"{}")
    return first, replay


def stored_lines(reply: Reply) -> list[tuple[str, str]]:
    return [(n.lower(), v) for n, v in reply.headers if n.lower() not in NOT_STORED]


def lowered(lines: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(n.lower(), v) for n, v in lines]


@pytest.mark.parametrize("kind", MATRIX)
def test_each_response_class_is_replayed_exactly(harness: Harness, kind: str) -> None:
    status, headers, body = MATRIX[kind]
    first, replay = send_twice(harness, f"/matrix/{kind}")
    assert first.status == status, first
    assert first.body == body
    assert harness.executions["matrix"] == 1
    assert replay.status == first.status
    assert replay.body == first.body
    assert lowered(replay.headers) == [*stored_lines(first), lowered([REPLAYED])[0]]
    if first.header("Content-Length") is None:
        assert replay.header("Content-Length") is None  # a 204 must not get one (RFC 9110 8.6)
    # The app's own lines reached the first client and come back in the replay (Django keeps
    # one value per header name, so only the last Link line).
    for name, value in headers:
        if harness.name.startswith("django") and (name, value) == ("Link", "</p/2>; rel=next"):
            continue
        if name.lower() not in NOT_STORED and name.lower() != "content-type":
            assert (name.lower(), value) in lowered(replay.headers), (name, value)


def test_two_link_lines_stay_two_lines(harness: Harness) -> None:
    first, replay = send_twice(harness, "/matrix/links")
    links = ["</p/2>; rel=next", "</p/9>; rel=last"]
    if harness.name.startswith("django"):  # HttpResponse keeps one value per header name
        links = links[1:]
    assert first.header_all("Link") == links
    assert replay.header_all("Link") == links


def test_set_cookie_lines_reach_the_first_client_only(harness: Harness) -> None:
    first, replay = send_twice(harness, "/matrix/cookies")
    cookies = [c.split(";")[0].strip() for c in first.header_all("Set-Cookie")]
    assert cookies == ["a=1", "b=2"]
    assert replay.header_all("Set-Cookie") == []  # denylisted: a replay hands out no session
    assert replay.body == first.body


def test_a_streamed_response_replays_its_status_and_headers(harness: Harness) -> None:
    first, replay = send_twice(harness, "/stream")
    assert first.body == b"".join(STREAM_CHUNKS)
    assert harness.executions["stream"] == 1
    assert replay.status == first.status
    assert replay.body == b""
    assert replay.header("Idempotent-Body-Not-Kept") == "true"
    expected = [*stored_lines(first), ("idempotent-replayed", "true")]
    expected.append(("idempotent-body-not-kept", "true"))
    assert lowered(replay.headers) == expected
