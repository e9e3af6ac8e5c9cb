"""The Django middleware's configuration: the ``IDEMKEY`` setting read into a store.

Kept apart from ``django.py``, which only translates requests and responses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.utils.module_loading import import_string

from .. import RedisStore
from .._options import derive, policy_options
from ..errors import ConfigurationError
from ..policy import Policy
from ..store._url import client_from_url
from ._checks import checked_store

__all__ = ["configure"]


def configure(setting: object) -> tuple[RedisStore, Callable[..., Any] | None, bool]:
    """The store, the ``SCOPE`` callable and whether ``GUARD`` is ``"all"``, from
    ``settings.IDEMKEY`` (a copy: its keys are popped as they are read)."""
    if not isinstance(setting, Mapping):
        raise ConfigurationError(
            "settings.IDEMKEY must be a dict, got "
            f'{type(setting).__name__}: IDEMKEY = {{"REDIS_URL": "redis://localhost:6379/0"}}'
        )
    config = dict(setting)
    store = config.pop("STORE", None)
    client = config.pop("CLIENT", None)
    url = config.pop("REDIS_URL", None)
    scope = config.pop("SCOPE", None)
    if scope is not None:
        scope = _imported(scope, "SCOPE")
        if not callable(scope):
            raise ConfigurationError(
                'IDEMKEY["SCOPE"]: expected a callable (or its dotted path) that takes the '
                f"request and returns its tenant as a str, got {type(scope).__name__}"
            )
    guard = config.pop("GUARD", "decorated")
    if guard not in ("decorated", "all"):
        raise ConfigurationError('IDEMKEY["GUARD"] must be "decorated" or "all"')
    spelled = {name.lower(): name for name in config}
    if len(spelled) < len(config):  # "TTL" and "ttl": one would be dropped silently
        twin = next(n for n in config if spelled[n.lower()] != n)
        both = sorted({twin, spelled[twin.lower()]})
        raise ConfigurationError(f'IDEMKEY has both "{both[0]}" and "{both[1]}": keep one')
    changes = policy_options(
        {name.lower(): value for name, value in config.items()},
        lambda name: f'IDEMKEY["{spelled.get(name, name.upper())}"] (Django settings)',
    )
    if store is None:
        policy = derive(Policy(), changes, "settings.IDEMKEY")
        made = _client(client, url)
        try:
            store = RedisStore(made, policy)
        except ConfigurationError as exc:  # the client's kind or library, as RedisStore checks
            setting = "CLIENT" if client is not None else "REDIS_URL"
            raise ConfigurationError(f'IDEMKEY["{setting}"]: {exc}') from None
    else:
        store = checked_store(store, RedisStore, 'IDEMKEY["STORE"]')
        if changes:
            policy = derive(store.policy, changes, "settings.IDEMKEY")
            store = RedisStore(store.client, policy, effects=store.effects)  # keep its database
    return store, scope, guard == "all"


def _client(client: object, url: object) -> Any:
    """The client of ``CLIENT`` (a client, a factory, or the dotted path of either) or
    ``REDIS_URL``; each mistake a ConfigurationError naming the setting."""
    if client is not None:
        client = _imported(client, "CLIENT")
        # A factory (a function, or a client class) is called; a client is taken as it is.
        if callable(client) and (
            isinstance(client, type) or not hasattr(client, "execute_command")
        ):
            try:
                return client()
            except Exception as exc:
                raise ConfigurationError(
                    f'IDEMKEY["CLIENT"]: the factory raised {type(exc).__name__}: {exc}'
                ) from exc
        return client
    if url is None or url == "":
        raise ConfigurationError('set IDEMKEY["REDIS_URL"], ["CLIENT"] or ["STORE"]')
    if not isinstance(url, str):
        raise ConfigurationError(
            f'IDEMKEY["REDIS_URL"]: expected a URL string, got {type(url).__name__}'
        )
    return client_from_url(url, source='IDEMKEY["REDIS_URL"]')


def _imported(value: object, name: str) -> object:
    """``value``, or what its dotted path names when it is a str."""
    if not isinstance(value, str):
        return value
    if "://" in value:  # a URL may hold a password: quote neither it nor an error quoting it
        raise ConfigurationError(
            f'IDEMKEY["{name}"]: it holds a URL (not shown: it may hold a password); a URL goes '
            f'in IDEMKEY["REDIS_URL"], and IDEMKEY["{name}"] takes an object or its dotted path'
        )
    try:
        return import_string(value)
    except ImportError as exc:
        raise ConfigurationError(f'IDEMKEY["{name}"]: cannot import {value!r}: {exc}') from exc
