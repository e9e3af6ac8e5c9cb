"""An upper bound for a replay answered before the ``Exchange`` exists (issue 39's way forward).

``IDEMKEY_BENCH_PROBE=short python -m benchmarks`` puts one of these in front of the WSGI and
ASGI middlewares, in process and inside gunicorn and uvicorn (``http_apps``): a replay is
answered by idemkey's own checks written as one function (:func:`wsgi_probe`, which is also
``least.checks_for`` with nothing behind it, and its ASGI twin), with no ``Exchange``, no
transitions, no driver and no ``store.claim``; any other answer of the claim releases it and
hands the request to the middleware, so first calls are slower under the probe (a claim and
a release more) and are not what it measures.

It is a bound, not a design: it sends the script without the store's handling of a dropped
connection or a moving slot (NOSCRIPT only: the store loads the script), does not refuse a
body shorter than its Content-Length, and assumes a whole ASGI body in one message. What a
real short path costs lies between it and the middleware.

Two more levels put back what a short path that keeps one place for each decision would
run, one group at a time (:data:`LEVELS`): ``store`` sends the claim through ``store.claim``
(NOSCRIPT, a dropped connection, a moving slot, a wait for a claim in flight, the heartbeat,
durable effects), and ``exchange`` does that and has the replay decided by an ``Exchange``
built where the claim left it (``Exchange.decide``: the ``replayed`` event, the 500 of an
unreadable record), timed as the driver times it. What ``exchange`` costs over ``short`` is
what keeping those decisions in one place costs a short path; what the middleware costs over
``exchange`` is the rest of its layers (``begin``'s frame, ``read_body``, ``received``,
``claiming``, the driver).
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from time import perf_counter
from typing import Any

from redis.exceptions import NoScriptError

from idemkey import AsyncRedisStore, RedisStore
from idemkey._codec import decode_response
from idemkey._core import Replay, decode_claim_reply, new_owner, parse_key, record_for
from idemkey._core import record_origin as origin_of
from idemkey.adapters._asgi_messages import ReplayReceive, respond
from idemkey.adapters._environ import capture, request_of
from idemkey.adapters._wsgi_response import send
from idemkey.http import Exchange, Headers, Request, parse_content_length
from idemkey.http._answers import replayed
from idemkey.http._fingerprint import request_fingerprint
from idemkey.http._scope import default_scope
from idemkey.http._transitions import State
from idemkey.http.routes import ROUTE_UNKNOWN

__all__ = ["LEVELS", "PROBE_ENV", "asgi_probe", "probe_level", "wsgi_probe"]

#: One of :data:`LEVELS`: the HTTP benchmark's guarded WSGI and ASGI apps answer replays
#: through the probe at that level.
PROBE_ENV = "IDEMKEY_BENCH_PROBE"
#: ``short``: the bound; ``store``: its claim through ``store.claim``; ``exchange``: that, and
#: the replay decided by an ``Exchange`` (see the module docstring).
LEVELS = ("short", "store", "exchange")


def probe_level(environ: Mapping[str, str]) -> str | None:
    """The probe's level the environment asks for, or None (the middleware alone)."""
    level = environ.get(PROBE_ENV)
    return level if level in LEVELS else None


def wsgi_probe(store: RedisStore, middleware: Any, level: str = "short") -> Any:
    """``middleware``'s WSGI app, a replay answered in one function (at ``level``)."""
    policy, evalsha, sha = store.policy, store._evalsha, store._scripts["claim"].sha
    header, strict, limit = policy.header, policy.strict_header, policy.max_request_bytes
    keep, expired = store.keep_uncertain, policy.grace_ms > 0

    def probe(environ: dict[str, Any], start_response: Any) -> Any:
        request = request_of(environ)
        key = parse_key(request.headers.get_all(header)[0], strict=strict)
        scope = default_scope(request, header)
        record = record_for(policy.prefix, scope, request.method, request.path, key)
        body = capture(environ, limit)
        if not isinstance(body, bytes):
            return middleware(environ, start_response)
        sent = request_fingerprint(policy, request, body)
        owner = new_owner()
        origin = origin_of(scope, request.method, request.path, key)
        if level == "short":
            args = (record.record_key, sent, owner, policy.lease_ms, policy.ttl_ms, 0, 0, origin)
            try:
                reply = evalsha(sha, args)
            except NoScriptError:  # a server that never saw the script: the store loads it
                reply = store._eval("claim", *args)
            decision = decode_claim_reply(reply, owner)
        else:
            started = perf_counter()
            decision = store.claim(
                record,
                sent,
                owner=owner,
                lease_ms=policy.lease_ms,
                ttl_ms=policy.ttl_ms,
                wait=policy.wait,
                expired=expired,
                origin=origin,
            )
            seconds = perf_counter() - started
        if type(decision) is not Replay:
            store.release(record, owner)
            environ["wsgi.input"] = io.BytesIO(body)
            return middleware(environ, start_response)
        if level == "exchange":
            declared = parse_content_length(environ.get("CONTENT_LENGTH"))
            # The Exchange the middleware holds once its claim went out.
            # fmt: off
            exchange = Exchange(
                policy, request, key, scope, request.method, request.path, ROUTE_UNKNOWN, record,
                policy.on_event, declared,
                keep=keep, state=State.CLAIMING, owner=owner, origin=origin, _fingerprint=sent,
            )
            # fmt: on
            answer = exchange.decide(decision, seconds)
            assert answer is not None  # a replay's answer
            return send(start_response, answer)
        return send(start_response, replayed(policy, decode_response(decision.response)))

    return probe


def asgi_probe(store: AsyncRedisStore, middleware: Any, level: str = "short") -> Any:
    """``middleware``'s ASGI app, a replay answered in one coroutine (at ``level``)."""
    policy, sha = store.policy, store._scripts["claim"].sha
    header, strict = policy.header, policy.strict_header
    keep, expired = store.keep_uncertain, policy.grace_ms > 0

    async def probe(scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = Headers.from_latin1(scope["headers"])
        query = scope.get("query_string", b"").decode("latin-1")
        request = Request(scope["method"], scope["path"], query, headers, "")
        key = parse_key(headers.get_all(header)[0], strict=strict)
        whose = default_scope(request, header)
        record = record_for(policy.prefix, whose, request.method, request.path, key)
        message = await receive()
        body = message.get("body", b"")
        sent = request_fingerprint(policy, request, body)
        owner = new_owner()
        origin = origin_of(whose, request.method, request.path, key)
        if level == "short":
            args = (record.record_key, sent, owner, policy.lease_ms, policy.ttl_ms, 0, 0, origin)
            try:
                reply = await store._evalsha(sha, args)
            except NoScriptError:
                reply = await store._eval("claim", *args)
            decision = decode_claim_reply(reply, owner)
        else:
            started = perf_counter()
            decision = await store.claim(
                record,
                sent,
                owner=owner,
                lease_ms=policy.lease_ms,
                ttl_ms=policy.ttl_ms,
                wait=policy.wait,
                expired=expired,
                origin=origin,
            )
            seconds = perf_counter() - started
        if type(decision) is not Replay:
            await store.release(record, owner)
            await middleware(scope, ReplayReceive(body, receive), send)
            return
        if level == "exchange":
            declared = parse_content_length(headers.get("content-length"))
            # The Exchange the middleware holds once its claim went out.
            # fmt: off
            exchange = Exchange(
                policy, request, key, whose, request.method, request.path, ROUTE_UNKNOWN, record,
                policy.on_event, declared,
                keep=keep, state=State.CLAIMING, owner=owner, origin=origin, _fingerprint=sent,
            )
            # fmt: on
            answer = exchange.decide(decision, seconds)
            assert answer is not None  # a replay's answer
            await respond(send, answer)
            return
        await respond(send, replayed(policy, decode_response(decision.response)))

    return probe
