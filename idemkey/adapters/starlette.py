"""Starlette: guard chosen routes, each with its own options.

::

    from starlette.applications import Starlette
    from starlette.routing import Route
    from idemkey import AsyncRedisStore
    from idemkey.adapters.starlette import Idempotency

    idem = Idempotency(AsyncRedisStore(redis.asyncio.Redis.from_url(url)))
    app = Starlette(routes=[
        idem.guard(Route("/charges", create_charge, methods=["POST"])),
        idem.guard(Route("/charges/{charge_id}/refund", refund, methods=["POST"]), wait=2.0),
        Route("/login", login, methods=["POST"]),        # not guarded: no key, no Redis call
    ])

:meth:`Idempotency.guard` wraps the route's own ASGI app in the ASGI
:class:`~idemkey.adapters.asgi.IdempotencyMiddleware`, so the route behaves exactly as the
middleware does (body replayed to the endpoint, response streamed and kept, the record completed
once the last body message is sent), but only for requests Starlette routed to it. The record's
route and the events' route label are the route's template (``/charges/{charge_id}/refund``);
inside a ``Mount`` it is the template relative to the mount.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from ..http.routes import KnownRoute
from ..store import AsyncRedisStore
from ._checks import checked_policy, checked_store
from .asgi import IdempotencyMiddleware

if TYPE_CHECKING:
    from ..policy import Policy
    from .asgi import ASGIApp

__all__ = ["Idempotency"]

R = TypeVar("R")


class Idempotency:
    """Idempotency keys for chosen routes; ``policy`` defaults to the store's.

    ``store`` is an :class:`~idemkey.AsyncRedisStore`.
    """

    def __init__(self, store: AsyncRedisStore, policy: Policy | None = None) -> None:
        self.store = store = checked_store(store, AsyncRedisStore, "Idempotency(store=...)")
        policy = checked_policy(policy, "Idempotency(policy=...)")
        self.policy = policy if policy is not None else store.policy

    def guard(self, route: R, /, **options: Any) -> R:
        """Guard a Starlette ``Route`` (in place; returned for use inside a routes list).

        ``options`` are Policy fields for this route (``ttl``, ``wait``, ``methods``, ...;
        ``required`` is ``require_key``).
        """
        template = getattr(route, "path", None)
        inner = getattr(route, "app", None)
        if not isinstance(template, str) or inner is None:
            from ..errors import ConfigurationError

            raise ConfigurationError(f"guard() takes a starlette Route, got {route!r}")
        route.app = self.wrap(inner, template, options)  # type: ignore[attr-defined]
        return route

    def wrap(self, app: ASGIApp, template: str, options: dict[str, Any]) -> IdempotencyMiddleware:
        """``app`` (one route's ASGI app) behind the middleware, labelled ``template``."""
        known = KnownRoute(
            template, options, label=lambda name: f"idem.guard(<Route {template!r}>, {name}=...)"
        )
        return IdempotencyMiddleware(app, self.store, self.policy, routes=known)
