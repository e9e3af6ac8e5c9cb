"""The request's entry: :func:`begin` looks at a request and gives its :class:`Exchange`.

Cheap and without I/O: the method and the key header decide whether the request passes
through, is refused (400: no key, or not a valid one) or is guarded, and the scope names
whose key it is. The body and its fingerprint come later (``Exchange.received``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core import parse_key, record_for
from ..errors import InvalidKeyError
from ..events import logger
from ._exchange import Exchange
from ._messages import Request, Response, content_length
from ._problems import render
from ._scope import credential_scope, default_scope
from ._switch import switch
from .routes import ROUTE_UNKNOWN

if TYPE_CHECKING:
    from ..policy import Policy

__all__ = ["begin"]


def begin(policy: Policy, request: Request) -> Exchange | Response | None:
    """First look at a request: ``None`` passes it through, a ``Response`` rejects it.

    Otherwise the :class:`Exchange` that guards it. Cheap: no body, no I/O. While
    :func:`idemkey.testing.disabled` is active, always ``None``.
    """
    if request.method not in policy.methods or switch.disabled:
        return None
    values = request.headers.get_all(policy.header)
    if not values:
        if not policy.require_key:
            return None
        return render(policy, 400, "missing_key", f"{policy.header} is required for this request")
    if len(values) > 1:
        return render(policy, 400, "invalid_key", f"send exactly one {policy.header} field line")
    try:
        key = parse_key(values[0], strict=policy.strict_header)
    except InvalidKeyError as exc:
        return render(policy, 400, "invalid_key", exc.reason)
    scope_of = policy.scope
    if scope_of is credential_scope:  # the default: it must leave the key header out
        scope = default_scope(request, policy.header)
    else:
        scope = scope_of(request)
        if not isinstance(scope, str):
            return _scope_refused(policy, request, scope)
    method = request.method
    template = request.route
    route = template or request.path
    return Exchange(
        policy,
        request,
        key,
        scope,
        method,
        route,
        template or ROUTE_UNKNOWN,  # the label: never a concrete path (a bounded metric label)
        record_for(policy.prefix, scope, method, route, key),
        policy.on_event,
        content_length(request.headers),
    )


def _scope_refused(policy: Policy, request: Request, scope: object) -> Response:
    """The answer when the app's scope function returns no str (None for an anonymous user):
    the app's bug, so a 500 problem and one ERROR line, never a traceback to the client;
    nothing is claimed. The type is logged, not sent: the scope is the app's business."""
    logger.error(
        "idemkey: Policy.scope returned %s, not a str, for %s %s: answered 500 invalid_scope "
        "(nothing claimed); return the tenant as a str for every keyed request",
        type(scope).__name__,
        request.method,
        request.route or ROUTE_UNKNOWN,  # a template, never the client's path
    )
    return render(
        policy, 500, "invalid_scope", "the server could not tell whose key this is; nothing ran"
    )
