"""Django: a middleware for ``settings.MIDDLEWARE``, configured from ``settings.IDEMKEY``.

::

    # settings.py
    MIDDLEWARE = [
        "idemkey.adapters.django.IdempotencyMiddleware",  # first: see below
        "django.middleware.security.SecurityMiddleware",
        ...,
    ]
    IDEMKEY = {
        "REDIS_URL": "redis://localhost:6379/0",  # or "CLIENT": a client, a factory or its path
        "TTL": 86400, "WAIT": 0.0,                # any Policy field, upper case
    }

    # views.py
    from idemkey.adapters.django import idempotency_exempt, idempotent

    @idempotent                                   # or @idempotent(ttl=3600, required=False)
    def create_charge(request): ...

Settings (``IDEMKEY``): the store is ``STORE`` (a :class:`~idemkey.RedisStore`), else one on
``CLIENT`` (a ``redis.Redis``, a callable returning one, or its dotted path) or ``REDIS_URL``.
``GUARD`` is ``"decorated"`` (default: only views decorated with :func:`idempotent`) or
``"all"`` (every view, for the policy's methods, except those decorated with
:func:`idempotency_exempt`, the way ``csrf_exempt`` opts a view out). ``SCOPE`` is a callable
(or its dotted path) that receives the Django request and returns the tenant; by default the
authenticated user (``user:<pk>``), else the policy's scope (by default a digest of the
request's credentials). Every other key is a :class:`~idemkey.Policy` field in upper case
(``ON_EVENT`` and ``RENDER_PROBLEM`` take callables), typed and checked as ``Policy`` checks it
(``"METHODS": "POST"`` or an unknown key is a ``ConfigurationError`` naming the key).

The record's route and the events' label are the resolver's route pattern
(``/charges/<int:charge_id>``). The middleware decides in ``process_view`` (after URL
resolution and after ``AuthenticationMiddleware``, wherever it sits in the list): an answer of
idemkey's own (a replay, 400, 409, 422, 503) is returned without calling the view; otherwise
the view runs under the claim and the response is stored as it comes back up to this
middleware. Listed first, every other middleware has finished with it by then: one that fails
after the view (``SessionMiddleware`` saving the session) makes Django's 400 or 500 the
answer, which releases the key (a 500 for an exception even under ``STORE_SERVER_ERRORS``:
it is a raise). A streamed response completes the record without its body once its head goes
out (under WSGI with its first byte: a stream that raises before it is released; see
``_django_response``). It is a synchronous middleware: under ASGI, Django runs it in its
thread pool, as it does any sync middleware.

The body of a request that some guarded view may take as keyed (its method, a key header) is
read in ``__call__``, before any middleware's ``process_view``: ``CsrfViewMiddleware`` reads
``request.POST`` there, which consumes a multipart stream, so idemkey reads ``request.body``
first (bounded by the largest ``max_request_bytes``) and Django parses the form from the bytes
it keeps. A body the server cannot read (a malformed chunked upload, a reset connection) is
``400 invalid_body``, as under the WSGI middleware; nothing is claimed.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar, overload

try:
    from django.conf import settings
    from django.core.signals import got_request_exception, request_finished, request_started
    from django.http import HttpRequest
    from django.urls import get_resolver
except ImportError as exc:
    raise ImportError(
        "idemkey.adapters.django needs Django: pip install 'idemkey-redis[django]'"
    ) from exc

from .._options import derive, keyword, policy_options
from ..errors import ConfigurationError
from ..http import Response, begin
from ..http._scope import default_scope
from ..http._switch import switch
from ..http.routes import ROUTE_UNKNOWN
from ..policy import Policy, credential_scope
from ._django_body import UNREADABLE_ATTRIBUTE, read_body, take_body
from ._django_config import configure
from ._django_response import (
    RAISED_REQUEST,
    STARTED_REQUEST,
    UNSENT_STREAM,
    drop_unsent,
    forget_unsent,
    lease_lost_answer,
    mark_raised,
    respond,
    settle,
)
from ._environ import BodyError, EnvironHeaders, environ_key, path_text
from ._sync_driver import Driver

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment
    from django.http import HttpResponseBase

    from ..http import Request

__all__ = ["IdempotencyMiddleware", "idempotency_exempt", "idempotent"]

F = TypeVar("F", bound=Callable[..., Any])

_current: contextvars.ContextVar[HttpRequest] = contextvars.ContextVar("idemkey_django_request")
#: The attribute the decorators set on a view (as ``csrf_exempt`` sets ``csrf_exempt``).
OPTIONS_ATTRIBUTE = "idemkey_options"
EXEMPT_ATTRIBUTE = "idemkey_exempt"

#: The Policy fields that decide which requests are keyed, and how much of a body to read.
_CAPTURE_FIELDS = ("methods", "header", "max_request_bytes")
#: Each distinct set of those fields some ``@idempotent(...)`` set, in the order seen: the
#: middleware reads the body of any request one of them may take as keyed. A list (appended
#: to, read by slicing), so a view decorated in another thread never breaks an iteration.
_CAPTURE_CHANGES: list[tuple[tuple[str, Any], ...]] = []


@overload
def idempotent(view: F, /) -> F: ...
@overload
def idempotent(**options: Any) -> Callable[[F], F]: ...
def idempotent(view: F | None = None, /, **options: Any) -> F | Callable[[F], F]:
    """Guard this view: ``@idempotent`` or ``@idempotent(ttl=3600, required=False)``.

    ``options`` are Policy fields for this view (``required`` is ``require_key``).
    """
    changes = policy_options(options, keyword("@idempotent"))
    captured = tuple((name, changes[name]) for name in _CAPTURE_FIELDS if name in changes)
    if captured and captured not in _CAPTURE_CHANGES:
        _CAPTURE_CHANGES.append(captured)

    def decorate(view: F) -> F:
        return _marked(view, OPTIONS_ATTRIBUTE, changes)

    return decorate(view) if view is not None else decorate


_NOT_SEEN: Final = object()


def _unseen(view: Callable[..., Any], args: tuple[Any, ...], options: object) -> None:
    """Refuse to run a guarded view whose request the middleware never guarded as this view:
    it is not in ``MIDDLEWARE``, or the decorated function is not the view Django resolved (a
    class-based view's ``post``; under ``GUARD = "all"`` its options were ignored). Either way
    every retry ran the view again, silently. Not under ``idemkey.testing.disabled()`` (a unit
    test calling the view with ``RequestFactory``)."""
    if switch.disabled:
        return
    for arg in args[:2]:  # the request: a function view's first, a method's second
        arg = getattr(arg, "_request", arg)  # Django REST framework's Request wraps it
        if isinstance(arg, HttpRequest):
            # Equal, not the same: method_decorator(idempotent) decorates at every call.
            if getattr(arg, "_idemkey_seen", _NOT_SEEN) != options:
                raise ConfigurationError(
                    f"@idempotent on {_name(view)} guards nothing: the request did not pass "
                    "idemkey's IdempotencyMiddleware as this view. Add "
                    "'idemkey.adapters.django.IdempotencyMiddleware' to MIDDLEWARE, and "
                    "decorate the view Django calls: on a class-based view, "
                    "@method_decorator(idempotent, name='dispatch') or idempotent(View.as_view()); "
                    "a unit test that calls the view directly runs it in idemkey.testing.disabled()"
                )
            return


def idempotency_exempt(view: F) -> F:
    """Never guard this view, even with ``IDEMKEY["GUARD"] = "all"``."""
    return _marked(view, EXEMPT_ATTRIBUTE, True)


def _marked(view: F, attribute: str, value: object) -> F:
    """A wrapper of ``view`` carrying ``attribute``; async views stay async (Django checks).
    A guarded view's wrapper checks that the middleware saw its request (:func:`_unseen`)."""
    check = attribute == OPTIONS_ATTRIBUTE
    if inspect.iscoroutinefunction(view):

        async def wrapped_async(*args: Any, **kwargs: Any) -> Any:
            if check:
                _unseen(view, args, value)
            return await view(*args, **kwargs)

        wrapped: Callable[..., Any] = wrapped_async
    else:

        def wrapped_sync(*args: Any, **kwargs: Any) -> Any:
            if check:
                _unseen(view, args, value)
            return view(*args, **kwargs)

        wrapped = wrapped_sync
    functools.update_wrapper(wrapped, view)
    setattr(wrapped, attribute, value)
    return wrapped  # type: ignore[return-value]


def user_scope(request: HttpRequest) -> str | None:
    """The authenticated user as a scope (``user:<pk>``), or None for an anonymous request."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return f"user:{user.pk}"
    return None


class IdempotencyMiddleware:
    """Guard Django views with idempotency keys; see the module docstring."""

    sync_capable = True
    async_capable = False
    process_exception = lease_lost_answer  # LeaseLostError: a typed 409, not Django's 500

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        store, custom, self.guard_all = configure(getattr(settings, "IDEMKEY", None) or {})
        self.store = store
        self.driver = Driver(store)
        fallback = store.policy.scope
        header = store.policy.header

        def scope(request: Request) -> str:
            # The scope sees the Django request (its user), not only idemkey's view of it.
            django_request = _current.get()
            if custom is not None:
                return custom(django_request)  # type: ignore[no-any-return]
            user = user_scope(django_request)
            if user:
                return user
            if fallback is credential_scope:  # an anonymous request, by its credentials
                return default_scope(request, header)
            return fallback(request)

        self.policy = store.policy.replace(scope=scope)
        # Keyed by the view itself, weakly: a view created at run time and collected never
        # hands its policy to another that reuses its id().
        self._views: weakref.WeakKeyDictionary[Callable[..., Any], Policy | None] = (
            weakref.WeakKeyDictionary()
        )
        # Which requests get their body read in __call__ (see _capture_rule): one tuple, set
        # at once, so a request in another thread never sees half of a new rule.
        self._rule: tuple[frozenset[str], tuple[str, ...], int] = (frozenset(), (), 0)
        self._rule_from = -1  # len(_CAPTURE_CHANGES) when the rule was made; -1: not yet
        request_started.connect(_keep_path_info, dispatch_uid=_SERVER_PATH_INFO)
        request_finished.connect(drop_unsent, dispatch_uid=UNSENT_STREAM)
        request_started.connect(forget_unsent, dispatch_uid=STARTED_REQUEST)
        got_request_exception.connect(mark_raised, dispatch_uid=RAISED_REQUEST)

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if self._rule_from != len(_CAPTURE_CHANGES):  # the first request, or views decorated since
            self._capture_rule(request)
        methods, keys, limit = self._rule
        if request.method in methods:  # an unkeyed request costs this test and a lookup a key
            meta = request.META
            for key in keys:
                if key in meta:
                    # Read now, before any process_view (CSRF's reads request.POST, consuming
                    # a multipart stream): Django keeps the bytes, and parses the form from them.
                    taken = take_body(request, limit)
                    if isinstance(taken, BodyError) and taken.code == "invalid_body":
                        setattr(request, UNREADABLE_ATTRIBUTE, taken)
                    break
        try:
            response = self.get_response(request)
        except asyncio.CancelledError:
            # Django 5+ under ASGI cancels the request when its client leaves, after the view's
            # thread did its work: the key is kept until its lease lapses, never released.
            exchange = request.__dict__.pop("_idemkey", None)
            if exchange is not None:  # running: the view's response is taken only below
                self.driver.abandon(exchange)
            raise
        except BaseException:
            exchange = request.__dict__.pop("_idemkey", None)
            if exchange is not None:
                self.driver.fail(exchange, "the view raised")
            raise
        finally:
            unprotected = request.__dict__.pop("_idemkey_unprotected", None)
            if unprotected is not None:
                unprotected.unprotected_ended()
        exchange = request.__dict__.pop("_idemkey", None)
        if exchange is not None:
            settle(self.driver, exchange, request, response)
        return response

    def process_view(
        self,
        request: HttpRequest,
        view: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> HttpResponseBase | None:
        """Django's view hook: a guarded request is run (or replayed, or refused) here, with
        the view resolved; None lets Django call the view unguarded."""
        policy = self._policy_for(view)
        if policy is None:
            return None
        # What @idempotent checks: the options of the view guarded (None: GUARD = "all").
        request._idemkey_seen = getattr(view, OPTIONS_ATTRIBUTE, None)
        if request.method not in policy.methods:
            return None
        match = request.resolver_match
        route = "/" + match.route if match is not None and match.route else ROUTE_UNKNOWN
        token = _current.set(request)
        try:
            exchange = begin(policy, _request_of(request, route))
        finally:
            _current.reset(token)
        if exchange is None:
            return None
        if isinstance(exchange, Response):
            return respond(exchange)
        body = read_body(request, exchange)
        if isinstance(body, Response):
            return respond(body)
        answer = self.driver.claim(exchange)
        if answer is not None:
            return respond(answer)
        if exchange.unprotected:  # Redis is down and the policy says run unprotected
            request._idemkey_unprotected = exchange  # its call ends in __call__, after the view
            return None
        request._idemkey = exchange  # settled in __call__, with the view's response
        return None

    def _capture_rule(self, request: HttpRequest) -> None:
        """The methods, the META keys of the key headers, and the byte limit of every policy a
        guarded view may have: the middleware's and each ``@idempotent(...)``'s changes."""
        if self._rule_from < 0:
            # Load the URLconf (Django does, next, to resolve this request): its views are
            # decorated as it imports them, so their options are known before this request.
            get_resolver(getattr(request, "urlconf", None)).url_patterns  # noqa: B018
        seen = _CAPTURE_CHANGES[:]
        policy = self.policy
        methods, keys, limit = set(policy.methods), {policy.header}, policy.max_request_bytes
        for changes in seen:
            fields = dict(changes)
            methods.update(fields.get("methods", policy.methods))
            keys.add(fields.get("header", policy.header))
            limit = max(limit, fields.get("max_request_bytes", limit))
        self._rule = (frozenset(methods), tuple(sorted({environ_key(k) for k in keys})), limit)
        self._rule_from = len(seen)

    def _policy_for(self, view: Callable[..., Any]) -> Policy | None:
        """The view's policy (derived once per view), or None when it is not guarded."""
        try:
            return self._views[view]
        except KeyError:
            pass
        except TypeError:  # a view that cannot be weakly referenced: derive it every time
            return self._derive(view)
        chosen = self._views[view] = self._derive(view)
        return chosen

    def _derive(self, view: Callable[..., Any]) -> Policy | None:
        options = getattr(view, OPTIONS_ATTRIBUTE, None)
        if getattr(view, EXEMPT_ATTRIBUTE, False) or (options is None and not self.guard_all):
            return None
        return (
            derive(self.policy, options, f"@idempotent on {_name(view)}")
            if options
            else self.policy
        )


def _name(view: Callable[..., Any]) -> str:
    return f"{getattr(view, '__module__', '?')}.{getattr(view, '__qualname__', view)}"


#: Where a WSGI request's PATH_INFO that is not ASCII waits, as the server handed it over.
_SERVER_PATH_INFO: Final = "idemkey.path_info"


def _keep_path_info(sender: object, environ: WSGIEnvironment | None = None, **_: object) -> None:
    """``request_started``, which Django's WSGI handler sends before ``WSGIRequest`` replaces
    PATH_INFO with its reading of it: a byte that is not UTF-8 becomes ``%E9`` there (U+FFFD
    under ASGI and behind idemkey's other adapters). Under ASGI ``environ`` is None."""
    if environ is not None:
        path_info = environ.get("PATH_INFO")
        if path_info and not path_info.isascii():
            environ[_SERVER_PATH_INFO] = path_info


def _request_of(request: HttpRequest, route: str) -> Request:
    from ..http import Request

    meta = request.META
    path = request.path
    if "%" in path:  # maybe WSGIRequest's %XX for a byte that is not UTF-8 (_keep_path_info)
        kept = meta.get(_SERVER_PATH_INFO)
        if kept is not None:  # such bytes as U+FFFD, joined to the script prefix as Django does
            path_info = path_text(kept)
            path = f"{meta['SCRIPT_NAME'].rstrip('/')}/{path_info.replace('/', '', 1)}"
    query = meta.get("QUERY_STRING", "")
    return Request(request.method or "GET", path, query, EnvironHeaders(meta), route)
