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

The record's route is the URL rule template (``/charges/<int:id>``). The body is read and
checked as the WSGI middleware does. The view's answer, as ``make_response`` builds it, is
stored; ``after_request`` hooks run on first answers and replays alike. A streamed response
passes through and completes without its body. A view that raises releases the key.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

from flask import current_app, g, request
from werkzeug.exceptions import HTTPException

from ..errors import ConfigurationError
from ..http import Response, begin
from ._environ import read_werkzeug_body, request_of
from ._flask_config import AppState, app_state, view_overrides
from ._lifecycle import Lifecycle

if TYPE_CHECKING:
    from flask import Flask
    from flask import Response as FlaskResponse
    from flask.typing import ResponseReturnValue

    from ..policy import Policy
    from ..store import RedisStore
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
        self.store = store
        self.policy = policy
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Configure idemkey for ``app`` from the constructor's arguments and ``app.config``."""
        app.extensions["idemkey"] = app_state(app.config, self.store, self.policy)

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

        def decorate(view: F) -> F:
            @functools.wraps(view)
            def guarded(*args: Any, **kwargs: Any) -> ResponseReturnValue:
                state: AppState | None = current_app.extensions.get("idemkey")
                if state is None:
                    raise ConfigurationError("Idemkey.init_app(app) was not called for this app")
                policy = state.policy_for(id(guarded), overrides) if overrides else state.policy
                return _guard(state.driver, policy, view, args, kwargs)

            return guarded  # type: ignore[return-value]

        return decorate(view) if view is not None else decorate


def _guard(
    driver: Driver, policy: Policy, view: Callable[..., Any], args: Any, kwargs: Any
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
    lifecycle = Lifecycle(step)
    body = read_werkzeug_body(req, lifecycle)
    if isinstance(body, Response):
        return _respond(body)
    answer = driver.claim(lifecycle)
    if answer is not None:
        return _respond(answer)
    if lifecycle.unprotected:
        return view(*args, **kwargs)  # type: ignore[no-any-return]
    g.idemkey = step
    try:
        response = _render(view, args, kwargs)
    except BaseException:
        driver.fail(lifecycle, "the handler raised")
        raise
    kept: bytes | None = None
    if not response.is_streamed:
        data = response.get_data()
        kept = data if len(data) <= policy.max_response_bytes else None
    lifecycle.started(response.status_code, response.headers.to_wsgi_list())
    driver.finish(lifecycle, kept)
    return response


def _render(view: Callable[..., Any], args: Any, kwargs: Any) -> FlaskResponse:
    """The view's answer as ``make_response`` builds it; ``abort(402)`` is an answer too."""
    try:
        return current_app.make_response(view(*args, **kwargs))
    except HTTPException as exc:  # render it as Flask would
        rendered = current_app.handle_user_exception(exc)
        if isinstance(rendered, HTTPException):  # no error handler: werkzeug's own page
            rendered = rendered.get_response()
        return current_app.make_response(rendered)


def _respond(answer: Response) -> ResponseReturnValue:
    headers = answer.headers
    response = current_app.response_class(answer.body, answer.status, headers)
    if not any(name.lower() == "content-type" for name, _ in headers):
        del response.headers["Content-Type"]  # exactly the stored headers: no default added
    return response
