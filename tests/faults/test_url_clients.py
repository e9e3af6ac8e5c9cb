"""Clients idemkey builds from a URL, against a Redis that accepts connections and never answers.

Flask's ``IDEMKEY_REDIS_URL``, Django's ``IDEMKEY["REDIS_URL"]`` and the CLI's ``--redis-url``,
each configured as the README shows and nothing more. On redis-py 5.0.1 (the floor pyproject
allows; ``nox -s lowest_core`` runs this file on it) such a client had no timeouts: a request
waited for the black hole forever, and a view that had run never got its response out, since
Flask writes the completion first; its client timed out, retried, got 409, and after the lease
the work ran again.

Each request runs in a thread with a deadline, so a hang fails the test instead of stalling the
run; then the black hole is closed (its connections reset) and the thread ends.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from flask import Flask

from idemkey.adapters.flask import Idemkey
from idemkey.store._url import URL_CLIENT_OPTIONS, client_from_url
from tests.faults._proxy import FaultProxy

if TYPE_CHECKING:
    from tests._servers import ExternalRedis, RedisServer

T = TypeVar("T")

#: Seconds a request may take against a black hole: the read timeout (1 s) twice (redis-py 8
#: retries once; 5.0.1 not at all), with room for a loaded machine.
BOUND = 4.0


class BlackHole:
    """A TCP listener that never accepts: the kernel completes connections from its backlog,
    takes the bytes sent and never answers. ``close()`` resets those connections."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port: int = self._sock.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def black_hole() -> Iterator[BlackHole]:
    hole = BlackHole()
    try:
        yield hole
    finally:
        hole.close()


def within(bound: float, call: Callable[[], T], unblock: Callable[[], None]) -> tuple[T, float]:
    """``call()``'s value and its duration; fails when it has not returned after ``bound``
    seconds (then ``unblock()`` frees it, so no thread is left behind)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            outcome["value"] = call()
        except BaseException as exc:  # re-raised in the test's thread
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound)
    if thread.is_alive():
        unblock()
        thread.join(10)
        pytest.fail(f"no answer within {bound:g} s: the request hung on a Redis that never replies")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"], outcome["seconds"]


def readme_flask_app(url: str, prefix: str, view: Callable[[], Any] | None = None) -> Flask:
    """The README's Flask app: ``IDEMKEY_REDIS_URL`` and a prefix, nothing tuned."""
    idem = Idemkey()
    app = Flask(__name__)

    @app.post("/charges")
    @idem.idempotent
    def create_charge() -> Any:
        if view is not None:
            view()
        return {"id": "ch_1"}, 201

    app.config["IDEMKEY_REDIS_URL"] = url
    app.config["IDEMKEY_PREFIX"] = prefix
    idem.init_app(app)
    return app


def test_url_options_win_over_the_defaults() -> None:
    client = client_from_url("redis://127.0.0.1:6379/0?socket_timeout=7&socket_connect_timeout=3")
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (7.0, 3.0)
    default = client_from_url("redis://127.0.0.1:6379/0").connection_pool.connection_kwargs
    assert {name: default[name] for name in URL_CLIENT_OPTIONS} == URL_CLIENT_OPTIONS


#: URLs redis-py parses but no connection can use (audit 53): on main each was accepted, and the
#: first request failed (a 500 and a traceback in Flask), or '/abc' silently used db 0.
UNUSABLE = {
    "db-not-a-number": ("redis://127.0.0.1:{port}/abc", "database"),
    "db-negative": ("redis://127.0.0.1:{port}/-1", "database"),
    "db-query-negative": ("redis://127.0.0.1:{port}/?db=-1", "database"),
    "db-too-large": ("redis://127.0.0.1:{port}/99999999999", "database"),
    "timeout-typo": ("redis://127.0.0.1:{port}/0?sockettimeout=2", "sockettimeout"),
    "unknown-option": ("redis://127.0.0.1:{port}/0?db=5&foo=bar", "foo"),
    "timeout-negative": ("redis://127.0.0.1:{port}/0?socket_timeout=-1", "socket_timeout"),
    "timeout-zero": ("redis://127.0.0.1:{port}/0?socket_connect_timeout=0", "socket_connect"),
    "timeout-infinite": ("redis://127.0.0.1:{port}/0?socket_timeout=inf", "socket_timeout"),
    "protocol": ("redis://127.0.0.1:{port}/0?protocol=9", "protocol"),
    "ssl-flag": ("rediss://127.0.0.1:{port}/0?ssl_cert_reqs=bogus", "bogus"),
    "unix-no-path": ("unix://", "socket's path"),
}


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A port that listens and never accepts: a client that connected would sit in its backlog."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    try:
        yield sock
    finally:
        sock.close()


def nobody_connected(sock: socket.socket) -> bool:
    try:
        sock.accept()[0].close()
    except BlockingIOError:
        return True
    return False


@pytest.mark.parametrize("kind", ["sync", "asyncio", "cluster"])
@pytest.mark.parametrize(("url", "says"), UNUSABLE.values(), ids=UNUSABLE.keys())
def test_a_url_no_connection_can_use_is_refused_when_the_client_is_made(
    listener: socket.socket, url: str, says: str, kind: str
) -> None:
    from idemkey import ConfigurationError

    port = listener.getsockname()[1]
    with pytest.raises(ConfigurationError, match=f"IDEMKEY_REDIS_URL cannot be used: .*{says}"):
        client_from_url(
            url.format(port=port),
            asyncio=kind == "asyncio",
            cluster=kind == "cluster",
            source="IDEMKEY_REDIS_URL",
        )
    assert nobody_connected(listener)


@pytest.mark.parametrize("url", [6379, None, b"redis://127.0.0.1:6379/0"], ids=repr)
def test_a_url_that_is_not_a_string_is_refused(url: object) -> None:
    from idemkey import ConfigurationError

    # On main: AttributeError ('int' object has no attribute 'lower') or a TypeError.
    with pytest.raises(ConfigurationError, match="IDEMKEY_REDIS_URL cannot be used: expected a"):
        client_from_url(url, source="IDEMKEY_REDIS_URL")  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_usable_urls_are_accepted_without_connecting(listener: socket.socket, kind: str) -> None:
    port = listener.getsockname()[1]
    for url, db in [
        (f"redis://127.0.0.1:{port}", 0),
        (f"redis://127.0.0.1:{port}/", 0),
        (f"redis://127.0.0.1:{port}/3", 3),
        (f"redis://127.0.0.1:{port}/?db=2&socket_timeout=0.5&health_check_interval=10", 2),
        (f"rediss://127.0.0.1:{port}/1?ssl_cert_reqs=none", 1),
        ("unix:///tmp/idemkey-none.sock?db=4", 4),
    ]:
        client = client_from_url(url, asyncio=kind == "asyncio")
        assert client.connection_pool.connection_kwargs.get("db", 0) == db
    assert nobody_connected(listener)


def test_flask_refuses_an_unusable_url_at_init_app() -> None:
    from idemkey import ConfigurationError

    app = Flask(__name__)
    app.config["IDEMKEY_REDIS_URL"] = "redis://127.0.0.1:6379/0?socket_timeout=-1"
    with pytest.raises(ConfigurationError, match="IDEMKEY_REDIS_URL cannot be used"):
        Idemkey(app)


def test_flask_url_client_answers_503_from_a_black_hole(black_hole: BlackHole, prefix: str) -> None:
    app = readme_flask_app(black_hole.url, prefix)
    client = app.test_client()
    try:
        response, seconds = within(
            BOUND,
            lambda: client.post("/charges", json={"amount": 5}, headers={"Idempotency-Key": "k"}),
            black_hole.close,
        )
    finally:
        app.extensions["idemkey"].store.client.close()
    assert response.status_code == 503, response.get_data(as_text=True)
    assert response.json["code"] == "store_unavailable"
    assert seconds < BOUND


@pytest.mark.redis
def test_flask_view_that_ran_gets_its_response_out(
    redis_server: RedisServer | ExternalRedis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis answers the claim, then goes silent while the view runs: the completion cannot be
    written, and the response the view produced goes out all the same, within the bound."""
    with FaultProxy(redis_server.host, redis_server.port) as proxy:
        ran: list[int] = []

        def view() -> None:
            ran.append(1)
            proxy.blackhole()

        app = readme_flask_app(f"redis://{proxy.host}:{proxy.port}/0", prefix, view)
        client = app.test_client()
        try:
            with caplog.at_level(logging.WARNING, logger="idemkey"):
                response, seconds = within(
                    BOUND,
                    lambda: client.post("/charges", json={}, headers={"Idempotency-Key": "k"}),
                    proxy.close,
                )
        finally:
            app.extensions["idemkey"].store.client.close()
    assert ran == [1]
    assert response.status_code == 201
    assert response.json == {"id": "ch_1"}
    assert seconds < BOUND
    assert any(getattr(r, "idemkey_event", None) == "store_error" for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]


def test_django_redis_url_answers_503_from_a_black_hole(black_hole: BlackHole, prefix: str) -> None:
    from django.test import Client
    from django.test.utils import override_settings

    from tests.adapters.harness_wsgi import _django

    _django()  # settings configured once per process, shared with the adapter harnesses
    settings = {
        "ROOT_URLCONF": __name__,
        "MIDDLEWARE": ["idemkey.adapters.django.IdempotencyMiddleware"],
        "IDEMKEY": {"REDIS_URL": black_hole.url, "PREFIX": prefix},  # the README's settings
    }
    with override_settings(**settings):
        client = Client()
        response, seconds = within(
            BOUND,
            lambda: client.post(
                "/charges", b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="k"
            ),
            black_hole.close,
        )
    assert response.status_code == 503, response.content
    assert seconds < BOUND


#: ``python -m idemkey ARGS`` (``sys.exit(main())``), with the seconds ``main`` took printed as
#: stdout's last line: the clock starts once the interpreter is up and idemkey imported, which
#: on a loaded two-core box took over 2 s of the command's 6.4 s.
_TIMED_MAIN = """\
import sys, time
from idemkey.cli import main
started = time.monotonic()
try:
    code = main(sys.argv[1:])
finally:
    print(f"\\n{time.monotonic() - started}")
sys.exit(code)
"""


def test_cli_redis_url_fails_fast_on_a_black_hole(black_hole: BlackHole) -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", _TIMED_MAIN, "doctor", "--redis-url", black_hole.url],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("idemkey doctor still waits for a Redis that never replies after 30 s")
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    seconds = float(done.stdout.strip().splitlines()[-1])
    assert seconds < BOUND, done.stdout


def _charge(request: Any) -> Any:
    from django.http import JsonResponse

    return JsonResponse({"id": "ch_1"}, status=201)


def __getattr__(name: str) -> Any:
    if name == "urlpatterns":  # ROOT_URLCONF: built lazily, so importing this needs no Django
        from django.urls import path

        from idemkey.adapters.django import idempotent

        return [path("charges", idempotent(_charge))]
    raise AttributeError(name)
