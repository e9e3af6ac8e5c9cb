"""A path whose bytes are not UTF-8, through Django behind real servers: Django's WSGI handler
reads such a byte as ``%E9`` (``repercent_broken_unicode``), its ASGI handler as U+FFFD, as
every other deployment does. One request must fingerprint one way under all of them: a retry
that crosses Django's two handlers (one Redis) is the first answer, and Django fingerprints the
request as the plain WSGI middleware does.

gunicorn, uvicorn (and waitress, granian, hypercorn, daphne) refuse a raw byte past ASCII in
the request target (400): the raw form goes through Django's own ``runserver``, which takes
it, the percent-encoded form through gunicorn and uvicorn.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import pytest
import redis

from idemkey._core import OWNER_TAG_LENGTH, fingerprint
from tests._servers import wait_until
from tests.adapters.edge_servers import Raw, Server, read_response, started_on_demand
from tests.adapters.test_edges_replay import _json_post
from tests.frameworks.test_django import SERVERS, project, serving

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

__all__ = ["project"]  # the fixture, from test_django

pytestmark = pytest.mark.redis

#: The test project's settings, routing ``/orders/<charge_id>`` to its guarded ``refund``
#: view (it counts its runs in Redis).
SETTINGS = """
from tests.frameworks.djangoproject.settings import *  # noqa: F403

ROOT_URLCONF = "{urls}"
"""
URLS = """
from django.urls import path

from tests.frameworks.djangoproject import views

urlpatterns = [path("health", views.health), path("orders/<str:charge_id>", views.refund)]
"""
#: test_django's servers, and Django's WSGI development server, which takes a raw byte past
#: ASCII in the request target.
DJANGO_SERVERS = {
    **SERVERS,
    "runserver-wsgi": ["django", "runserver", "--noreload", "--skip-checks", "127.0.0.1:PORT"],
}

#: One request target each: its é sent raw (one latin-1 character here, one byte on the wire)
#: or percent-encoded; a path that is not UTF-8, and two that are (``%25E9`` is the text
#: ``%E9``, which must stay what it was).
RAW, PERCENT = "/orders/caf\xe9", "/orders/caf%E9"
UTF8_RAW, UTF8 = "/orders/caf\xc3\xa9", "/orders/caf%C3%A9"
ESCAPED = "/orders/caf%25E9"
BODY = b'{"amount": 10}'


@dataclass
class Deployment:
    """Django behind one real server, on the prefix every Django deployment here shares."""

    port: int
    prefix: str

    def post(self, target: str, key: str) -> Raw:
        lines = [
            f"POST {target} HTTP/1.1", "Host: t", "Connection: close", f"Idempotency-Key: {key}",
            "Content-Type: application/json", f"Content-Length: {len(BODY)}",
        ]  # fmt: skip
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        with socket.create_connection(("127.0.0.1", self.port), timeout=15) as sock:
            sock.sendall(head + BODY)
            return read_response(sock)


@pytest.fixture(scope="module")
def django(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Deployment]]:
    """Django behind gunicorn and runserver (WSGI) and uvicorn (ASGI), one prefix."""
    modules = tmp_path_factory.mktemp("django-paths")
    name = f"idemkey_paths_{uuid.uuid4().hex[:8]}"
    (modules / f"{name}_urls.py").write_text(URLS)
    (modules / f"{name}_settings.py").write_text(SETTINGS.format(urls=f"{name}_urls"))
    env = {"DJANGO_SETTINGS_MODULE": f"{name}_settings", "PYTHONPATH": str(modules)}
    prefix = "dp" + uuid.uuid4().hex[:12]
    with contextlib.ExitStack() as stack:
        deployments = {}
        for server, command in DJANGO_SERVERS.items():
            log = modules / f"{server}.log"
            base = stack.enter_context(serving(command, redis_url, prefix, log, **env))
            deployments[server] = Deployment(urlsplit(base).port or 0, prefix)
        yield deployments


@pytest.fixture(scope="module")
def plain(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str, str], Server]]:
    """The plain WSGI middleware (tests/adapters/edge_apps.py) behind a real server."""
    yield from started_on_demand(redis_url, tmp_path_factory)


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    with contextlib.closing(redis.Redis.from_url(redis_url)) as conn:
        yield conn


Reply = TypeVar("Reply")


def stored(
    client: redis.Redis, prefix: str, send: Callable[[str], Reply], key: str
) -> tuple[Reply, bytes]:
    """``send(key)``'s answer, and its record's fingerprint once the record holds the answer
    (behind uvicorn the client may read it first), without its owner's tag."""
    before = set(client.scan_iter(match=f"{prefix}:{{*"))
    reply = send(key)
    found = wait_until(
        lambda: set(client.scan_iter(match=f"{prefix}:{{*")) - before, 10, "a new record"
    )
    (record,) = found
    wait_until(lambda: client.hget(record, "resp"), 10, "the record's response")
    kept = client.hget(record, "fp")
    assert kept is not None
    return reply, kept[:-OWNER_TAG_LENGTH]


def new_key() -> str:
    return "k" + uuid.uuid4().hex[:16]


def runs(client: redis.Redis, prefix: str) -> int:
    return int(client.get(f"{prefix}:runs:refund") or 0)


#: (first deployment, its target), then (the retry's, its target): the same request.
CROSSINGS = {
    "not-utf8-gunicorn-then-uvicorn": (("gunicorn-wsgi", PERCENT), ("uvicorn-asgi", PERCENT)),
    "not-utf8-uvicorn-then-gunicorn": (("uvicorn-asgi", PERCENT), ("gunicorn-wsgi", PERCENT)),
    "not-utf8-raw-runserver-then-uvicorn": (("runserver-wsgi", RAW), ("uvicorn-asgi", PERCENT)),
    "not-utf8-uvicorn-then-raw-runserver": (("uvicorn-asgi", PERCENT), ("runserver-wsgi", RAW)),
    "utf8-gunicorn-then-uvicorn": (("gunicorn-wsgi", UTF8), ("uvicorn-asgi", UTF8)),
    "utf8-raw-runserver-then-uvicorn": (("runserver-wsgi", UTF8_RAW), ("uvicorn-asgi", UTF8)),
    "escaped-gunicorn-then-uvicorn": (("gunicorn-wsgi", ESCAPED), ("uvicorn-asgi", ESCAPED)),
    "escaped-runserver-then-gunicorn": (("runserver-wsgi", ESCAPED), ("gunicorn-wsgi", ESCAPED)),
}


@pytest.mark.parametrize(("first", "retry"), list(CROSSINGS.values()), ids=list(CROSSINGS))
def test_a_retry_that_crosses_djangos_wsgi_and_asgi_handlers_replays(
    first: tuple[str, str],
    retry: tuple[str, str],
    django: dict[str, Deployment],
    client: redis.Redis,
) -> None:
    """The record is named by the route (``/orders/<str:charge_id>``) under both handlers and
    the fingerprint covers the path: ``/orders/caf%E9`` under WSGI against
    ``/orders/caf\\ufffd`` under ASGI made the crossing retry a 422 ``key_reused``."""
    (server, target), (retry_server, retry_target) = first, retry
    prefix = django[server].prefix
    ran = runs(client, prefix)
    key = new_key()
    reply, _ = stored(client, prefix, functools.partial(django[server].post, target), key)
    assert reply.status == 200, reply
    again = django[retry_server].post(retry_target, key)
    assert (again.status, again.header("Idempotent-Replayed")) == (200, "true"), again
    assert again.body == reply.body
    assert runs(client, prefix) == ran + 1


#: (Django's server, its target), then the target the plain WSGI middleware behind gunicorn
#: is sent: the same request. (werkzeug's server takes a raw byte too, but reads the target's
#: latin-1 text as UTF-8: ``caf\xe9`` comes out as ``café``.)
SAME_FINGERPRINT = {
    "not-utf8-gunicorn": (("gunicorn-wsgi", PERCENT), PERCENT),
    "not-utf8-uvicorn": (("uvicorn-asgi", PERCENT), PERCENT),
    "not-utf8-raw-runserver": (("runserver-wsgi", RAW), PERCENT),
    "utf8-gunicorn": (("gunicorn-wsgi", UTF8), UTF8),
    "utf8-raw-runserver": (("runserver-wsgi", UTF8_RAW), UTF8),
    "escaped-gunicorn": (("gunicorn-wsgi", ESCAPED), ESCAPED),
    "escaped-runserver": (("runserver-wsgi", ESCAPED), ESCAPED),
}


@pytest.mark.parametrize(
    ("first", "plain_target"), list(SAME_FINGERPRINT.values()), ids=list(SAME_FINGERPRINT)
)
def test_django_fingerprints_a_path_as_the_wsgi_middleware_does(
    first: tuple[str, str],
    plain_target: str,
    django: dict[str, Deployment],
    plain: Callable[[str, str], Server],
    client: redis.Redis,
) -> None:
    """One request (method, path, content type, body) behind Django and behind the plain
    WSGI middleware: one fingerprint."""
    (server, target), middleware = first, plain("gunicorn", "wsgi")
    deployment = django[server]
    reply, by_django = stored(
        client, deployment.prefix, functools.partial(deployment.post, target), new_key()
    )
    assert reply.status == 200, reply
    reply, by_middleware = stored(
        client,
        middleware.prefix,
        lambda key: middleware.post(plain_target, BODY, _json_post(key)),
        new_key(),
    )
    assert reply.status == 201, reply
    assert by_django == by_middleware


#: target, SCRIPT_NAME (None: FORCE_SCRIPT_NAME = "/forced"), the path fingerprinted: the
#: bytes that are not UTF-8 as U+FFFD, joined to the script prefix as ``request.path`` joins
#: them; any other path as ``request.path`` gives it.
SCRIPT_PATHS = [
    (PERCENT, "", "/orders/caf\ufffd"),
    (PERCENT, "/shop", "/shop/orders/caf\ufffd"),
    (PERCENT, "/shop/", "/shop/orders/caf\ufffd"),
    (PERCENT, None, "/forced/orders/caf\ufffd"),
    ("/orders/%25E9%E9", "/shop", "/shop/orders/%E9\ufffd"),
    ("/orders/caf%C3%A9%E9", "", "/orders/caf\xe9\ufffd"),
    (UTF8, "/shop/", "/shop/orders/caf\xe9"),
    (ESCAPED, "/shop", "/shop/orders/caf%E9"),
    ("/orders/cafe", "/shop/", "/shop/orders/cafe"),
]


@pytest.mark.parametrize(("target", "script_name", "path"), SCRIPT_PATHS)
def test_the_wsgi_handler_fingerprints_the_path_with_its_script_prefix(
    target: str,
    script_name: str | None,
    path: str,
    project: dict[str, Any],
    real_client: redis.Redis,
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Django's test Client is its WSGI handler; the fingerprint is computed here."""
    from django.test import Client
    from django.test.utils import override_settings

    module = f"idemkey_paths_urls_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(URLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    forced = "/forced" if script_name is None else None
    environ = {"SCRIPT_NAME": script_name} if script_name else {}

    def send(key: str) -> Any:
        headers = {"Idempotency-Key": key}
        return Client().post(target, BODY, "application/json", headers=headers, **environ)

    with override_settings(ROOT_URLCONF=module, FORCE_SCRIPT_NAME=forced):
        reply, kept = stored(real_client, prefix, send, new_key())
    assert reply.status_code == 200, reply.content
    assert kept == fingerprint("POST", path, "", "application/json", BODY)
