"""What the integrations' constructors check of their arguments: the store's kind, the policy,
the routes.

A store of the other kind, a raw client, a dict for a policy or a list for ``routes`` would
otherwise pass construction and fail at the first request (a 500, the misuse far from its
cause), so each is refused when the app is built, with a ConfigurationError that names the
parameter and what it takes. Constructors only: a request pays nothing for these checks.
"""

from __future__ import annotations

from typing import TypeVar

from ..errors import ConfigurationError
from ..guard._policy_check import check_guard_policy
from ..http.routes import KnownRoute, Route, Routes
from ..policy import Policy
from ..store import AsyncRedisStore, RedisStore

__all__ = [
    "checked_guard_policy",
    "checked_policy",
    "checked_routes",
    "checked_store",
    "described",
]

S = TypeVar("S", RedisStore, AsyncRedisStore)


def described(value: object, kind: type[RedisStore | AsyncRedisStore]) -> str:
    """What ``value`` is, and how to make the ``kind`` of store wanted instead."""
    if isinstance(value, AsyncRedisStore):
        return (
            "an AsyncRedisStore, whose calls are awaited: this one calls its store "
            "synchronously, so pass RedisStore(redis.Redis(...))"
        )
    if isinstance(value, RedisStore):
        return (
            "a RedisStore, whose calls block: this one awaits its store, so pass "
            "AsyncRedisStore(redis.asyncio.Redis(...))"
        )
    kind_of = value if isinstance(value, type) else type(value)
    if hasattr(value, "execute_command"):
        return (
            f"a Redis client ({kind_of.__module__}.{kind_of.__qualname__}), not a store: pass "
            f"{kind.__name__}(client)"
        )
    return kind_of.__name__


def checked_store(store: object, kind: type[S], where: str) -> S:
    """``store`` if it is a ``kind``; else a ConfigurationError naming ``where``."""
    if not isinstance(store, kind):
        raise ConfigurationError(
            f"{where}: expected an idemkey.{kind.__name__}, got {described(store, kind)}"
        )
    return store


def checked_policy(policy: object, where: str) -> Policy | None:
    """``policy`` if it is a Policy or None."""
    if policy is not None and not isinstance(policy, Policy):
        raise ConfigurationError(
            f"{where}: expected an idemkey.Policy or None, got {type(policy).__name__} "
            "(Policy(ttl=..., ...) builds one)"
        )
    return policy


def checked_guard_policy(policy: object, store: Policy | None, where: str) -> Policy | None:
    """``policy`` if it is None or a Policy a guard can honour over the ``store``'s policy
    (Celery, MCP; ``store`` None: not known yet, a factory's store)."""
    checked = checked_policy(policy, where)
    if checked is not None and store is not None:
        try:
            check_guard_policy(checked, store)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc}") from None
    return checked


def checked_routes(routes: object, where: str) -> Routes | KnownRoute | None:
    """``routes`` if it is a Routes (or an integration's KnownRoute) or None. A list is
    refused rather than wrapped: the error shows the one spelling every middleware takes."""
    if routes is None or isinstance(routes, (Routes, KnownRoute)):
        return routes
    if isinstance(routes, Route):
        got = "a single route: write routes=Routes(route(...))"
    elif isinstance(routes, str):
        got = f"the string {routes!r}: write routes=Routes({routes!r})"
    elif isinstance(routes, (list, tuple)):
        got = f"{type(routes).__name__}: write routes=Routes(*[...])"
    else:
        got = f"{type(routes).__name__}: build one, Routes(route('/charges', ttl=60), ...)"
    raise ConfigurationError(f"{where}: expected a Routes(...) or None, got {got}")
