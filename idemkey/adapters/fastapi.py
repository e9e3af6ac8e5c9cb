"""FastAPI: a dependency that opts routes in, a route class that guards them, OpenAPI that says so.

::

    from fastapi import APIRouter, FastAPI
    from idemkey import AsyncRedisStore
    from idemkey.adapters.fastapi import Idempotency, IdempotentRoute

    idem = Idempotency(AsyncRedisStore(redis.asyncio.Redis.from_url(url)))

    app = FastAPI()
    app.router.route_class = IdempotentRoute            # before the routes are declared

    @app.post("/charges", status_code=201, dependencies=[idem.guard()])
    async def create_charge(charge: Charge) -> dict: ...

    @app.post("/login")                                 # not guarded: no key, no Redis call
    async def login() -> dict: ...

    router = idem.router(prefix="/refunds")             # every route on it guarded
    @router.post("/{charge_id}", dependencies=[idem.guard(wait=2.0)])   # per-route options
    async def refund(charge_id: str) -> dict: ...
    app.include_router(router, prefix="/v1")

``idem.guard(**options)`` is a dependency: declare it on a route, or on an ``APIRouter`` for all
of its routes (options: Policy fields such as ``ttl``, ``wait``, ``methods``; ``required`` is
``require_key``; a route's own options override its router's). The route class
:class:`IdempotentRoute` runs the guarded routes through the ASGI
:class:`~idemkey.adapters.asgi.IdempotencyMiddleware`, so they behave exactly as under it; it
survives ``include_router`` (the record's route and the events' label are the full template,
``/v1/refunds/{charge_id}``; inside a Starlette ``Mount``, relative to the mount, as in the
Starlette adapter). A guard declared on a route that is not an ``IdempotentRoute`` raises
:class:`~idemkey.errors.ConfigurationError` on its first request instead of silently guarding
nothing.

OpenAPI: each guarded operation documents the ``Idempotency-Key`` header parameter (required
or optional as configured), the problem responses idemkey may answer (400, 409, 413, the
key-reuse status and 503) as ``application/problem+json`` (with ``Policy.render_problem``, as
``Idempotency(problem_media_type=...)``, by default ``application/json``), and the
``Idempotent-Replayed`` header on its success response, whether the guard is declared on the
route, on its ``APIRouter`` or by ``include_router(dependencies=...)``. What FastAPI documents
itself stays: a handler (or dependency) that reads the key header with ``Header()`` has it
listed once, as FastAPI declares it, and a status the operation describes itself (FastAPI's 422
validation error, a ``responses=`` entry) gets both descriptions. An operation is guarded
when the policy's ``methods`` name its method: a GET on a guarded router documents nothing.
FastAPI builds every method's operation of one route from one ``openapi_extra``, so a route
whose policy guards some of its methods only is refused (``ConfigurationError``): its
operations could not be documented as they run.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

try:
    import fastapi.routing
    from fastapi import APIRouter, Depends, Request
    from fastapi.routing import APIRoute
except ImportError as exc:
    raise ImportError(
        "idemkey.adapters.fastapi needs FastAPI: pip install 'idemkey-redis[fastapi]'"
    ) from exc

from .._options import derive, keyword, policy_options
from ..errors import ConfigurationError
from ..http.routes import KnownRoute
from ..store import AsyncRedisStore
from ._checks import checked_policy, checked_store
from ._fastapi_openapi import document
from .asgi import IdempotencyMiddleware

if TYPE_CHECKING:
    from fastapi import params
    from starlette.responses import Response
    from starlette.types import Receive, Scope, Send

    from ..policy import Policy

__all__ = ["Idempotency", "IdempotentRoute"]

#: The scope key a guarded route sets before its dependencies run (the guard checks it).
SCOPE_KEY: Final = "idemkey.route"
#: What ``APIRouter`` takes (``idem.router`` refuses anything else, a Policy option above all);
#: None if it takes any keyword.
_ROUTER_PARAMETERS = inspect.signature(APIRouter).parameters.values()
_ROUTER_ARGUMENTS: Final = (
    None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in _ROUTER_PARAMETERS)
    else frozenset(p.name for p in _ROUTER_PARAMETERS)
)


@dataclass(frozen=True)
class _Guard:
    """What one ``idem.guard(...)`` declared: the integration and its Policy overrides."""

    idem: Idempotency
    options: dict[str, Any]


class Idempotency:
    """Idempotency keys for FastAPI routes; ``policy`` defaults to the store's.

    ``store`` is an :class:`~idemkey.AsyncRedisStore`.
    """

    def __init__(
        self,
        store: AsyncRedisStore,
        policy: Policy | None = None,
        *,
        problem_media_type: str = "application/json",
    ) -> None:
        self.store = store = checked_store(store, AsyncRedisStore, "Idempotency(store=...)")
        policy = checked_policy(policy, "Idempotency(policy=...)")
        self.policy = policy if policy is not None else store.policy
        #: The media type OpenAPI gives idemkey's answers when ``Policy.render_problem`` renders
        #: them in your API's own shape (else they are RFC 9457 ``application/problem+json``).
        self.problem_media_type = problem_media_type

    def guard(self, **options: Any) -> params.Depends:
        """The dependency that opts a route (or a router's routes) in, with Policy overrides."""
        spec = _Guard(self, policy_options(options, keyword("idem.guard")))

        def idempotency_key(request: Request) -> None:
            if SCOPE_KEY not in request.scope:
                raise ConfigurationError(
                    f"{request.scope.get('path')}: idem.guard() needs the route class "
                    "idemkey.adapters.fastapi.IdempotentRoute (APIRouter(route_class=...) or "
                    "app.router.route_class = IdempotentRoute, before declaring routes)"
                )

        idempotency_key.__idemkey__ = spec  # type: ignore[attr-defined]
        depends: params.Depends = Depends(idempotency_key)
        return depends

    def router(self, **kwargs: Any) -> APIRouter:
        """An ``APIRouter`` whose every route is guarded with this integration's policy.

        ``kwargs`` are ``APIRouter``'s; Policy options go in a guard
        (``dependencies=[idem.guard(wait=2.0)]``), and one given here is refused.
        """
        for name in kwargs:
            if _ROUTER_ARGUMENTS is not None and name not in _ROUTER_ARGUMENTS:
                raise ConfigurationError(
                    f"idem.router({name}=...): not an APIRouter argument; Policy options go "
                    f"in a guard: idem.router(dependencies=[idem.guard({name}=...)])"
                )
        dependencies = [self.guard(), *kwargs.pop("dependencies", ())]
        return APIRouter(route_class=IdempotentRoute, dependencies=dependencies, **kwargs)


class IdempotentRoute(APIRoute):
    """An ``APIRoute`` that guards itself when a dependency is an ``idem.guard()``.

    Routes without one behave exactly as ``APIRoute``.
    """

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        self._idemkey: dict[tuple[str, tuple[int, ...]], IdempotencyMiddleware] = {}
        guards = _guards(self.dependencies)
        if guards:
            idem, options = _merged(guards)
            policy = derive(idem.policy, options, f"idem.guard(...) on route {path!r}")
            if _documented(path, self.methods, policy):
                self.openapi_extra = document(self, idem.problem_media_type, policy)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler, with a guard added by ``include_router(dependencies=...)``
        documented on the inclusion's OpenAPI operation."""
        handler = super().get_route_handler()
        # Recent FastAPI builds each include_router() inclusion here, with its context set (older
        # versions copy the route, whose __init__ sees the inclusion's dependencies): a guard
        # added by include_router(dependencies=...) is documented on the inclusion.
        variable = getattr(fastapi.routing, "_effective_route_context_var", None)
        context = variable.get() if variable is not None else None
        if (
            context is not None
            and getattr(context, "original_route", None) is self
            and not _guards(self.dependencies)
        ):
            guards = _guards(context.dependencies)
            if guards:
                idem, options = _merged(guards)
                where = f"idem.guard(...) on route {context.path_format!r}"
                policy = derive(idem.policy, options, where)
                methods = getattr(context, "methods", None) or self.methods
                if _documented(context.path_format, methods, policy):
                    context.openapi_extra = document(context, idem.problem_media_type, policy)
        return handler

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the route: through the idempotency middleware when it declares
        ``idem.guard()``, else as FastAPI does."""
        template, dependencies = self._effective(scope)
        guards = _guards(dependencies)
        if not guards:
            await super().handle(scope, receive, send)
            return
        key = (template, tuple(id(guard) for guard in guards))
        middleware = self._idemkey.get(key)
        if middleware is None:  # once per route and inclusion: the policy is derived here
            idem, options = _merged(guards)
            known = KnownRoute(template, options)
            middleware = IdempotencyMiddleware(
                self._unguarded, idem.store, idem.policy, routes=known
            )
            self._idemkey[key] = middleware
        scope[SCOPE_KEY] = template
        await middleware(scope, receive, send)

    async def _unguarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().handle(scope, receive, send)

    def _effective(self, scope: Scope) -> tuple[str, Sequence[params.Depends]]:
        """The template and dependencies this request was routed with.

        Older FastAPI versions copy a route into each ``include_router`` (so ``self`` is the
        copy); recent ones keep one route and describe each inclusion in a context object.
        """
        lookup = getattr(fastapi.routing, "_get_scope_effective_route_context", None)
        context = lookup(scope) if lookup is not None else None
        if context is not None and getattr(context, "original_route", None) is self:
            return context.path_format, context.dependencies
        return self.path_format, self.dependencies


def _documented(path: str, methods: Collection[str] | None, policy: Policy) -> bool:
    """Whether a guarded route's operations document the guard: yes when its policy guards
    every method of the route, no when it guards none of them (a GET on a guarded router).

    FastAPI builds every method's operation of one route with the route's one
    ``openapi_extra``, so a route whose policy guards some of its methods only could not be
    documented as it runs: it is refused, naming the split that fixes it.
    """
    declared = set(methods or ())
    guarded = declared & policy.methods
    if guarded == declared:
        return bool(declared)
    if not guarded:
        return False
    names = ", ".join(sorted(guarded))
    raise ConfigurationError(
        f"route {path!r} ({', '.join(sorted(declared))}): its policy guards {names}, not "
        f"{', '.join(sorted(declared - guarded))}, and FastAPI documents every method of one "
        f"route alike, so /openapi.json could not say which need the {policy.header}. "
        f"Declare {names} on a route of its own (a second decorator on the same function), "
        "or guard every method with idem.guard(methods=[...])"
    )


def _guards(dependencies: Sequence[params.Depends]) -> list[_Guard]:
    found = (getattr(d.dependency, "__idemkey__", None) for d in dependencies)
    return [guard for guard in found if isinstance(guard, _Guard)]


def _merged(guards: list[_Guard]) -> tuple[Idempotency, dict[str, Any]]:
    """The integration of the innermost guard (the route's own, when it has one) and every
    guard's options, a router's first, the route's last (so the route's win)."""
    options: dict[str, Any] = {}
    for guard in guards:
        options.update(guard.options)
    return guards[-1].idem, options
