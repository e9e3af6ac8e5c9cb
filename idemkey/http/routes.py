"""Route selection: which requests an HTTP middleware guards, and with which options.

::

    from idemkey.routes import Routes, exempt, route

    routes = Routes(
        route("/charges"),                                   # the store's policy
        route("/charges/{charge_id}/refund", ttl=3600, wait=2.0),
        route("/v1/{rest:path}", require_key=False),         # everything under /v1/ ...
        exempt("/v1/login"),                                 # ... except the login
    )
    app = IdempotencyMiddleware(app, store, routes=routes)

Sans-IO: a :class:`Routes` is a frozen declaration; :meth:`Routes.bind` turns it, with the
middleware's policy, into a :class:`RouteTable` whose :meth:`~RouteTable.select` answers, for a
method and a path, either ``None`` (not guarded: the middleware passes the request through
untouched, with no Redis call and no body read) or a :class:`Selected` with the route template
(the bounded label that events, logs and metrics use, and the record's route) and the policy
for that route, derived once at bind time.

Patterns are paths with parameters: ``{name}`` matches one non-empty segment, ``{name:path}``
the rest of the path (one or more characters, slashes included). Rules, in order: an exemption
that matches wins; then a route without parameters that equals the path; then the first
declared route with parameters that matches. A guarded route still guards only the methods of
its policy (``methods=`` per route, else the policy's, POST and PATCH by default).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from .._options import Label, derive, policy_options
from ..errors import ConfigurationError

if TYPE_CHECKING:
    from ..policy import Policy

__all__ = [
    "ROUTE_UNKNOWN",
    "KnownRoute",
    "Route",
    "RouteTable",
    "Routes",
    "Selected",
    "exempt",
    "route",
]

#: The route label of a guarded request whose route template nobody knows (a middleware guarding
#: by method only): a fixed value, because the concrete path is an unbounded metric label.
ROUTE_UNKNOWN: Final = "<unknown>"

_PARAMETER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::([a-z]+))?\}")
_CONVERTERS: Final = {None: "[^/]+", "path": ".+"}


@dataclass(frozen=True, slots=True)
class Route:
    """One declared route: a pattern, its Policy overrides, or an exemption."""

    pattern: str
    options: tuple[tuple[str, Any], ...] = ()
    exempt: bool = False

    def __post_init__(self) -> None:
        _compile(self.pattern)  # refuse a malformed pattern when it is declared, not per request
        self.changes()

    def changes(self) -> dict[str, Any]:
        """The options as Policy field changes, typed and checked (errors name the route)."""
        pattern = self.pattern
        return policy_options(dict(self.options), lambda name: f"route({pattern!r}, {name}=...)")


def route(pattern: str, /, **options: Any) -> Route:
    """Guard ``pattern`` with the middleware's policy plus ``options`` (Policy fields, and
    ``required`` for ``require_key``)."""
    return Route(pattern, tuple(options.items()))


def exempt(pattern: str, /) -> Route:
    """Never guard ``pattern``, even where a guarded route's pattern also matches it."""
    return Route(pattern, exempt=True)


class Routes:
    """The routes a middleware guards; a plain string is ``route(string)``."""

    __slots__ = ("routes",)

    def __init__(self, *routes: Route | str) -> None:
        self.routes: tuple[Route, ...] = tuple(
            Route(r) if isinstance(r, str) else r for r in routes
        )
        for declared in self.routes:
            if not isinstance(declared, Route):
                raise ConfigurationError(
                    f"Routes takes route(...), exempt(...) or str: {declared!r}"
                )

    def bind(self, policy: Policy) -> RouteTable:
        """The routes with ``policy`` as the base of every route's options."""
        return RouteTable(self.routes, policy)

    def __repr__(self) -> str:
        return f"Routes{self.routes!r}"


@dataclass(frozen=True, slots=True)
class Selected:
    """A guarded request's route template (its label) and the policy that guards it."""

    route: str
    policy: Policy


class RouteTable:
    """:class:`Routes` bound to a policy: the per-request lookup, with no I/O."""

    __slots__ = ("_exact", "_exempt_exact", "_exempt_patterns", "_patterns")

    def __init__(self, routes: tuple[Route, ...], policy: Policy) -> None:
        self._exact: dict[str, Selected] = {}
        self._patterns: list[tuple[re.Pattern[str], Selected]] = []
        self._exempt_exact: set[str] = set()
        self._exempt_patterns: list[re.Pattern[str]] = []
        for declared in routes:
            compiled = _compile(declared.pattern)
            if declared.exempt:
                if compiled is None:
                    self._exempt_exact.add(declared.pattern)
                else:
                    self._exempt_patterns.append(compiled)
                continue
            derived = derive(policy, declared.changes(), f"route({declared.pattern!r})")
            selected = Selected(declared.pattern, derived)
            if compiled is None:
                self._exact.setdefault(declared.pattern, selected)  # the first declared wins
            else:
                self._patterns.append((compiled, selected))

    def select(self, method: str, path: str) -> Selected | None:
        """The guarded route of ``method path``, or None: pass the request through untouched."""
        if path in self._exempt_exact:
            return None
        for pattern in self._exempt_patterns:
            if pattern.fullmatch(path):
                return None
        selected = self._exact.get(path)
        if selected is None:
            for pattern, candidate in self._patterns:
                if pattern.fullmatch(path):
                    selected = candidate
                    break
            else:
                return None
        return selected if method in selected.policy.methods else None

    def select_mounted(self, method: str, path: str, other: str) -> Selected | None:
        """:meth:`select` of ``other`` (the same request's path with the mount prefix added or
        taken away) when ``path``, already selected to None, matched no route and no exemption.

        A ``path`` that matched decides alone: its route stays the one that names its record,
        and its exemption holds, whatever ``other`` would match.
        """
        if path in self._exact or path in self._exempt_exact:
            return None
        for pattern in self._exempt_patterns:
            if pattern.fullmatch(path):
                return None
        for pattern, _ in self._patterns:
            if pattern.fullmatch(path):
                return None
        return self.select(method, other)


class KnownRoute:
    """One route whose template the framework already matched (FastAPI, Starlette): every
    request that reaches it is selected, for the methods of its policy. The integrations pass
    it as ``routes=`` to the middleware they wrap around a single route."""

    __slots__ = ("options", "template")

    def __init__(
        self,
        template: str,
        options: Mapping[str, Any] | None = None,
        *,
        label: Label | None = None,
    ) -> None:
        """``label`` names an option in errors as the integration's caller spelled it."""
        self.template = template
        spelled = label or (lambda name: f"the options of route {template!r}: {name}")
        self.options = policy_options(options or {}, spelled)

    def bind(self, policy: Policy) -> _KnownTable:
        derived = derive(policy, self.options, f"route {self.template!r}")
        return _KnownTable(Selected(self.template, derived))


class _KnownTable:
    __slots__ = ("_selected",)

    def __init__(self, selected: Selected) -> None:
        self._selected = selected

    def select(self, method: str, path: str) -> Selected | None:
        selected = self._selected
        return selected if method in selected.policy.methods else None

    def select_mounted(self, method: str, path: str, other: str) -> Selected | None:
        return None  # the framework matched the route: a method it does not guard stays so


def _compile(pattern: str) -> re.Pattern[str] | None:
    """The regular expression of ``pattern``, or None when it has no parameters."""
    if not isinstance(pattern, str) or not pattern.startswith("/"):
        raise ConfigurationError(f"a route pattern is a path starting with '/': {pattern!r}")
    parts, end, names = [], 0, set()
    for match in _PARAMETER.finditer(pattern):
        name, converter = match.group(1), match.group(2)
        if converter not in _CONVERTERS:
            raise ConfigurationError(f"unknown converter {converter!r} in route {pattern!r}")
        if name in names:
            raise ConfigurationError(f"parameter {name!r} twice in route {pattern!r}")
        names.add(name)
        parts.append(re.escape(pattern[end : match.start()]))
        parts.append(_CONVERTERS[converter])
        end = match.end()
    if any("{" in text or "}" in text for text in _literals(pattern)):
        raise ConfigurationError(f"malformed parameter in route {pattern!r}")
    if not names:
        return None
    parts.append(re.escape(pattern[end:]))
    return re.compile("".join(parts))


def _literals(pattern: str) -> list[str]:
    """The text between parameters (a stray brace there is a typo, not a literal)."""
    return _PARAMETER.split(pattern)[::3]
