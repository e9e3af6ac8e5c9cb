"""The Flask extension: ``Idemkey(app=None, store=None, policy=None)`` and ``@idem.idempotent``.

::

    idem = Idemkey()                       # app factory: no app, no store stored on the module
    def create_app():
        app = Flask(__name__)
        app.config["IDEMKEY_REDIS_URL"] = "redis://localhost:6379/0"
        idem.init_app(app)
        return app

    @bp.post("/charges")
    @idem.idempotent                       # or @idem.idempotent(required=False, wait=2.0)
    def create_charge(): ...

An app factory that takes a store (``create_app(store=None)``, as a test passes one) hands it
on with ``idem.init_app(app, store=store)``: that app's store, ahead of the constructor's.
Configuration, when no ``store`` is passed: ``IDEMKEY_REDIS_URL`` (required then) and one
``IDEMKEY_<FIELD>`` key per :class:`~idemkey.Policy` field (``IDEMKEY_TTL``, ``IDEMKEY_PREFIX``,
...); a ``policy`` passed in is used as it is. Every option, config key or view keyword, is
typed and checked once (``IDEMKEY_METHODS = "POST"`` is a ``ConfigurationError``, not the set
``{'P', 'O', 'S', 'T'}``), and an ``IDEMKEY_`` key that is no field is refused
(``IDEMKEY_REDIS_URL`` is the client's, and carries its password, database and timeouts; any
other ``IDEMKEY_REDIS_*`` key is refused too). Per app: ``app.extensions["idemkey"]``; per
request: ``g.idemkey``, on every request a guarded view gets: the
:class:`~idemkey.http.Exchange` while the view runs under a claim (``.claim.fence`` is the
fencing token), else None (no key with ``required=False``, a method the policy does not guard,
or Redis down with ``on_store_error="open"``). ``idemkey.current_call()`` is the claim in
every adapter (it raises ``LookupError`` where ``g.idemkey`` is None, but for Redis down under
``"open"``: a call with no fence, which ``fenced()`` refuses with ``UnprotectedCallError``).
One ``Idemkey`` serves any number of apps.

``init_app`` wraps ``app.wsgi_app`` in a WSGI layer that reads a keyed request's body before
Flask runs any hook and hands Flask the same bytes, so the fingerprint covers what the client
sent even when a ``before_request`` hook parses ``request.form`` first. The body is read and
checked by the WSGI middleware's reader (``_environ``). The record's route is the URL rule
template; the view's answer, as ``make_response`` builds it, is stored once the response
has left Flask, and released if Flask sends its 500 instead (an ``after_request`` hook or a
teardown that failed: ``_flask_settle``); ``after_request`` hooks run on first answers and
replays alike. A streamed response completes without its body at its first byte, and is
released if it fails before it; a file the server sends itself (``send_file``) completes
without its body at once. A view that raises releases the key. A guarded view called from
inside another settles its own record (a stream as it is sent), or, on the outer view's
record (a route delegating to it), runs under the outer view's claim. ``@idem.idempotent``
goes below the route decorator: written above it, the app is refused at its first request.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

try:
    from flask import current_app, g, got_request_exception, request
except ImportError as exc:
    raise ImportError(
        "idemkey.adapters.flask needs Flask: pip install 'idemkey-redis[flask]'"
    ) from exc

from ..errors import ConfigurationError, LeaseLostError
from ..http import Response, begin
from ..http._answers import lease_lost
from ..store import RedisStore
from ._checks import checked_policy, checked_store
from ._environ import BODY_KEY, read_body, read_werkzeug_body, request_of
from ._flask_config import AppState, BodyCapture, app_state, capture_rule, view_overrides
from ._flask_response import as_sent, body_of, render_view, respond
from ._flask_settle import (
    NESTED_KEY,
    SETTLE_KEY,
    Pending,
    complete,
    release_unsent,
    released_by_flask,
    settle_nested,
)

if TYPE_CHECKING:
    from flask import Flask
    from flask.typing import ResponseReturnValue

    from ..http import Exchange
    from ..policy import Policy
    from ._sync_driver import Driver

__all__ = ["Idemkey"]

F = TypeVar("F", bound=Callable[..., Any])


class Idemkey:
    """Idempotency keys for Flask views; see the module docstring."""

    def __init__(
        self,
        app: Flask | None = None,
        store: RedisStore | None = None,
        policy: Policy | None = None,
    ) -> None:
        self.store = _checked(store, "Idemkey(store=...)")
        self.policy = checked_policy(policy, "Idemkey(policy=...)")
        self._overrides: list[dict[str, Any]] = []  # every view's Policy changes, for capture
        self._guards: list[Callable[..., Any]] = []  # every guarded view, for their order
        # Every app served, for that order too; weakly: an app factory's apps may come and go.
        self._apps: weakref.WeakSet[Flask] = weakref.WeakSet()
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask, store: RedisStore | None = None) -> None:
        """Configure idemkey for ``app`` from the constructor's arguments and ``app.config``.

        ``store`` is this app's store (an app factory's ``create_app(store=...)``, a test's
        ``idemkey_store``); it wins over the constructor's and over ``IDEMKEY_REDIS_URL``.
        """
        chosen = _checked(store, "init_app(store=...)") if store is not None else self.store
        app.extensions["idemkey"] = state = app_state(app.config, chosen, self.policy)
        capture_rule(state.policy, self._overrides)  # every view's policy now: a bad one fails here
        # The rules are read at the first request (the decorators' order), when all are added.
        state.endpoints = app.view_functions
        self._apps.add(app)
        state.apps = self._apps
        # Capture a keyed body before Flask runs a hook that may consume it (request.form), and
        # settle a guarded view's answer once Flask has sent it.
        app.wsgi_app = BodyCapture(app.wsgi_app, state, self._overrides, self._guards)  # type: ignore[method-assign]
        got_request_exception.connect(released_by_flask, app)

    @overload
    def idempotent(self, view: F, /) -> F: ...
    @overload
    def idempotent(self, /, *, required: bool = ..., **overrides: Any) -> Callable[[F], F]: ...
    def idempotent(self, view: F | None = None, /, **overrides: Any) -> F | Callable[[F], F]:
        """Guard a view: ``@idem.idempotent`` or ``@idem.idempotent(required=False, wait=2)``.

        ``required`` is ``Policy.require_key``; any other keyword is a Policy field for this
        view only.
        """
        overrides = view_overrides(overrides)
        if overrides:
            self._overrides.append(overrides)

        def decorate(view: F) -> F:
            run: Callable[..., Any] = view
            if inspect.iscoroutinefunction(view):
                # Flask runs an async view through app.ensure_sync, but it sees the sync
                # wrapper below: the view is run so here (a coroutine returned was a 500).
                def run(*args: Any, **kwargs: Any) -> Any:
                    return current_app.ensure_sync(view)(*args, **kwargs)

            @functools.wraps(view)
            def guarded(*args: Any, **kwargs: Any) -> ResponseReturnValue:
                app = current_app._get_current_object()  # type: ignore[attr-defined]
                state: AppState | None = app.extensions.get("idemkey")
                if state is None:
                    raise ConfigurationError("Idemkey.init_app(app) was not called for this app")
                policy = state.policy_for(id(guarded), overrides) if overrides else state.policy
                return _guard(app, state.driver, policy, run, args, kwargs)

            self._guards.append(guarded)
            return guarded  # type: ignore[return-value]

        return decorate(view) if view is not None else decorate


def _guard(
    app: Flask, driver: Driver, policy: Policy, view: Callable[..., Any], args: Any, kwargs: Any
) -> ResponseReturnValue:
    req = request._get_current_object()  # type: ignore[attr-defined]  # one proxy lookup
    if req.method not in policy.methods:
        return _unclaimed(view, args, kwargs)
    environ = req.environ
    rule = req.url_rule
    exchange = begin(policy, request_of(environ, rule.rule if rule is not None else ""))
    if exchange is None:
        return _unclaimed(view, args, kwargs)
    if isinstance(exchange, Response):
        return respond(app, exchange)
    # Captured by the layer init_app put around wsgi_app: read_body takes it as it is;
    # without it, read_werkzeug_body first checks that nothing consumed the stream.
    if BODY_KEY in environ:
        body = read_body(environ, exchange)
    else:  # or an outer guarded view of this request read it (and popped it)
        if environ.get(SETTLE_KEY) and _same_record(exchange):
            # The outer view's record (a route delegating to another guarded view, a view
            # calling itself): the same work, run under the outer view's claim. Its own claim
            # would find the outer's and answer 409 for as long as the outer holds it.
            return view(*args, **kwargs)  # type: ignore[no-any-return]
        body = read_werkzeug_body(req, exchange)
    if isinstance(body, Response):
        return respond(app, body)
    answer = driver.claim(exchange)
    if answer is not None:
        return respond(app, answer)
    if exchange.unprotected:
        try:
            return _unclaimed(view, args, kwargs)
        finally:
            exchange.unprotected_ended()
    slot = environ.get(SETTLE_KEY)  # BodyCapture's: it settles once Flask has sent the answer
    if slot is not None:
        if slot:  # reserved by the guarded view that called this one, whose answer is sent
            slot = None
            outer = g.idemkey  # the caller's, again once this view returns
        else:  # reserved before the view runs: a guarded view it calls settles in that view
            slot.append(None)
    g._get_current_object().idemkey = exchange  # one proxy lookup
    try:
        try:
            response = render_view(app, view, args, kwargs)
        except Exception as exc:
            # An exception the app has an answer for (an errorhandler, an HTTPException) gets
            # it here rather than after the view: that answer is what the client receives, so
            # it is the outcome, stored by the same status rules as a returned response (as
            # Starlette's and Django's handlers do before a middleware sees them). Without one,
            # Flask re-raises it: the key is released.
            response = app.make_response(app.handle_user_exception(exc))
        # Until the answer is pending, any failure (a body werkzeug cannot read) releases:
        # nothing may leave the claim open, which the heartbeat would renew for good.
        data = body_of(response)
        streamed = data is None
        # The (name, value) pairs, as to_wsgi_list() copies them, with one Python call less.
        headers = list(iter(response.headers))
        if data is not None and ("Content-Length", str(len(data))) not in headers:
            # Rare: set_data writes exactly that pair; a list body has none until it is sent.
            data = as_sent(response, data, headers)  # None: short of its length, not kept
        pending = Pending(
            driver,
            exchange,
            response.status_code,
            headers,
            response.status[4:],
            data if data is not None and len(data) <= policy.max_response_bytes else None,
            streamed,
        )
        sent = exchange.first_headers(headers)
        if sent is not None:  # the policy adds headers: sent, never stored
            response.headers.clear()
            response.headers.extend(sent)
    except BaseException as exc:
        try:
            driver.fail(exchange, "the handler raised")
        finally:
            if slot is not None:
                slot.clear()
                if NESTED_KEY in environ:  # streams of views it called, never to be sent
                    release_unsent(environ, "the handler raised")
            elif environ.get(SETTLE_KEY):  # still reserved: called from inside another
                g.idemkey = outer
        # Released: answered here as a typed 409, not Flask's 500; a nested view re-raises,
        # so the view that called it answers (its own claim is released the same way).
        if isinstance(exc, LeaseLostError) and (slot is not None or not environ.get(SETTLE_KEY)):
            return respond(app, lease_lost(policy, exc.committed))
        raise
    if slot is None:
        if environ.get(SETTLE_KEY):  # still reserved, by the outer view (``outer`` is set)
            # A guarded view called from inside another: the outer one's answer is the one
            # sent, so nothing else would settle this one; a stream, once it is sent.
            g.idemkey = outer
            settle_nested(pending, response, environ)
        else:  # no BodyCapture around this dispatch
            complete(pending)
    else:
        slot[0] = pending
    return response


def _checked(store: RedisStore | None, where: str) -> RedisStore | None:
    return None if store is None else checked_store(store, RedisStore, where)


def _same_record(exchange: Exchange) -> bool:
    """Whether ``exchange`` names the record of the claim this request runs under."""
    outer: Exchange | None = getattr(g, "idemkey", None)
    return outer is not None and outer.record == exchange.record


def _unclaimed(view: Callable[..., Any], args: Any, kwargs: Any) -> ResponseReturnValue:
    """Run a guarded view without a claim: ``g.idemkey`` is None, never missing."""
    g._get_current_object().idemkey = None
    return view(*args, **kwargs)  # type: ignore[no-any-return]
