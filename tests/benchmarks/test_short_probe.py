"""The short-path probe (``benchmarks.short_probe``) answers as the middleware does, at every
level: a first call goes through the middleware (the probe's own claim released first, not a
409), and a replay answers the stored response, marked replayed, without it (never handed on).
Only the ``exchange`` level reports the replay (its ``Exchange`` decides it)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.asyncio

from benchmarks.http_apps import asgi_apps, plain_asgi, plain_wsgi, wsgi_apps
from benchmarks.httpcases import call_asgi, wsgi_environ
from benchmarks.short_probe import LEVELS, PROBE_ENV, asgi_probe, probe_level, wsgi_probe
from idemkey import AsyncRedisStore, Policy, RedisStore
from idemkey.adapters.asgi import IdempotencyMiddleware as AsgiMiddleware
from idemkey.adapters.wsgi import IdempotencyMiddleware as WsgiMiddleware


def test_the_probe_is_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    store = RedisStore(redis.Redis(), Policy(prefix="probe-off"))
    monkeypatch.delenv(PROBE_ENV, raising=False)
    assert isinstance(wsgi_apps(store)[1], WsgiMiddleware)
    monkeypatch.setenv(PROBE_ENV, "shorter")  # no level: the middleware alone
    assert isinstance(wsgi_apps(store)[1], WsgiMiddleware)
    for level in LEVELS:
        monkeypatch.setenv(PROBE_ENV, level)
        assert probe_level({PROBE_ENV: level}) == level
        assert not isinstance(wsgi_apps(store)[1], WsgiMiddleware)


@pytest.mark.parametrize("level", LEVELS)
def test_the_wsgi_probe_runs_a_first_call_once_and_replays_it(
    redis_url: str, prefix: str, level: str
) -> None:
    calls: list[int] = []
    events: list[str] = []

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        calls.append(1)
        return plain_wsgi(environ, start_response)

    policy = Policy(prefix=prefix, on_event=lambda event: events.append(event.kind))
    store = RedisStore(redis.Redis.from_url(redis_url), policy)
    claims: list[int] = []
    claim = store.claim

    def counted_claim(*args: Any, **kwargs: Any) -> Any:
        claims.append(1)
        return claim(*args, **kwargs)

    store.claim = counted_claim  # type: ignore[method-assign]
    middleware = WsgiMiddleware(app, store)
    handed: list[int] = []

    def behind(environ: dict[str, Any], start_response: Any) -> Any:
        handed.append(1)  # the replay must not get here: the probe answers it
        return middleware(environ, start_response)

    probe = wsgi_probe(store, behind, level)
    answers: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        answers.append((status, headers))

    try:
        first = b"".join(probe(wsgi_environ("/o", "k"), start_response))
        again = b"".join(probe(wsgi_environ("/o", "k"), start_response))
    finally:
        store.close()
    assert calls == handed == [1]
    assert again == first
    (status, headers), (replay_status, replay_headers) = answers
    assert status == replay_status == "201 Created"
    assert replay_headers == [*headers, ("Idempotent-Replayed", "true")]
    replays = ["replayed"] if level == "exchange" else []
    assert events == ["claimed", "completed", *replays]
    # The middleware's claim of the first call, and the probe's two at the levels that put
    # the store's claim back.
    assert len(claims) == (1 if level == "short" else 3)


@pytest.mark.parametrize("level", LEVELS)
async def test_the_asgi_probe_runs_a_first_call_once_and_replays_it(
    redis_url: str, prefix: str, level: str
) -> None:
    calls: list[int] = []
    events: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        calls.append(1)
        await plain_asgi(scope, receive, send)

    client = redis.asyncio.Redis.from_url(redis_url)
    policy = Policy(prefix=prefix, on_event=lambda event: events.append(event.kind))
    store = AsyncRedisStore(client, policy)
    claims: list[int] = []
    claim = store.claim

    async def counted_claim(*args: Any, **kwargs: Any) -> Any:
        claims.append(1)
        return await claim(*args, **kwargs)

    store.claim = counted_claim  # type: ignore[method-assign]
    middleware = AsgiMiddleware(app, store)
    handed: list[int] = []

    async def behind(scope: dict[str, Any], receive: Any, send: Any) -> None:
        handed.append(1)
        await middleware(scope, receive, send)

    probe = asgi_probe(store, behind, level)
    try:
        status, headers = await call_asgi(probe, "/o", "k")
        replay_status, replay_headers = await call_asgi(probe, "/o", "k")
        _, unguarded = asgi_apps(store)
    finally:
        await store.aclose()
        await client.aclose()
    assert calls == handed == [1]
    assert status == replay_status == 201
    assert "idempotent-replayed" not in headers
    assert replay_headers == {**headers, "idempotent-replayed": "true"}
    assert isinstance(unguarded, AsgiMiddleware)
    replays = ["replayed"] if level == "exchange" else []
    assert events == ["claimed", "completed", *replays]
    # The middleware's claim of the first call, and the probe's two at the levels that put
    # the store's claim back.
    assert len(claims) == (1 if level == "short" else 3)
