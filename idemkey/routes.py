"""Route selection, where 0.2 users import it from; the code lives in :mod:`idemkey.http.routes`."""

from __future__ import annotations

from .http.routes import (
    ROUTE_UNKNOWN,
    KnownRoute,
    Route,
    Routes,
    RouteTable,
    Selected,
    exempt,
    route,
)

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
