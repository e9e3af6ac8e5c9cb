"""The Flask extension's outcome as real servers send it (gunicorn, waitress, werkzeug's own):
the record holds an answer the client was sent, settled once the response leaves Flask.

* ``send_file``: waitress's ``wsgi.file_wrapper`` has a length, so werkzeug took the response
  for a sequence and idemkey read its body (``get_data()`` on a direct-passthrough response):
  a 500, and the claim was never settled (every retry a 409 while the heartbeat renewed it).
  Then the server's file wrapper was handed back inside idemkey's stream, so gunicorn no
  longer sent the file with ``sendfile``.
* An ``after_request`` hook that fails (a unit of work committed after the view): the client
  got Flask's 500 while the view's 201 was stored, so every retry replayed a success whose
  work was never done.
* A streamed body that fails before its first byte: stored as a 200 nobody received.
* A list body: werkzeug adds its Content-Length as it sends it, after the view returned; the
  replay was sent chunked.
"""

from __future__ import annotations

import contextlib
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis

from tests._servers import AppServer
from tests.adapters.edge_servers import Raw, read_response
from tests.adapters.flask_settle_app import RECEIPT

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.adapters.flask_settle_app"
COMMANDS: dict[str, Callable[[int], list[str]]] = {
    "gunicorn": lambda port: [
        sys.executable, "-m", "gunicorn", "--worker-class", "gthread", "--workers", "1",
        "--threads", "4", "--bind", f"127.0.0.1:{port}", "--log-level", "warning",
        f"{APP}:create_app()",
    ],
    "waitress": lambda port: [
        sys.executable, "-m", "waitress", "--host", "127.0.0.1", "--port", str(port),
        "--threads", "4", "--call", f"{APP}:create_app",
    ],
    "werkzeug": lambda port: [sys.executable, "-m", APP, str(port)],
}  # fmt: skip
SERVERS = tuple(COMMANDS)
#: Header lines a replay may differ in: the server's own, and idemkey's mark.
VOLATILE = {"date", "server", "idempotent-replayed"}


@pytest.fixture(scope="module")
def served(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], AppServer]]:
    """``served(server)``: each started at its first use in this module, stopped at its end."""
    running: dict[str, AppServer] = {}

    def get(server: str) -> AppServer:
        if server not in running:
            log = tmp_path_factory.mktemp("flask-settle") / f"{server}.log"
            running[server] = AppServer(
                lambda port: COMMANDS[server](port), log=log, cwd=ROOT, redis_url=redis_url,
                prefix="fs" + server + str(id(running)), name=server,
            )  # fmt: skip
        return running[server]

    try:
        yield get
    finally:
        for server in running.values():
            server.close()


def attempt(server: AppServer, path: str, key: str) -> Raw | None:
    """The answer to a keyed POST, or None when the server closed the connection without a
    whole one."""
    head = f"POST {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nIdempotency-Key: {key}\r\n"
    head += "Authorization: Bearer sk_1\r\nContent-Length: 0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
        sock.sendall(head.encode())
        try:
            return read_response(sock)
        except (ValueError, OSError):
            return None


def post(server: AppServer, path: str, key: str) -> Raw:
    """The answer to a keyed POST, which the server must send whole."""
    answer = attempt(server, path, key)
    assert answer is not None, f"no answer to {path}: {server.log_text()[-2000:]}"
    return answer


def count(server: AppServer, what: str, key: str) -> int:
    assert server.redis_url is not None
    client = redis.Redis.from_url(server.redis_url)
    with contextlib.closing(client):
        return int(client.get(f"{server.prefix}:{what}:{key}") or 0)


def lines(raw: Raw) -> tuple[int, str, list[tuple[str, str]], bytes]:
    return (
        raw.status,
        raw.reason,
        [h for h in raw.headers if h[0].lower() not in VOLATILE],
        raw.body,
    )


@pytest.mark.parametrize("server", SERVERS)
def test_a_file_sent_by_send_file_is_answered_and_replayed(
    served: Callable[[str], AppServer], server: str
) -> None:
    app = served(server)
    first, again = post(app, "/receipt", "r1"), post(app, "/receipt", "r1")
    assert (first.status, first.body) == (200, RECEIPT), app.log_text()[-2000:]
    assert (again.status, again.header("Idempotent-Replayed")) == (200, "true")
    assert again.header("Idempotent-Body-Not-Kept") == "true"  # streamed: not kept
    assert count(app, "runs", "r1") == 1


@pytest.mark.parametrize("server", ["gunicorn", "waitress"])
def test_a_file_sent_by_send_file_reaches_the_server_as_its_file_wrapper(
    served: Callable[[str], AppServer], server: str
) -> None:
    """The server's own ``wsgi.file_wrapper`` object, not a wrapper around it: gunicorn sends
    only that with ``sendfile`` (an ``isinstance`` test), waitress only that from its buffer."""
    app = served(server)
    first, again = post(app, "/receipt", "w1"), post(app, "/receipt", "w1")
    assert (first.status, first.body) == (200, RECEIPT), app.log_text()[-2000:]
    assert (again.status, again.header("Idempotent-Replayed")) == (200, "true")
    assert again.header("Idempotent-Body-Not-Kept") == "true"
    assert (count(app, "runs", "w1"), count(app, "file-wrapper", "w1")) == (1, 1)


@pytest.mark.parametrize("server", ["gunicorn", "werkzeug"])
def test_an_after_request_hook_that_fails_releases_the_key(
    served: Callable[[str], AppServer], server: str
) -> None:
    app = served(server)
    assert post(app, "/commit-fails-once", "c1").status == 500
    again = post(app, "/commit-fails-once", "c1")  # runs again: its work is done this time
    assert (again.status, again.header("Idempotent-Replayed")) == (201, None)
    assert count(app, "committed", "c1") == 1
    replayed = post(app, "/commit-fails-once", "c1")
    assert (replayed.header("Idempotent-Replayed"), replayed.body) == ("true", again.body)
    assert (count(app, "runs", "c1"), count(app, "committed", "c1")) == (2, 1)


@pytest.mark.parametrize("server", SERVERS)
def test_hooks_that_change_the_body_and_add_an_etag_replay_the_same_lines(
    served: Callable[[str], AppServer], server: str
) -> None:
    app = served(server)
    first, again = post(app, "/envelope", "e1"), post(app, "/envelope", "e1")
    assert first.status == 201
    assert first.header("ETag") is not None
    assert again.header("Idempotent-Replayed") == "true"
    assert lines(again) == lines(first)
    assert count(app, "runs", "e1") == 1


@pytest.mark.parametrize("server", SERVERS)
def test_a_stream_that_fails_before_its_first_byte_releases_the_key(
    served: Callable[[str], AppServer], server: str
) -> None:
    app = served(server)
    for _ in range(2):  # whatever the server made of it (closed, or its 500): never a 201
        answer = attempt(app, "/export?fail_after=0", "x0")
        assert answer is None or answer.status == 500
    assert count(app, "runs", "x0") == 2


@pytest.mark.parametrize("server", SERVERS)
def test_a_stream_that_started_completes_without_its_body(
    served: Callable[[str], AppServer], server: str
) -> None:
    app = served(server)
    whole = post(app, "/export", "x")
    assert (whole.status, whole.body) == (201, b"row 0\nrow 1\nrow 2\n")
    attempt(app, "/export?fail_after=1", "x1")  # the head and a row went out, then it failed
    for key, query in (("x", ""), ("x1", "?fail_after=1")):
        again = post(app, "/export" + query, key)
        assert again.status == 201
        assert again.header("Idempotent-Replayed") == "true"
        assert again.header("Idempotent-Body-Not-Kept") == "true"
        assert count(app, "runs", key) == 1


@pytest.mark.parametrize("body", ["str", "bytes"])
@pytest.mark.parametrize("server", SERVERS)
def test_a_list_body_replays_the_header_lines_first_sent(
    served: Callable[[str], AppServer], server: str, body: str
) -> None:
    app = served(server)
    first, again = post(app, f"/report?as={body}", body), post(app, f"/report?as={body}", body)
    assert first.header("Content-Length") == "20"
    assert again.header("Idempotent-Replayed") == "true"
    assert lines(again) == lines(first)
