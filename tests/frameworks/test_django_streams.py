"""A guarded Django view's ``StreamingHttpResponse``, behind real servers: its record follows
the head the client got.

A WSGI server sends the head with the first non-empty block of the body (PEP 3333), or at the
body's end: a stream that raises before its first byte never gave the client the view's status
(gunicorn closes the connection, runserver and waitress answer 500), so the key is released and
a retry runs, as behind the plain WSGI middleware (whose rule, ``TeeIterable``'s, counts an
empty chunk as no byte, though gunicorn and runserver send the head for one). Django's ASGI
handler sends the head before it pulls the body: the client has the view's status, then a cut
body, so the record keeps the status without the body, as the ASGI middleware keeps any
response whose head went out.

This module is also the servers' URLconf (``ROOT_URLCONF``); its views count their runs per
key in Redis (``{prefix}:runs:{key}``), which the tests read across the server processes. The
last tests run in process, through Django's test ``Client``, which plays a WSGI server.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import path

from idemkey._core import record_for
from idemkey.adapters.django import idempotent
from idemkey.http._scope import NO_CREDENTIALS
from tests._servers import wait_until
from tests.adapters.edge_servers import Raw, read_response
from tests.frameworks.djangoproject import views as project_views
from tests.frameworks.test_django import project, runs, serving
from tests.frameworks.test_django_paths import DJANGO_SERVERS

__all__ = ["project"]  # the fixture, from test_django

pytestmark = pytest.mark.redis

FIRST_ROW = b"id,amount\n"


def _counted(request: HttpRequest) -> None:
    project_views._run(request.headers["Idempotency-Key"])


def _fails() -> Iterator[bytes]:
    raise ConnectionError("the upstream is down")
    yield b""  # a generator: it raises when the server asks for its first chunk


def _empty_then_fails() -> Iterator[bytes]:
    yield b""  # an empty chunk is no byte: the server has sent nothing yet
    raise ConnectionError("the upstream is down")


def _fails_after_a_row() -> Iterator[bytes]:
    yield FIRST_ROW
    raise ConnectionError("the upstream went down")


async def _fails_async() -> AsyncIterator[bytes]:
    raise ConnectionError("the upstream is down")
    yield b""


def _rows() -> Iterator[bytes]:
    yield FIRST_ROW
    yield b"1,5\n"


class Unclosable:
    """Rows from a source with no ``close()``: Django closes a generator before idemkey's
    stream, but what the server leaves unread of this stays in it, for idemkey's drain."""

    def __init__(self, rows: Iterable[bytes | Exception]) -> None:
        self.rows = iter(rows)
        self.pulled = 0
        OPENED.append(self)

    def __iter__(self) -> Unclosable:
        return self

    def __next__(self) -> bytes:
        row = next(self.rows)
        self.pulled += 1
        if isinstance(row, Exception):
            raise row
        return row


#: The views' ``Unclosable`` streams, newest last (the in-process tests read them).
OPENED: list[Unclosable] = []


def _streamed(content: Callable[[], Any]) -> Callable[[HttpRequest], StreamingHttpResponse]:
    @idempotent
    def view(request: HttpRequest) -> StreamingHttpResponse:
        _counted(request)
        return StreamingHttpResponse(content(), content_type="text/csv")

    return view


urlpatterns = [
    path("health", project_views.health),
    path("fails", _streamed(_fails)),
    path("empty-then-fails", _streamed(_empty_then_fails)),
    path("async-fails", _streamed(_fails_async)),
    path("fails-after-a-row", _streamed(_fails_after_a_row)),
    path("rows", _streamed(_rows)),
    path(
        "unclosable-fails",
        _streamed(lambda: Unclosable([b"", ConnectionError("the upstream is down")])),
    ),
    path("unclosable-endless", _streamed(lambda: Unclosable(itertools.repeat(FIRST_ROW)))),
]

#: The streams that raise before their first byte.
BEFORE_THE_FIRST_BYTE = ["/fails", "/empty-then-fails", "/async-fails"]

SETTINGS = f"""
from tests.frameworks.djangoproject.settings import *  # noqa: F403

ROOT_URLCONF = "{__name__}"
"""

#: test_django's and test_django_paths' servers (gunicorn, uvicorn, runserver), and waitress.
STREAM_SERVERS = {
    **DJANGO_SERVERS,
    "waitress-wsgi": [
        "waitress", "--listen=127.0.0.1:PORT", "tests.frameworks.djangoproject.wsgi:application",
    ],
}  # fmt: skip
WSGI_SERVERS = [name for name in STREAM_SERVERS if name.endswith("-wsgi")]


@pytest.fixture(scope="module")
def deployed(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, int], str]]:
    """Each server's port, serving this module's views on one prefix; and that prefix."""
    modules = tmp_path_factory.mktemp("django-streams")
    name = f"idemkey_streams_{uuid.uuid4().hex[:8]}"
    (modules / f"{name}_settings.py").write_text(SETTINGS)
    env = {"DJANGO_SETTINGS_MODULE": f"{name}_settings", "PYTHONPATH": str(modules)}
    prefix = "ds" + uuid.uuid4().hex[:12]
    with contextlib.ExitStack() as stack:
        ports = {}
        for server, command in STREAM_SERVERS.items():
            log = modules / f"{server}.log"
            base = stack.enter_context(serving(command, redis_url, prefix, log, **env))
            ports[server] = urlsplit(base).port or 0
        yield ports, prefix


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    with contextlib.closing(redis.Redis.from_url(redis_url)) as conn:
        yield conn


def _head(target: str, key: str) -> bytes:
    return (
        f"POST {target} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
        f"Idempotency-Key: {key}\r\nContent-Length: 0\r\n\r\n"
    ).encode()


def post(port: int, target: str, key: str) -> bytes:
    """Whatever the server sent for one keyed POST (maybe a cut answer), until it closed."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(_head(target, key))
        with contextlib.suppress(ConnectionResetError):
            while data := sock.recv(65536):
                received += data
    return received


def answer(port: int, target: str, key: str) -> Raw:
    """One keyed POST's whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(_head(target, key))
        return read_response(sock)


def state(client: redis.Redis, prefix: str, target: str, key: str) -> bytes | None:
    """The state of the record of ``key`` on ``target`` (an anonymous request); None: none."""
    record = record_for(prefix, NO_CREDENTIALS, "POST", target, key)
    found: bytes | None = client.hget(record.key, "state")
    return found


def settles(client: redis.Redis, prefix: str, target: str, key: str) -> None:
    wait_until(
        lambda: state(client, prefix, target, key) != b"in_progress", 10, "the record to settle"
    )


@pytest.mark.parametrize("target", BEFORE_THE_FIRST_BYTE)
@pytest.mark.parametrize("server", WSGI_SERVERS)
def test_under_wsgi_a_stream_failing_before_its_first_byte_releases_the_key(
    server: str, target: str, deployed: tuple[dict[str, int], str], client: redis.Redis
) -> None:
    ports, prefix = deployed
    key = f"{server}{target}-{uuid.uuid4().hex[:6]}"
    first = post(ports[server], target, key)
    if target != "/empty-then-fails":  # gunicorn and runserver send the head for b"" too
        assert not first.startswith(b"HTTP/1.1 200"), first  # the client never got the 200
    settles(client, prefix, target, key)
    retry = post(ports[server], target, key)
    assert b"Idempotent-Replayed" not in retry, retry  # it ran again: no success replayed
    assert runs(client, prefix, key) == 2
    settles(client, prefix, target, key)
    assert state(client, prefix, target, key) is None  # released again: no state


@pytest.mark.parametrize("target", BEFORE_THE_FIRST_BYTE)
def test_under_asgi_the_head_went_out_first_so_the_status_is_kept(
    target: str, deployed: tuple[dict[str, int], str], client: redis.Redis
) -> None:
    """Django's ASGI handler sends the head, then pulls the body: the client has the 200."""
    ports, prefix = deployed
    key = f"asgi{target}-{uuid.uuid4().hex[:6]}"
    first = post(ports["uvicorn-asgi"], target, key)
    assert first.startswith(b"HTTP/1.1 200"), first
    settles(client, prefix, target, key)
    retry = answer(ports["uvicorn-asgi"], target, key)
    assert (retry.status, retry.body) == (200, b"")
    assert retry.header("Idempotent-Replayed") == "true"
    assert retry.header("Idempotent-Body-Not-Kept") == "true"
    assert runs(client, prefix, key) == 1


@pytest.mark.parametrize("server", list(STREAM_SERVERS))
def test_a_stream_failing_after_its_first_byte_is_kept_without_its_body(
    server: str, deployed: tuple[dict[str, int], str], client: redis.Redis
) -> None:
    ports, prefix = deployed
    key = f"{server}-late-{uuid.uuid4().hex[:6]}"
    first = post(ports[server], "/fails-after-a-row", key)
    assert first.startswith(b"HTTP/1.1 200"), first
    if server in WSGI_SERVERS:  # under ASGI Django reads a sync stream whole before sending it
        assert FIRST_ROW in first, first
    settles(client, prefix, "/fails-after-a-row", key)
    retry = answer(ports[server], "/fails-after-a-row", key)
    assert (retry.status, retry.body) == (200, b"")
    assert retry.header("Idempotent-Replayed") == "true"
    assert retry.header("Idempotent-Body-Not-Kept") == "true"
    assert retry.header("Content-Type") == "text/csv"
    assert runs(client, prefix, key) == 1


@pytest.mark.parametrize("server", list(STREAM_SERVERS))
def test_a_whole_stream_is_replayed_without_its_body(
    server: str, deployed: tuple[dict[str, int], str], client: redis.Redis
) -> None:
    ports, prefix = deployed
    key = f"{server}-rows-{uuid.uuid4().hex[:6]}"
    first = answer(ports[server], "/rows", key)
    assert (first.status, first.body) == (200, FIRST_ROW + b"1,5\n")
    settles(client, prefix, "/rows", key)
    retry = answer(ports[server], "/rows", key)
    assert (retry.status, retry.body) == (200, b"")
    assert retry.header("Idempotent-Body-Not-Kept") == "true"
    assert runs(client, prefix, key) == 1


# ---- in process: Django's test Client, which plays a WSGI server ----------------------------


class RaisesAfterTheView:
    """Listed above idemkey's middleware: fails after the view returned, so Django answers
    500 and the streamed response never reaches the server."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        self.get_response(request)
        raise RuntimeError("the unit of work could not commit")


@pytest.fixture
def streams(project: dict[str, Any]) -> Iterator[dict[str, Any]]:
    from django.test.utils import override_settings

    with override_settings(ROOT_URLCONF=__name__):
        yield project


def test_the_test_client_releases_a_stream_failing_before_its_first_byte(
    streams: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    from django.test import Client

    headers = {"Idempotency-Key": "c1"}
    for run in (1, 2):
        response = Client().post("/fails", headers=headers)
        assert response.streaming
        with pytest.raises(ConnectionError):
            b"".join(response.streaming_content)
        assert runs(real_client, prefix, "c1") == run  # released: the retry ran
    assert state(real_client, prefix, "/fails", "c1") is None


def test_a_stream_an_outer_middleware_dropped_releases_the_key(
    streams: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    """The response never reached the server (the client got Django's 500): released when
    Django finishes the request, never held by the heartbeat until the process exits."""
    from django.conf import settings
    from django.test import Client
    from django.test.utils import override_settings

    middleware = [f"{__name__}.RaisesAfterTheView", *settings.MIDDLEWARE]
    with override_settings(MIDDLEWARE=middleware):
        for run in (1, 2):
            response = Client(raise_request_exception=False).post(
                "/rows", headers={"Idempotency-Key": "d1"}
            )
            assert response.status_code == 500
            assert runs(real_client, prefix, "d1") == run
    assert state(real_client, prefix, "/rows", "d1") is None


def test_a_stream_closed_unread_completes_as_the_wsgi_middleware_does(
    streams: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    """A server that closes a stream it never read: drained, then completed without the body
    (``TeeIterable.close``); a retry replays its status."""
    from django.test import Client

    headers = {"Idempotency-Key": "u1"}
    Client().post("/rows", headers=headers).close()
    retry = Client().post("/rows", headers=headers)
    assert retry.status_code == 200
    assert retry.headers["Idempotent-Body-Not-Kept"] == "true"
    assert runs(real_client, prefix, "u1") == 1


def test_a_stream_with_no_close_closed_unread_is_drained_to_its_failure(
    streams: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    """Left unread, it still holds its rows: the drain pulls them (past an empty chunk, no
    byte) and meets the failure the server would have, which releases the key."""
    from django.test import Client

    headers = {"Idempotency-Key": "n1"}
    for run in (1, 2):
        Client().post("/unclosable-fails", headers=headers).close()
        assert OPENED[-1].pulled == 2
        assert runs(real_client, prefix, "n1") == run  # released: the retry ran
    assert state(real_client, prefix, "/unclosable-fails", "n1") is None


def test_the_drain_of_a_stream_closed_unread_stops_once_it_completed(
    streams: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    """Its first non-empty chunk completes the record (a stream's body is never kept): more
    pulls would only hold the worker, for up to ``DRAIN_SECONDS``."""
    from django.test import Client

    headers = {"Idempotency-Key": "n2"}
    Client().post("/unclosable-endless", headers=headers).close()
    assert OPENED[-1].pulled == 1
    retry = Client().post("/unclosable-endless", headers=headers)
    assert retry.status_code == 200
    assert retry.headers["Idempotent-Body-Not-Kept"] == "true"
    assert runs(real_client, prefix, "n2") == 1


def test_a_stream_the_test_client_left_unread_stays_claimed_until_read(
    streams: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    """docs/testing.md: the test ``Client`` finishes a streamed request only once the test reads
    its body or closes it, so until then a retry gets 409 (a later request never releases it);
    read, it is replayed."""
    from django.test import Client

    client = Client()
    headers = {"Idempotency-Key": "r1"}
    first = client.post("/rows", headers=headers)
    assert first.status_code == 200  # the view's status; its record is claimed until read
    for _ in range(2):
        assert client.post("/rows", headers=headers).status_code == 409
    assert b"".join(first.streaming_content) == FIRST_ROW + b"1,5\n"
    retry = client.post("/rows", headers=headers)
    assert retry.status_code == 200
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert runs(real_client, prefix, "r1") == 1
