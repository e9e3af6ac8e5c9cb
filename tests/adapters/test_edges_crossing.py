"""Two deployments over one Redis, through real servers: a request answered behind one server
and retried behind another (a move from uvicorn to gunicorn, or WSGI and ASGI deployments that
share a Redis) is the first answer again, never a server's failure and never a second run.

Every server here shares one prefix, so a request and its retry meet in one record whatever
server each reaches; each handler counts its runs in Redis, under that prefix too.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import TYPE_CHECKING

import pytest
import redis

from idemkey._codec import decode_response
from tests.adapters.edge_servers import Raw, Server, started_on_demand
from tests.adapters.test_edges_replay import _json_post, completed_record, new_key, outcome

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def deployments(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str, str], Server]]:
    """``deployments(server, app)``: started once per module, all on one shared prefix."""
    yield from started_on_demand(redis_url, tmp_path_factory, "x" + uuid.uuid4().hex[:12])


def name(deployment: tuple[str, str]) -> str:
    return "-".join(deployment)


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    with contextlib.closing(redis.Redis.from_url(redis_url)) as conn:
        yield conn


def answered(server: Server, path: str, key: str, client: redis.Redis) -> Raw:
    """The first answer to ``POST path``, once its record holds it: behind an ASGI server the
    client may read the answer before the record completes (a retry then is 409 in_flight)."""
    before = set(client.scan_iter(match=f"{server.prefix}:{{*"))
    reply = server.post(path, b'{"amount": 10}', _json_post(key))
    completed_record(client, server, before)
    return reply


#: The servers that send a value with a control byte (granian's WSGI interface drops the line
#: without a word, its ASGI interface answers 500), each the first deployment of an answer
#: gunicorn then replays.
WRITERS = [
    ("werkzeug", "wsgi"),
    ("waitress", "wsgi"),
    ("granian", "wsgi"),
    ("uvicorn", "asgi"),
    ("hypercorn", "asgi"),
    ("daphne", "asgi"),
    ("granian", "asgi"),
]


@pytest.mark.parametrize("writer", WRITERS, ids=name)
def test_an_answer_with_a_control_byte_replays_on_gunicorn(
    writer: tuple[str, str], deployments: Callable[[str, str], Server], client: redis.Redis
) -> None:
    """gunicorn refuses a value or reason phrase with a control character but HTAB (500),
    which the writer's server sent: the record keeps the answer without those lines and
    with the standard phrase, so gunicorn replays it on every retry."""
    first, gunicorn = deployments(*writer), deployments("gunicorn", "wsgi")
    key = new_key()
    before = set(client.scan_iter(match=f"{first.prefix}:{{*"))
    # The first answer as the writer's server sends it (granian's ASGI interface: 500).
    assert outcome(first, "/control", key) == ("500" if writer == ("granian", "asgi") else "201")
    stored = client.hget(completed_record(client, first, before), "resp")
    for _ in range(2):
        replay = gunicorn.post("/control", b"{}", _json_post(key))
        assert (replay.status, replay.header("Idempotent-Replayed")) == (201, "true"), replay
        assert replay.header("X-Note") is None
        assert replay.header("X-Del") is None
        assert replay.reason == "Created"
    assert first.runs(key) == 1
    assert stored is not None
    head = decode_response(stored)
    assert head.reason == ""
    assert [field for field, _ in head.headers if field.lower() in ("x-note", "x-del")] == []


#: Pairs of deployments, the first answers, the second gets the retry: each kind of WSGI
#: server beside each kind of ASGI server, both ways, and werkzeug's beside gunicorn (their
#: PATH_INFO differ for a path that is not UTF-8: werkzeug decodes, then encodes, U+FFFD).
CROSSINGS = [
    (("gunicorn", "wsgi"), ("uvicorn", "asgi")),
    (("uvicorn", "asgi"), ("werkzeug", "wsgi")),
    (("waitress", "wsgi"), ("hypercorn", "asgi")),
    (("daphne", "asgi"), ("granian", "wsgi")),
    (("granian", "asgi"), ("waitress", "wsgi")),
    (("gunicorn", "wsgi"), ("werkzeug", "wsgi")),
]
PATHS = {"utf-8": "/caf%C3%A9s", "not-utf-8": "/caf%E9s"}


@pytest.mark.parametrize("path", list(PATHS.values()), ids=list(PATHS))
@pytest.mark.parametrize(
    ("first", "retry"), CROSSINGS, ids=[f"{name(a)}-then-{name(b)}" for a, b in CROSSINGS]
)
def test_a_non_ascii_path_retried_on_another_server_replays(
    first: tuple[str, str],
    retry: tuple[str, str],
    path: str,
    deployments: Callable[[str, str], Server],
    client: redis.Redis,
) -> None:
    """A WSGI server hands the path over as PEP 3333's latin-1 text of its bytes, an ASGI
    server as text: one request must name one record and fingerprint one way under both."""
    key = new_key()
    reply = answered(deployments(*first), path, key, client)
    assert reply.status == 201, reply
    again = deployments(*retry).post(path, b'{"amount": 10}', _json_post(key))
    assert (again.status, again.header("Idempotent-Replayed")) == (201, "true"), again
    assert again.body == reply.body
    assert deployments(*first).runs(key) == 1


def test_a_flask_route_with_a_non_ascii_path_replays_behind_an_asgi_server(
    deployments: Callable[[str, str], Server], client: redis.Redis
) -> None:
    """Flask names the record by its rule (``/cafés``), the ASGI middleware by the path: one
    record, and the Flask extension fingerprints the path as the ASGI one does."""
    key = new_key()
    flask = deployments("werkzeug", "flask")
    assert answered(flask, PATHS["utf-8"], key, client).status == 201
    again = deployments("uvicorn", "asgi").post(PATHS["utf-8"], b'{"amount": 10}', _json_post(key))
    assert (again.status, again.header("Idempotent-Replayed")) == (201, "true"), again
    assert flask.runs(key) == 1


ROUTED = [
    ("gunicorn", "wsgi_routes"),
    ("werkzeug", "wsgi_routes"),
    ("waitress", "wsgi_routes"),
    ("granian", "wsgi_routes"),
    ("uvicorn", "asgi_routes"),
]


@pytest.mark.parametrize("deployment", ROUTED, ids=name)
@pytest.mark.parametrize("path", ["/caf%C3%A9s", "/men%C3%BCs/th%C3%A9"])
def test_a_non_ascii_route_is_guarded_on_every_server(
    deployment: tuple[str, str],
    path: str,
    deployments: Callable[[str, str], Server],
    client: redis.Redis,
) -> None:
    """``Routes(route("/cafés"), route("/menüs/{item}"))``: the retry is the replay under
    every server, as under ASGI; a path outside the routes passes through (runs again)."""
    server = deployments(*deployment)
    key = new_key()
    assert answered(server, path, key, client).status == 201
    again = server.post(path, b'{"amount": 10}', _json_post(key))
    assert (again.status, again.header("Idempotent-Replayed")) == (201, "true"), again
    assert server.runs(key) == 1
    other = new_key()
    for _ in range(2):
        reply = server.post("/charges", b"{}", _json_post(other))
        assert reply.header("Idempotent-Replayed") is None, reply
    assert server.runs(other) == 2
