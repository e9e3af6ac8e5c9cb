"""IdempotencyMiddleware for any PEP 3333 app (Flask, Django, Falcon, Bottle, plain callables).

::

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, RedisStore(redis.Redis()), Policy())

A ``ProxyFix``-shaped wrapper that only moves bytes: the order of the steps is the driver's
(``_sync_driver``), every decision ``idemkey.http``'s, the body read as ``_environ`` says and the
response copied as ``_wsgi_response`` says. Body chunks go to the server as the app yields them,
with a copy of at most ``max_response_bytes`` kept. The record completes as soon as the response
is wholly in hand (the block reaching the declared ``Content-Length``, before the server sends
it, else the iterable exhausted), or, if the server closes it early (the client left), after
draining the rest, because the work is done either way; the drain stops past
``max_response_bytes`` or after :data:`DRAIN_SECONDS`, and the record then completes without its
body (``body_kept=False``, as for a streamed or oversized response).
``environ["idemkey.exchange"]`` is the :class:`~idemkey.http.Exchange` while the app runs under
a claim (``.claim.fence`` is the fencing token for downstream writes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import LeaseLostError
from ..http import Response, begin
from ..http._answers import lease_lost
from ..http.routes import KnownRoute, Routes
from ..store import RedisStore
from ._checks import checked_policy, checked_routes, checked_store
from ._environ import EnvironHeaders, path_text, read_body, request_of
from ._sync_driver import Driver
from ._wsgi_response import DRAIN_SECONDS, EXCHANGE_KEY, ClosingBody, TeeIterable, send

if TYPE_CHECKING:
    from collections.abc import Iterable

    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

    from ..policy import Policy

__all__ = ["DRAIN_SECONDS", "EnvironHeaders", "IdempotencyMiddleware"]


class IdempotencyMiddleware:
    """Guard a WSGI app with idempotency keys; ``policy`` defaults to the store's.

    ``routes`` (:class:`~idemkey.routes.Routes`) chooses the guarded paths and their options;
    without it every path is guarded for ``policy.methods``. Requests that are not guarded pass
    straight through: no Redis call, no body read.
    """

    def __init__(
        self,
        app: WSGIApplication,
        store: RedisStore,
        policy: Policy | None = None,
        *,
        routes: Routes | KnownRoute | None = None,
    ) -> None:
        self.app = app
        self.store = store = checked_store(store, RedisStore, "IdempotencyMiddleware(store=...)")
        policy = checked_policy(policy, "IdempotencyMiddleware(policy=...)")
        self.policy = policy if policy is not None else store.policy
        routes = checked_routes(routes, "IdempotencyMiddleware(routes=...)")
        self.routes = routes.bind(self.policy) if routes is not None else None
        self.driver = Driver(store)

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        method = environ["REQUEST_METHOD"].upper()
        if self.routes is None:
            if method not in self.policy.methods:
                return self.app(environ, start_response)  # the cheap path: nothing to look at
            policy, route = self.policy, ""
        else:
            path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
            if not path.isascii():  # PEP 3333's latin-1 text of its bytes: match its text
                path = path_text(path)
            selected = self.routes.select(method, path or "/")
            if selected is None:
                if environ.get("SCRIPT_NAME"):  # behind a prefix, a route written without it
                    selected = self.routes.select_mounted(method, path or "/", mounted(environ))
                if selected is None:
                    return self.app(environ, start_response)
            policy, route = selected.policy, selected.route
        exchange = begin(policy, request_of(environ, route))
        if exchange is None:
            return self.app(environ, start_response)
        if isinstance(exchange, Response):
            return send(start_response, exchange)
        body = read_body(environ, exchange)
        if isinstance(body, Response):
            return send(start_response, body)
        answer = self.driver.claim(exchange)
        if answer is not None:
            return send(start_response, answer)
        if exchange.unprotected:  # Redis is down and the policy says run unprotected
            try:
                return ClosingBody(self.app(environ, start_response), exchange.unprotected_ended)
            except BaseException:
                exchange.unprotected_ended()
                raise
        environ[EXCHANGE_KEY] = exchange  # the app may read its fence: .claim.fence
        tee = TeeIterable(self.driver, exchange, start_response, environ)
        try:
            tee.iterable = self.app(environ, tee.start_response)
        except BaseException as exc:
            self.driver.fail(exchange, "the handler raised")
            if tee.status is None and isinstance(exc, LeaseLostError):  # released: not a 500
                return send(start_response, lease_lost(policy, exc.committed))
            raise
        if tee.ends_with_head:
            tee.take_empty_body()
        return tee


def mounted(environ: WSGIEnvironment) -> str:
    """The path below ``SCRIPT_NAME`` (``PATH_INFO``), as text, for a route written without
    the prefix."""
    path = environ.get("PATH_INFO", "")
    if not path.isascii():
        path = path_text(path)
    return path or "/"
