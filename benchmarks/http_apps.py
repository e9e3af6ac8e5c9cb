"""The same trivial app with and without idemkey, for every adapter.

The app reads the request body and answers ``201`` with a small JSON body. ``plain`` is the
app alone; ``guarded`` is the app behind idemkey's adapter. A dispatcher on the path serves
both from one process, so a real server (gunicorn, uvicorn) hosts both and the difference
between them is idemkey's:

    /wsgi/plain   /wsgi/guarded    (idemkey.adapters.wsgi.IdempotencyMiddleware)
    /flask/plain  /flask/guarded   (idemkey.adapters.flask.Idemkey)
    /asgi/plain   /asgi/guarded    (idemkey.adapters.asgi.IdempotencyMiddleware)
    /wsgi/floor   /flask/floor  /asgi/floor   the in-server floor: the same app plus bare
                  EVALSHA claim, and complete when the claim claimed (a first call); the
                  HTTP rows' floor and the throughput floor
    /asgi/glide   /asgi/glide-floor  the same two on a valkey-glide client (when installed)

Servers build the apps from the environment: ``IDEMKEY_BENCH_REDIS_URL`` and
``IDEMKEY_BENCH_PREFIX`` (``gunicorn 'benchmarks.http_apps:make_wsgi()'``,
``uvicorn --factory benchmarks.http_apps:make_asgi``). ``IDEMKEY_BENCH_UNBATCHED=1`` makes the
ASGI store send each script call alone (the lean path before batching), to measure the batch.
``IDEMKEY_BENCH_PROBE=short`` answers the WSGI and ASGI replays through ``short_probe``'s
bound instead of the middleware's layers (issue 39); ``store`` and ``exchange`` put back, in
the probe, the store's claim and the ``Exchange``'s decision (``short_probe.LEVELS``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from typing import Any

import redis
import redis.asyncio
from redis.exceptions import NoScriptError

from idemkey import AsyncRedisStore, Policy, RedisStore
from idemkey._codec import StoredResponse, encode_response
from idemkey._core import owner_tag
from idemkey.store import SCRIPTS
from idemkey.store._base import SCRIPT_KEYS

from .short_probe import asgi_probe, probe_level, wsgi_probe

__all__ = [
    "BODY",
    "asgi_apps",
    "flask_apps",
    "floor_wsgi",
    "make_asgi",
    "make_wsgi",
    "plain_asgi",
    "plain_wsgi",
    "wsgi_apps",
]

BODY = b'{"id":"ch_3Mtw","status":"succeeded","amount":1999}'
_HEADERS = [("Content-Type", "application/json"), ("Content-Length", str(len(BODY)))]
_ASGI_START = {
    "type": "http.response.start",
    "status": 201,
    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY))],
}
_ASGI_BODY = {"type": "http.response.body", "body": BODY, "more_body": False}

WSGIApp = Callable[[dict[str, Any], Any], Iterable[bytes]]


def policy(prefix: str) -> Policy:
    return Policy(prefix=prefix, ttl=900.0, lease=30.0)


def plain_wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    environ["wsgi.input"].read(length)
    start_response("201 Created", _HEADERS)
    return [BODY]


async def plain_asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send(_ASGI_START)
    await send(_ASGI_BODY)


def wsgi_apps(store: RedisStore) -> tuple[WSGIApp, WSGIApp]:
    """(plain, guarded) WSGI apps; raises ImportError when the adapter is missing."""
    from idemkey.adapters.wsgi import IdempotencyMiddleware

    guarded = IdempotencyMiddleware(plain_wsgi, store)  # type: ignore[arg-type]
    level = probe_level(os.environ)
    if level is not None:
        guarded = wsgi_probe(store, guarded, level)
    return plain_wsgi, guarded


def flask_apps(store: RedisStore) -> WSGIApp:
    """One Flask app with ``/flask/plain`` and ``/flask/guarded`` (the same view body)."""
    from flask import Flask, request

    from idemkey.adapters.flask import Idemkey

    app = Flask("idemkey_bench")
    idem = Idemkey(app, store=store)

    def view() -> tuple[bytes, int, dict[str, str]]:
        request.get_data()
        return BODY, 201, {"Content-Type": "application/json"}

    app.add_url_rule("/flask/plain", "plain", view, methods=["POST"])
    app.add_url_rule("/flask/guarded", "guarded", idem.idempotent(view), methods=["POST"])
    claim, complete = _floor_calls(store)

    def floor_view() -> tuple[bytes, int, dict[str, str]]:
        record = claim(request.headers.get("Idempotency-Key", "").encode())
        answer = view()
        complete(record)
        return answer

    app.add_url_rule("/flask/floor", "floor", floor_view, methods=["POST"])
    return app  # type: ignore[return-value]


def asgi_apps(store: AsyncRedisStore) -> tuple[Any, Any]:
    """(plain, guarded) ASGI apps; raises ImportError when the adapter is missing."""
    from idemkey.adapters.asgi import IdempotencyMiddleware

    guarded = IdempotencyMiddleware(plain_asgi, store)
    level = probe_level(os.environ)
    if level is not None:
        guarded = asgi_probe(store, guarded, level)
    return plain_asgi, guarded


def _health_wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Length", "2")])
    return [b"ok"]


def _not_found(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("404 Not Found", [("Content-Length", "0")])
    return []


def make_wsgi() -> WSGIApp:
    """The gunicorn app: every WSGI-side route, configured from the environment."""
    url = os.environ["IDEMKEY_BENCH_REDIS_URL"]
    store = RedisStore(redis.Redis.from_url(url), policy(os.environ["IDEMKEY_BENCH_PREFIX"]))
    routes: dict[str, WSGIApp] = {"/health": _health_wsgi}
    try:
        plain, guarded = wsgi_apps(store)
        routes["/wsgi/plain"], routes["/wsgi/guarded"] = plain, guarded
        routes["/wsgi/floor"] = floor_wsgi(store)
    except ImportError:
        pass
    try:
        flask_app = flask_apps(store)
        routes["/flask/plain"] = routes["/flask/guarded"] = routes["/flask/floor"] = flask_app
    except ImportError:
        pass

    def dispatch(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        return routes.get(environ.get("PATH_INFO", ""), _not_found)(environ, start_response)

    return dispatch


class _FloorArgs:
    """The floor's arguments, every one but the key fixed in advance (one for all floors)."""

    def __init__(
        self, store: RedisStore | AsyncRedisStore, label: bytes = b"floor", text: bool = False
    ) -> None:
        """``label`` names the floor's records; ``text``: the numbers as strings (glide takes
        no int argument)."""
        scripts = store._scripts
        self.claim_sha, self.complete_sha = scripts["claim"].sha, scripts["complete"].sha
        policy = store.policy
        self.lease_ms: int | str = policy.lease_ms
        self.ttl_ms: int | str = policy.ttl_ms
        if text:
            self.lease_ms, self.ttl_ms = str(self.lease_ms), str(self.ttl_ms)
        self.fp, self.owner = "f" * 32, "o" * 32
        self.tag = owner_tag(self.owner)
        status = (("content-type", "application/json"),)
        self.stored = encode_response(StoredResponse(201, status, BODY))
        self.prefix = policy.prefix.encode()
        self.label = label

    def claim(self, key: bytes) -> tuple[bytes, Any, Any, Any, Any]:
        record = b"%b:%b:{%b}" % (self.prefix, self.label, key)
        return record, self.fp, self.owner, self.lease_ms, self.ttl_ms

    def complete(self, record: bytes) -> tuple[bytes, Any, Any, Any, Any]:
        return record, self.owner, self.stored, self.ttl_ms, self.tag


def _floor_calls(
    store: RedisStore,
) -> tuple[Callable[[bytes], bytes | None], Callable[[bytes | None], None]]:
    """The sync floor's two steps: ``claim(key)`` -> the record when the claim claimed (a
    first call) else None (a replay), and ``complete(record)``, which does nothing on None."""
    client, scripts, args = store.client, store._scripts, _FloorArgs(store)

    def evalsha(name: str, sha: str, call: tuple[Any, ...]) -> Any:
        try:
            return client.execute_command("EVALSHA", sha, 1, *call)
        except NoScriptError:
            return scripts[name](call[:1], call[1:])

    def claim(key: bytes) -> bytes | None:
        call = args.claim(key)
        reply = evalsha("claim", args.claim_sha, call)
        return call[0] if reply[0] == 1 else None

    def complete(record: bytes | None) -> None:
        if record is not None:
            evalsha("complete", args.complete_sha, args.complete(record))

    return claim, complete


def floor_wsgi(store: RedisStore) -> WSGIApp:
    """The WSGI app alone plus the bare floor, in the server that runs it: claim before it,
    and complete after it when the claim claimed (a new key) - one claim for a replay.

    Bare ``EVALSHA`` of idemkey's own scripts with every argument but the key fixed in
    advance: what any correct design must add to a request, without idemkey's code, and what
    a user would hand-write (answering the stored response is left out: the app answers).
    """
    claim, complete = _floor_calls(store)

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        record = claim(environ.get("HTTP_IDEMPOTENCY_KEY", "").encode())
        body = plain_wsgi(environ, start_response)
        complete(record)
        return body

    return app


def floor_asgi(client: Any, store: AsyncRedisStore) -> Any:
    """:func:`floor_wsgi` for ASGI: claim before the app, complete after its answer is sent
    when the claim claimed."""
    scripts, args = store._scripts, _FloorArgs(store)

    async def evalsha(name: str, sha: str, call: tuple[Any, ...]) -> Any:
        try:
            return await client.execute_command("EVALSHA", sha, 1, *call)
        except NoScriptError:
            return await scripts[name](call[:1], call[1:])

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        key = next((v for k, v in scope["headers"] if k == b"idempotency-key"), b"")
        call = args.claim(key)
        reply = await evalsha("claim", args.claim_sha, call)
        await plain_asgi(scope, receive, send)
        if reply[0] == 1:
            await evalsha("complete", args.complete_sha, args.complete(call[0]))

    return app


def glide_asgi(url: str, prefix: str) -> tuple[Any, Any]:
    """(guarded, floor) ASGI apps on one valkey-glide client: ``/asgi/glide`` is idemkey's
    middleware on an AsyncRedisStore over glide, ``/asgi/glide-floor`` the app plus bare
    ``invoke_script`` claim and complete (glide's own floor). glide's client is made with an
    await, on the server's event loop: both are built at their first request. ImportError
    without valkey-glide."""
    import asyncio

    import glide

    from .glide_bench import glide_config

    built: dict[str, Any] = {}
    lock = asyncio.Lock()

    async def build() -> dict[str, Any]:
        async with lock:
            if not built:
                client = await glide.GlideClient.create(glide_config(url))
                store = AsyncRedisStore(client, policy(prefix))
                built["guarded"] = asgi_apps(store)[1]
                built["floor"] = glide_floor_asgi(client, store)
        return built

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await (built or await build())["guarded"](scope, receive, send)

    async def floor(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await (built or await build())["floor"](scope, receive, send)

    return guarded, floor


def glide_floor_asgi(client: Any, store: AsyncRedisStore) -> Any:
    """:func:`floor_asgi` on glide: bare ``invoke_script`` (glide loads on NOSCRIPT)."""
    import glide

    claim, complete = glide.Script(SCRIPTS["claim"]), glide.Script(SCRIPTS["complete"])
    args = _FloorArgs(store, label=b"gfloor", text=True)

    async def invoke(script: Any, call: tuple[Any, ...]) -> Any:
        # Split as the store splits a call (SCRIPT_KEYS), so the floor follows the scripts.
        keys, rest = call[:SCRIPT_KEYS], call[SCRIPT_KEYS:]
        return await client.invoke_script(script, keys=list(keys), args=list(rest))

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        key = next((v for k, v in scope["headers"] if k == b"idempotency-key"), b"")
        call = args.claim(key)
        reply = await invoke(claim, call)
        await plain_asgi(scope, receive, send)
        if reply[0] == 1:  # claimed (as in floor_asgi)
            await invoke(complete, args.complete(call[0]))

    return app


def make_asgi() -> Any:
    """The uvicorn app: ``/asgi/plain``, ``/asgi/floor``, ``/asgi/guarded`` and ``/health``."""
    url = os.environ["IDEMKEY_BENCH_REDIS_URL"]
    # Under the 64-client throughput run a request's claim and the previous request's
    # completion (sent after the response) can both hold a connection: redis-py's asyncio
    # pool raises MaxConnectionsError past 100 instead of waiting, so allow more.
    client = redis.asyncio.Redis.from_url(url, max_connections=512)
    store = AsyncRedisStore(client, policy(os.environ["IDEMKEY_BENCH_PREFIX"]))
    if os.environ.get("IDEMKEY_BENCH_UNBATCHED") == "1":
        from idemkey.store._base import evalsha_packer
        from idemkey.store._concurrency._async_lean import Lean

        pack = evalsha_packer(client.connection_pool)
        assert pack is not None, "IDEMKEY_BENCH_UNBATCHED needs a client the lean path takes"
        store._evalsha = Lean(client, pack).evalsha  # type: ignore[method-assign]
    plain, guarded = asgi_apps(store)

    async def health(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b"ok"})

    routes = {
        "/asgi/plain": plain,
        "/asgi/floor": floor_asgi(client, store),
        "/asgi/guarded": guarded,
        "/health": health,
    }
    with contextlib.suppress(ImportError):  # without valkey-glide: no glide routes
        routes["/asgi/glide"], routes["/asgi/glide-floor"] = glide_asgi(
            url, os.environ["IDEMKEY_BENCH_PREFIX"]
        )

    async def dispatch(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await routes.get(scope["path"], health)(scope, receive, send)

    return dispatch
