"""The harness contract every adapter test runs through, and the app logic they all share.

An adapter suite is one parametrized suite (``tests/adapters/test_suite.py``) run against
every entry of ``HARNESSES`` (``tests/adapters/conftest.py``). A harness is one web app, built
with one framework, guarded by one idemkey adapter, and driven through that framework's real
interface (WSGI environ / ASGI scope), in-process.

Every harness app implements the same routes, and answers them identically because each
route's answer is computed by :class:`Backend` below; the framework app only translates.

==================  ======  ============================================================
route               status  behaviour (``executions[name]`` counts handler runs)
==================  ======  ============================================================
POST /charges       201     "charges": body ``{"amount": n}``; JSON
                            ``{"id": "ch_<seq>", "amount": n}`` where ``seq`` is this
                            run's number (1, 2, ...); headers Content-Type
                            application/json, X-Charge-Id ch_<seq>, Set-Cookie
                            session=s<seq>, Date (set by the app). A body that is not
                            such JSON: 400 (released).
POST /refunds       201     "refunds": same shape, ids ``rf_<seq>``
PATCH /charges/1    200     "patch": same shape, ids ``pa_<seq>``
GET /charges        200     "list"
PUT /charges/1      200     "put"
DELETE /charges/1   204     "delete" (empty body)
POST /explode       -       "explode": raises RuntimeError
POST /fail500       500     "fail500"
POST /declined      402     "declined": JSON
POST /status/<code> <code>  "status": small JSON body
POST /slow          201     "slow": waits on ``gate`` (deadline 10 s), then answers
POST /big           201     "big": body of ``policy.max_response_bytes + 1`` bytes
POST /stream        200     "stream": streaming response of 3 chunks, no Content-Length
POST /matrix/<k>    varies  "matrix": one response class per ``MATRIX`` kind (JSON, HTML,
                            file, redirect, no content, two Set-Cookie, two Link lines)
==================  ======  ============================================================

Driving convention for ``Harness.request``: the harness sends ``Content-Length`` for the body
unless ``headers`` contain ``Transfer-Encoding: chunked``; then it sends the body without a
length (chunked). Several header lines with one name are sent as several lines (a WSGI
harness joins them with ", " as a PEP 3333 server does). ``Reply.headers`` holds every response
header line in order, as sent by the adapter.
"""

from __future__ import annotations

import collections
import contextlib
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from email.utils import formatdate
from typing import TYPE_CHECKING, NamedTuple, Protocol

import fakeredis
import pytest
import redis
import redis.asyncio

from idemkey import RedisStore
from tests._servers import no_async_retry, no_retry

if TYPE_CHECKING:
    from idemkey import Policy

__all__ = [
    "MATRIX",
    "STREAM_CHUNKS",
    "Answer",
    "Backend",
    "Harness",
    "HarnessFactory",
    "Reply",
    "Stream",
    "async_redis",
    "sync_redis",
]

GATE_TIMEOUT = 10.0
STREAM_CHUNKS = (b"chunk-0\n", b"chunk-1\n", b"chunk-2\n")
_PREFIXES = {"charges": "ch", "refunds": "rf", "patch": "pa"}

#: The harnesses a decision-only row of the shared suite runs on: the bare WSGI middleware and
#: the bare ASGI middleware, one per driver. A decision (a 400, 409, 413 or 422, an outcome
#: stored or released, an event) is made once, in the sans-IO exchange, whichever adapter carries
#: it; each adapter's part of it (handing over the key, method, path, query, headers and body,
#: sending a problem back) is checked on every harness by the rows that stay there, and what an
#: adapter does with bytes, headers and streams stays on every harness.
DECISION_HARNESSES = ("wsgi", "starlette")

#: Marks a row of the shared suite as decision-only: it runs on :data:`DECISION_HARNESSES`
#: (with real Redis) instead of on every harness in tests/adapters/conftest.py.
decision_only = pytest.mark.parametrize(
    "harness_kind",
    [
        pytest.param((name, "redis"), id=name, marks=pytest.mark.redis)
        for name in DECISION_HARNESSES
    ],
    indirect=True,
)


@dataclass
class Reply:
    """A response as the client saw it."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or None."""
        low = name.lower()
        for key, value in self.headers:
            if key.lower() == low:
                return value
        return None

    def header_all(self, name: str) -> list[str]:
        low = name.lower()
        return [value for key, value in self.headers if key.lower() == low]

    def json(self) -> object:
        return json.loads(self.body)


class Harness(Protocol):
    """One guarded app and a client for it (see the module docstring)."""

    name: str
    executions: collections.Counter[str]
    gate: threading.Event

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        body: bytes = b"",
    ) -> Reply:
        """Send one request through the framework's real interface; sync and thread-safe."""
        ...

    def close(self) -> None: ...


#: ``factory(redis_url, policy)``: ``redis_url`` None means a fresh fakeredis server.
HarnessFactory = Callable[["str | None", "Policy"], Harness]


@dataclass(frozen=True)
class Answer:
    """What a route answers, before a framework turns it into a response."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


class Stream(NamedTuple):
    """A streaming answer: send ``chunks`` one by one, without a Content-Length.

    A NamedTuple, so ``status, headers, chunks = backend.stream()`` works too.
    """

    status: int
    headers: list[tuple[str, str]]
    chunks: Iterator[bytes]


def _chunks() -> Iterator[bytes]:
    yield from STREAM_CHUNKS


#: A harness URL with this scheme gets a valkey-py client (its ``from_url`` reads it; redis-py
#: has no such scheme), so the shared suite can run an adapter on valkey-py as users do.
VALKEY_PY_SCHEME = "valkey://"
#: A harness URL with this scheme gets a valkey-glide client (asyncio harnesses only): the
#: store wraps it in its facade (idemkey/store/_glide.py).
GLIDE_SCHEME = "glide://"


def sync_redis(url: str | None) -> redis.Redis:
    """The client a harness store uses: fakeredis[lua] when ``url`` is None, else ``url``
    (valkey-py's for a ``valkey://`` URL, redis-py's otherwise).

    No retries and short timeouts, so the "Redis is down" rows answer at once.
    """
    if url is None:
        return fakeredis.FakeRedis(server=fakeredis.FakeServer(version=(7, 0)))
    if url.startswith(VALKEY_PY_SCHEME):
        import valkey
        from valkey.backoff import NoBackoff
        from valkey.retry import Retry

        client: redis.Redis = valkey.Valkey.from_url(
            url, socket_connect_timeout=2, socket_timeout=5, retry=Retry(NoBackoff(), 0)
        )
        return client
    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5, retry=no_retry())


@contextlib.contextmanager
def store_on(url: str | None, policy: Policy) -> Iterator[RedisStore]:
    """A sync store on :func:`sync_redis` for a test: closed after it, and on a real server
    (``url``) the keys under ``policy.prefix`` deleted."""
    store = RedisStore(sync_redis(url), policy)
    try:
        yield store
    finally:
        store.close()
        store.client.close()
        if url:
            from tests.conftest import _purge_prefix

            _purge_prefix(url, policy.prefix)


def async_redis(url: str | None) -> redis.asyncio.Redis:
    """The asyncio twin of :func:`sync_redis`."""
    if url is None:
        return fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer(version=(7, 0)))
    if url.startswith(VALKEY_PY_SCHEME):
        import valkey.asyncio
        from valkey.asyncio.retry import Retry
        from valkey.backoff import NoBackoff

        client: redis.asyncio.Redis = valkey.asyncio.Valkey.from_url(
            url, socket_connect_timeout=2, socket_timeout=5, retry=Retry(NoBackoff(), 0)
        )
        return client
    return redis.asyncio.Redis.from_url(
        url, socket_connect_timeout=2, socket_timeout=5, retry=no_async_retry()
    )


class Backend:
    """The business logic behind every harness app: counts runs and builds the answers.

    Apps call one method per route and translate the :class:`Answer` into their framework's
    response (keeping every header, in order). ``explode`` raises; ``stream_chunks`` is the
    body of POST /stream, to be sent as a streaming response.
    """

    def __init__(self, max_response_bytes: int) -> None:
        self.executions: collections.Counter[str] = collections.Counter()
        self.gate = threading.Event()
        self.max_response_bytes = max_response_bytes
        self._lock = threading.Lock()

    def count(self, name: str) -> int:
        """Record one handler run of ``name``; returns its sequence number (1, 2, ...)."""
        with self._lock:
            self.executions[name] += 1
            return self.executions[name]

    # Routes.

    def charge(self, name: str, body: bytes, status: int = 201) -> Answer:
        """POST /charges ("charges"), POST /refunds ("refunds"), PATCH /charges/1 ("patch")."""
        seq = self.count(name)
        try:
            amount = json.loads(body)["amount"]
            if not isinstance(amount, int):
                raise TypeError(amount)
        except (ValueError, KeyError, TypeError):
            return _json(400, {"error": 'body must be {"amount": <int>}'})
        ident = f"{_PREFIXES[name]}_{seq}"
        return _json(
            status,
            {"id": ident, "amount": amount},
            [
                ("X-Charge-Id", ident),
                ("Set-Cookie", f"session=s{seq}; Path=/"),
                ("Date", formatdate(usegmt=True)),
            ],
        )

    def simple(self, name: str, status: int) -> Answer:
        """GET /charges, PUT /charges/1, DELETE /charges/1, /fail500, /declined, /status/<c>."""
        seq = self.count(name)
        if status == 204:
            return Answer(204, [], b"")
        return _json(status, {"route": name, "run": seq})

    def explode(self) -> Answer:
        self.count("explode")
        raise RuntimeError("the handler exploded")

    def slow(self) -> Answer:
        seq = self.count("slow")
        if not self.gate.wait(GATE_TIMEOUT):
            return _json(504, {"error": "gate never opened"})
        return _json(201, {"route": "slow", "run": seq})

    def big(self) -> Answer:
        self.count("big")
        body = b"x" * (self.max_response_bytes + 1)
        return Answer(201, [("Content-Type", "application/octet-stream")], body)

    def stream(self) -> Stream:
        """POST /stream: status, headers and a generator of the 3 chunks (no length)."""
        self.count("stream")
        return Stream(200, [("Content-Type", "text/plain"), ("X-Stream", "yes")], _chunks())

    def matrix(self, kind: str) -> Answer:
        """POST /matrix/<kind>: the response class ``kind`` of :data:`MATRIX`."""
        seq = self.count("matrix")
        status, headers, body = MATRIX[kind]
        return Answer(status, [*headers, ("X-Run", str(seq))], body)

    def dispatch(self, method: str, path: str, body: bytes) -> Answer | Stream:
        """The whole route table, for apps without a router of their own (plain WSGI/ASGI).

        Unknown paths answer 404, known paths with another method 405.
        """
        if path.startswith("/matrix/") and method == "POST":
            kind = path.removeprefix("/matrix/")
            if kind in MATRIX:
                return self.matrix(kind)
        if path.startswith("/status/") and method == "POST":
            code = path.removeprefix("/status/")
            if code.isdigit() and 200 <= int(code) <= 599:
                return self.simple("status", int(code))
        routes: dict[str, dict[str, Callable[[], Answer | Stream]]] = {
            "/charges": {
                "POST": lambda: self.charge("charges", body),
                "GET": lambda: self.simple("list", 200),
            },
            "/charges/1": {
                "PATCH": lambda: self.charge("patch", body, 200),
                "PUT": lambda: self.simple("put", 200),
                "DELETE": lambda: self.simple("delete", 204),
            },
            "/refunds": {"POST": lambda: self.charge("refunds", body)},
            "/explode": {"POST": self.explode},
            "/fail500": {"POST": lambda: self.simple("fail500", 500)},
            "/declined": {"POST": lambda: self.simple("declined", 402)},
            "/slow": {"POST": self.slow},
            "/big": {"POST": self.big},
            "/stream": {"POST": self.stream},
        }
        methods = routes.get(path)
        if methods is None:
            return _json(404, {"error": "not found"})
        handler = methods.get(method)
        if handler is None:
            return _json(405, {"error": "method not allowed"})
        return handler()


#: The response classes a replay must reproduce: kind -> (status, headers, body).
MATRIX: dict[str, tuple[int, list[tuple[str, str]], bytes]] = {
    "json": (201, [("Content-Type", "application/json"), ("Location", "/charges/ch_1")],
             b'{"id":"ch_1","amount":10}'),
    "html": (200, [("Content-Type", "text/html; charset=utf-8")], b"<p>Paid &amp; done</p>"),
    "file": (200, [("Content-Type", "application/pdf"),
                   ("Content-Disposition", 'attachment; filename="receipt.pdf"')],
             b"%PDF-1.4\n\x00\x01\xff binary\r\n%%EOF"),
    "redirect": (303, [("Content-Type", "text/html; charset=utf-8"),
                       ("Location", "/charges/ch_1")], b'<a href="/charges/ch_1">ch_1</a>'),
    "no-content": (204, [], b""),
    "cookies": (201, [("Content-Type", "application/json"), ("Set-Cookie", "a=1; Path=/"),
                      ("Set-Cookie", "b=2; Path=/; HttpOnly")], b'{"id":"ch_2"}'),
    "links": (200, [("Content-Type", "application/json"), ("Link", "</p/2>; rel=next"),
                    ("Link", "</p/9>; rel=last")], b"[]"),
}  # fmt: skip


def _json(status: int, payload: object, extra: Sequence[tuple[str, str]] = ()) -> Answer:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return Answer(status, [("Content-Type", "application/json"), *extra], body)
