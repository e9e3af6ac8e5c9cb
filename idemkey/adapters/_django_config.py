"""The Django middleware's configuration: the ``IDEMKEY`` setting read into a store.

Kept apart from ``django.py``, which only translates requests and responses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils.module_loading import import_string

from .. import RedisStore
from .._options import derive, policy_options
from ..errors import ConfigurationError
from ..policy import Policy
from ..store._url import client_from_url

__all__ = ["configure"]


def configure(config: dict[str, Any]) -> tuple[RedisStore, Callable[..., Any] | None, bool]:
    """The store, the ``SCOPE`` callable and whether ``GUARD`` is ``"all"``, from a copy of
    ``settings.IDEMKEY`` (its keys are popped as they are read)."""
    store = config.pop("STORE", None)
    client = config.pop("CLIENT", None)
    url = config.pop("REDIS_URL", None)
    scope = _callable(config.pop("SCOPE", None))
    guard = config.pop("GUARD", "decorated")
    if guard not in ("decorated", "all"):
        raise ConfigurationError('IDEMKEY["GUARD"] must be "decorated" or "all"')
    spelled = {name.lower(): name for name in config}
    changes = policy_options(
        {name.lower(): value for name, value in config.items()},
        lambda name: f'IDEMKEY["{spelled.get(name, name.upper())}"] (Django settings)',
    )
    if store is None:
        if client is not None:
            factory = _callable(client)
            client = factory() if factory is not None else client
        elif url:
            client = client_from_url(url, source='IDEMKEY["REDIS_URL"]')
        else:
            raise ConfigurationError('set IDEMKEY["REDIS_URL"], ["CLIENT"] or ["STORE"]')
        store = RedisStore(client, derive(Policy(), changes, "settings.IDEMKEY"))
    elif not isinstance(store, RedisStore):
        raise ConfigurationError('IDEMKEY["STORE"] must be an idemkey.RedisStore')
    elif changes:
        policy = derive(store.policy, changes, "settings.IDEMKEY")
        store = RedisStore(store.client, policy, effects=store.effects)  # keep its database
    return store, scope, guard == "all"


def _callable(value: Any) -> Callable[..., Any] | None:
    """``value`` if it is a function or class, its import when it is a dotted path, else None."""
    if isinstance(value, str):
        imported: Callable[..., Any] = import_string(value)
        return imported
    if callable(value) and not hasattr(value, "execute_command"):  # a client is not a factory
        return value  # type: ignore[no-any-return]
    return None
