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

Configuration, when no ``store`` is passed: ``IDEMKEY_REDIS_URL`` (required then) and one
``IDEMKEY_<FIELD>`` key per :class:`~idemkey.Policy` field (``IDEMKEY_TTL``, ``IDEMKEY_LEASE``,
``IDEMKEY_WAIT``, ``IDEMKEY_PREFIX``, ``IDEMKEY_REQUIRE_KEY``, ``IDEMKEY_MAX_REQUEST_BYTES``, ...).
A ``policy`` passed to the constructor is used as it is; otherwise the store's policy (or the
defaults) with the ``IDEMKEY_*`` keys applied. Everything per app lives in
``app.extensions["idemkey"]`` and everything per request on ``g.idemkey`` (the
:class:`~idemkey.http.Exchange`; ``g.idemkey.claim.fence`` is the fencing token), so one
``Idemkey`` serves any number of apps in one process.

``init_app`` wraps ``app.wsgi_app`` in a small WSGI layer that reads a keyed request's body
(method in ``methods``, key header present) before Flask runs any hook, and hands Flask the
same bytes: the fingerprint covers what the client sent even when a ``before_request`` hook
parses ``request.form`` first. A body shorter than its Content-Length is answered 400
``incomplete_body``, a broken chunked one 400 ``invalid_body``, as the WSGI middleware does.

The record's route is the URL rule template (``/charges/<int:id>``). The view's answer, as
``make_response`` builds it, is what is stored; ``after_request`` hooks run on first answers
and replays alike. A streamed response (``response.is_streamed``) passes through and the record
completes without its body when the view returns. A view that raises releases the key.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

import redis
from flask import current_app, g, request
from werkzeug.exceptions import HTTPException

from ..errors import ConfigurationError
from ..http import Exchange, Response, begin, problem
from ..policy import Policy
from ..store import RedisStore
from ._wsgi_body import BODY_KEY, BodyCapture, read_body
from .wsgi import _environ_key, claim, request_of, settle

if TYPE_CHECKING:
    from flask import Flask
    from flask.typing import ResponseReturnValue

__all__ = ["Idemkey"]

F = TypeVar("F", bound=Callable[..., Any])

_FIELDS = {f.name: f for f in dataclasses.fields(Policy) if f.init}


@dataclasses.dataclass
class _AppState:
    store: RedisStore
    policy: Policy
    views: dict[int, Policy] = dataclasses.field(default_factory=dict)

    rule: tuple[frozenset[str], frozenset[str], int] | None = None
    rule_from: int = -1

    def capture_rule(
        self, overrides: list[dict[str, Any]]
    ) -> tuple[frozenset[str], frozenset[str], int]:
        """Methods, environ keys of the key header, and byte limit of any guarded view."""
        if self.rule is None or self.rule_from != len(overrides):  # views decorated since
            policies = [self.policy, *(self.policy.replace(**o) for o in overrides)]
            self.rule = (
                frozenset().union(*(p.methods for p in policies)),
                frozenset(_environ_key(p.header) for p in policies),
                max(p.max_request_bytes for p in policies),
            )
            self.rule_from = len(overrides)
        return self.rule

    def policy_for(self, view: int, overrides: dict[str, Any]) -> Policy:
        policy = self.views.get(view)
        if policy is None:  # first request to this view in this app: derive once, then reuse
            policy = self.views[view] = self.policy.replace(**overrides)
        return policy


class Idemkey:
    """Idempotency keys for Flask views; see the module docstring."""

    def __init__(
        self,
        app: Flask | None = None,
        store: RedisStore | None = None,
        policy: Policy | None = None,
    ) -> None:
        self.store = store
        self.policy = policy
        self._overrides: list[dict[str, Any]] = []  # every view's Policy changes, for capture
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Configure idemkey for ``app`` from the constructor's arguments and ``app.config``."""
        policy = self.policy or _configured(
            self.store.policy if self.store else Policy(), app.config
        )
        store = self.store
        if store is None:
            url = app.config.get("IDEMKEY_REDIS_URL")
            if not url:
                raise ConfigurationError("set IDEMKEY_REDIS_URL or pass Idemkey(store=...)")
            store = RedisStore(redis.Redis.from_url(url), policy)
        app.extensions["idemkey"] = state = _AppState(store, policy)
        # Capture a keyed body before Flask runs a hook that may consume it (request.form).
        limit_for = functools.partial(self._capture_limit, state)
        app.wsgi_app = BodyCapture(app.wsgi_app, limit_for)  # type: ignore[method-assign]

    def _capture_limit(self, state: _AppState, environ: dict[str, Any]) -> int | None:
        """The byte limit to capture a keyed request's body with; None: not keyed here."""
        methods, keys, limit = state.capture_rule(self._overrides)
        if environ.get("REQUEST_METHOD") in methods and not keys.isdisjoint(environ):
            return limit
        return None

    @overload
    def idempotent(self, view: F, /) -> F: ...
    @overload
    def idempotent(self, /, *, required: bool = ..., **overrides: Any) -> Callable[[F], F]: ...
    def idempotent(self, view: F | None = None, /, **overrides: Any) -> F | Callable[[F], F]:
        """Guard a view: ``@idem.idempotent`` or ``@idem.idempotent(required=False, wait=2)``.

        ``required`` is ``Policy.require_key``; any other keyword is a Policy field for this
        view only.
        """
        if "required" in overrides:
            overrides["require_key"] = overrides.pop("required")
        unknown = set(overrides) - set(_FIELDS)
        if unknown:
            raise ConfigurationError(f"unknown Policy fields: {', '.join(sorted(unknown))}")

        if overrides:
            self._overrides.append(overrides)

        def decorate(view: F) -> F:
            @functools.wraps(view)
            def guarded(*args: Any, **kwargs: Any) -> ResponseReturnValue:
                state: _AppState | None = current_app.extensions.get("idemkey")
                if state is None:
                    raise ConfigurationError("Idemkey.init_app(app) was not called for this app")
                policy = state.policy_for(id(guarded), overrides) if overrides else state.policy
                return _guard(state.store, policy, view, args, kwargs)

            return guarded  # type: ignore[return-value]

        return decorate(view) if view is not None else decorate


def _guard(
    store: RedisStore, policy: Policy, view: Callable[..., Any], args: Any, kwargs: Any
) -> ResponseReturnValue:
    req = request._get_current_object()  # type: ignore[attr-defined]  # one proxy lookup
    if req.method not in policy.methods:
        return view(*args, **kwargs)  # type: ignore[no-any-return]
    rule = req.url_rule
    step = begin(policy, request_of(req.environ, rule.rule if rule is not None else ""))
    if step is None:
        return view(*args, **kwargs)  # type: ignore[no-any-return]
    if isinstance(step, Response):
        return _respond(step)
    body = _body(req, step)  # the bytes the client sent, whatever a hook read before us
    if isinstance(body, Response):
        return _respond(body)
    answer = claim(store, step, body)
    if answer is None:
        return view(*args, **kwargs)  # type: ignore[no-any-return]
    if isinstance(answer, Response):
        return _respond(answer)
    g.idemkey = step
    try:
        try:
            response = current_app.make_response(view(*args, **kwargs))
        except HTTPException as exc:  # abort(402) is an answer too: render it as Flask would
            rendered = current_app.handle_user_exception(exc)
            if isinstance(rendered, HTTPException):  # no error handler: werkzeug's own page
                rendered = rendered.get_response()
            response = current_app.make_response(rendered)
    except BaseException:
        settle(store, step, None, (), None)
        raise
    kept: bytes | None = None
    if not response.is_streamed:
        data = response.get_data()
        kept = data if len(data) <= policy.max_response_bytes else None
    headers = response.headers.to_wsgi_list()
    settle(store, step, response.status_code, headers, kept, response.status[4:])
    return response


def _body(req: Any, step: Exchange) -> bytes | Response:
    """The body captured by the layer init_app installed, or read now if nothing read it yet."""
    if BODY_KEY not in req.environ and _touched(req):
        # No capture layer (app.wsgi_app replaced after init_app) and the stream is consumed:
        # a fingerprint of what is left would make different operations one. Refuse instead.
        return problem(
            500,
            "body_unavailable",
            "the request body was read before idemkey saw it; keep the layer Idemkey.init_app "
            "puts around app.wsgi_app",
        )
    return read_body(req.environ, step)


def _touched(req: Any) -> bool:
    """Whether werkzeug already opened the body stream (get_data, form, stream)."""
    return "stream" in req.__dict__ or "form" in req.__dict__ or hasattr(req, "_cached_data")


def _respond(answer: Response) -> ResponseReturnValue:
    headers = answer.headers
    response = current_app.response_class(answer.body, answer.status, headers)
    if answer.reason:
        response.status = f"{answer.status} {answer.reason}"  # "201 Charged OK", as first sent
    names = {name.lower() for name, _ in headers}
    if "content-type" not in names:
        del response.headers["Content-Type"]  # exactly the stored headers: no default added
    if "content-length" not in names:  # nor a length the first answer did not have
        del response.headers["Content-Length"]
        response.automatically_set_content_length = False
    return response


def _configured(base: Policy, config: Any) -> Policy:
    """``base`` with every ``IDEMKEY_<FIELD>`` config key applied."""
    changes = {
        name: config[key] for name in _FIELDS if (key := f"IDEMKEY_{name.upper()}") in config
    }
    if "methods" in changes:
        changes["methods"] = frozenset(changes["methods"])
    return base.replace(**changes) if changes else base
