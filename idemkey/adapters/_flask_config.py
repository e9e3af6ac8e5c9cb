"""The Flask extension's configuration: ``IDEMKEY_*`` config keys and per-view overrides,
the order of a view's decorators, and the WSGI layer that captures a keyed body by them and
settles the guarded view's answer once Flask has sent it (``_flask_settle``).

Kept apart from ``flask.py``, which only translates requests and responses.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .._options import derive, keyword, policy_options
from ..errors import ConfigurationError
from ..policy import Policy
from ..store import RedisStore
from ..store._url import client_from_url
from ._environ import BODY_KEY, capture, environ_key
from ._flask_settle import (
    NESTED_KEY,
    SETTLE_KEY,
    Pending,
    complete,
    release,
    release_unsent,
    sent_by_server,
    served,
)
from ._sync_driver import Driver
from ._wsgi_response import StreamedBody

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping

    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment
    from flask import Flask

__all__ = ["AppState", "BodyCapture", "app_state", "view_overrides"]

_PREFIX = "IDEMKEY_"
#: Config keys of the Redis client idemkey builds (``IDEMKEY_REDIS_URL``), not Policy fields.
_CLIENT_PREFIX = "IDEMKEY_REDIS_"
_URL = "IDEMKEY_REDIS_URL"
_VIEW = "@idem.idempotent(...) with the app's policy"


@dataclasses.dataclass
class AppState:
    """What one app needs per request, in ``app.extensions["idemkey"]``."""

    store: RedisStore
    policy: Policy
    driver: Driver
    views: dict[int, Policy] = dataclasses.field(default_factory=dict)
    #: The app's ``view_functions``: what its rules call, read for the decorators' order.
    endpoints: Mapping[str, Callable[..., Any]] = dataclasses.field(default_factory=dict)
    #: Every app the same Idemkey serves (weakly held): a guard any of them registers is in
    #: the right order, though this app registers the bare function too (an admin app).
    apps: Iterable[Flask] = ()
    #: None until the app's first request, which checks the decorators' order first.
    rule: tuple[frozenset[str], frozenset[str], int] | None = None
    rule_from: int = -1

    def capture_rule(
        self, overrides: list[dict[str, Any]], guards: list[Callable[..., Any]]
    ) -> tuple[frozenset[str], frozenset[str], int]:
        """Methods, environ keys of the key header, and byte limit of any guarded view;
        first, every guarded view checked to be registered with its guard."""
        if self.rule is None or self.rule_from != len(overrides):  # views decorated since
            every_app = [self.endpoints, *(app.view_functions for app in _snapshot(self.apps))]
            refuse_misordered(self.endpoints, guards, every_app)
            self.rule = capture_rule(self.policy, overrides)
            self.rule_from = len(overrides)
        return self.rule

    def policy_for(self, view: int, overrides: dict[str, Any]) -> Policy:
        policy = self.views.get(view)
        if policy is None:  # first request to this view in this app: derive once, then reuse
            policy = self.views[view] = derive(self.policy, overrides, _VIEW)
        return policy


def capture_rule(
    policy: Policy, overrides: list[dict[str, Any]]
) -> tuple[frozenset[str], frozenset[str], int]:
    """Methods, environ keys of the key header, and byte limit of any guarded view; a view's
    override that makes no valid policy raises."""
    policies = [policy, *(derive(policy, o, _VIEW) for o in overrides)]
    return (
        frozenset().union(*(p.methods for p in policies)),
        frozenset(environ_key(p.header) for p in policies),
        max(p.max_request_bytes for p in policies),
    )


class BodyCapture:
    """The WSGI layer ``init_app`` puts around ``app.wsgi_app``: it captures a keyed request's
    body (:func:`~._environ.capture`) before Flask runs a hook that may consume it, and
    settles the guarded view's answer once Flask returned the response (``_flask_settle``).

    A request is keyed when some guarded view could take it as keyed (its method, a key
    header); the test, the capture and the settling are inline here, one Python call a
    request costs.
    """

    __slots__ = ("app", "guards", "overrides", "state")

    def __init__(
        self,
        app: WSGIApplication,
        state: AppState,
        overrides: list[dict[str, Any]],
        guards: list[Callable[..., Any]],
    ) -> None:
        self.app, self.state, self.overrides, self.guards = app, state, overrides, guards

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        state = self.state
        rule = state.rule
        if rule is None or state.rule_from != len(self.overrides):  # capture_rule's test
            rule = state.capture_rule(self.overrides, self.guards)
        methods, keys, limit = rule
        # werkzeug upper-cases the method it routes on ("post" reaches a POST view), so the
        # capture does too, past the usual spelling.
        if not keys.isdisjoint(environ) and (
            environ.get("REQUEST_METHOD") in methods
            or str(environ.get("REQUEST_METHOD", "")).upper() in methods
        ):
            environ[BODY_KEY] = capture(environ, limit)
            # A guarded view that ran under a claim leaves its answer (a None is there only
            # while that view runs: it clears the slot if it raises).
            slot: list[Pending] = []
            environ[SETTLE_KEY] = slot
            try:
                body = self.app(environ, start_response)
            except BaseException:
                try:
                    if slot:  # let out after the view (a teardown's): the server sends its 500
                        release(slot.pop(), "an exception left Flask after the view answered")
                finally:
                    if NESTED_KEY in environ:
                        release_unsent(environ, "an exception left Flask")
                raise
            if slot:  # Flask sent the view's answer: store it, or a stream as it goes out
                pending = slot.pop()
                if NESTED_KEY in environ:  # streams of guarded views it called: see served()
                    return served(pending, body, environ)
                if pending.streamed and not sent_by_server(body, environ):
                    # The head as its record keeps it: a replay runs the hooks again.
                    head = (pending.status, pending.headers, pending.reason)
                    return StreamedBody.around(
                        pending.driver, pending.exchange, head, body, environ
                    )
                complete(pending, body)
            return body
        return self.app(environ, start_response)


def refuse_misordered(
    endpoints: Mapping[str, Callable[..., Any]],
    guards: list[Callable[..., Any]],
    every_app: Iterable[Mapping[str, Callable[..., Any]]],
) -> None:
    """Refuse an app whose rule calls a guarded view without its guard: ``@idem.idempotent``
    written above the route decorator, which had registered the function as it was (and
    Flask's route decorators return it unchanged), so nothing is guarded.

    ``guards`` are the Idemkey's, of every app it serves: a guard that one of them (the
    ``endpoints`` of ``every_app``) registers was written in the right order."""
    # Snapshots (tuple() of a dict's view is one C call): another thread's app factory may be
    # adding routes (add_url_rule) while this app's first request checks them.
    registered = {
        id(function)
        for views in every_app
        for view in tuple(views.values())
        for function in _unwrapped(view)
    }
    reachable: dict[int, str] = {}  # every function a rule of this app calls, through wrappers
    for endpoint, view in tuple(endpoints.items()):
        for function in _unwrapped(view):
            reachable.setdefault(id(function), endpoint)
    for guard in guards:
        if id(guard) in registered:
            continue
        for function in _unwrapped(getattr(guard, "__wrapped__", None)):
            unguarded = reachable.get(id(function))
            if unguarded is not None:
                name = getattr(guard, "__qualname__", repr(guard))
                raise ConfigurationError(
                    f"{name} (endpoint {unguarded!r}): @idem.idempotent is written above the "
                    "route decorator, which registered the view without it: nothing is "
                    "guarded. Write @idem.idempotent below @app.post(...) (or @bp.route(...)), "
                    "next to the function"
                )


def _snapshot(apps: Iterable[Flask]) -> tuple[Flask, ...]:
    """The apps of ``apps`` (a WeakSet, iterated in Python) as they are: read again if another
    thread's ``init_app`` added one meanwhile ("Set changed size during iteration")."""
    while True:
        try:
            return tuple(apps)
        except RuntimeError:  # an app added meanwhile: a factory makes finitely many
            continue


def _unwrapped(function: Callable[..., Any] | None) -> Iterator[Callable[..., Any]]:
    """``function``, then what it wraps (``__wrapped__``, as ``functools.wraps`` sets it)."""
    seen: set[int] = set()
    current: Any = function
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = getattr(current, "__wrapped__", None)


def app_state(config: Any, store: RedisStore | None, policy: Policy | None) -> AppState:
    """The state for an app: ``policy`` as it is, else the store's policy (or the defaults)
    with every ``IDEMKEY_<FIELD>`` key of ``config`` applied; a store from
    ``IDEMKEY_REDIS_URL`` unless one is given."""
    for key in config:
        # Only the URL is read: a password, database or timeout key would be dropped silently.
        if isinstance(key, str) and key.startswith(_CLIENT_PREFIX) and key != _URL:
            raise ConfigurationError(
                f"{key} (Flask config): not a key idemkey reads; the only {_CLIENT_PREFIX}* key "
                f"is {_URL}: put the password, database and timeouts in it "
                "(redis://:password@host:6379/0?socket_timeout=5), or pass "
                "Idemkey(store=RedisStore(client))"
            )
    if policy is None:
        policy = _configured(store.policy if store else Policy(), config)
    if store is None:
        url = config.get(_URL)
        if not url:
            raise ConfigurationError(f"set {_URL} or pass Idemkey(store=...)")
        if not isinstance(url, str):
            raise ConfigurationError(
                f"{_URL} (Flask config): expected a URL string, got {type(url).__name__}"
            )
        store = RedisStore(client_from_url(url, source=_URL), policy)
    return AppState(store, policy, Driver(store))


def view_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """A view's Policy fields (``required`` is ``require_key``), typed and checked; unknown
    ones are refused."""
    return policy_options(overrides, keyword("@idem.idempotent"))


def _configured(base: Policy, config: Any) -> Policy:
    """``base`` with every ``IDEMKEY_<FIELD>`` config key applied, each typed and checked;
    an ``IDEMKEY_`` key that is no field is refused (``IDEMKEY_REDIS_*``: see app_state)."""
    options = {
        key[len(_PREFIX) :].lower(): value
        for key, value in config.items()
        if isinstance(key, str) and key.startswith(_PREFIX) and not key.startswith(_CLIENT_PREFIX)
    }
    changes = policy_options(options, lambda name: f"{_PREFIX}{name.upper()} (Flask config)")
    return derive(base, changes, "Flask config (IDEMKEY_*)")
