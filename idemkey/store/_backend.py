"""The client's library, told from its class: which library (redis-py, valkey-py, glide's
facade), its error classes (wrapped as StoreError, NOSCRIPT, "slot is moving", a dropped
connection), the script key count and the retry delay while a slot moves. No I/O here; the
lower module of ``_base``, ``_packing``, ``_glide`` and ``_concurrency``.
"""

from __future__ import annotations

import time
from typing import Any, Final

__all__ = [
    "SCRIPT_KEYS",
    "asyncio_client",
    "client_module",
    "is_glide",
]

_Errors = tuple[type[BaseException], ...]


def client_module(client: Any) -> str:
    """The redis-py or valkey-py module the client's class comes from (``"redis.client"``,
    ``"valkey.asyncio.cluster"``, ...), looking through subclasses: an application's own
    ``class Client(valkey.Valkey)`` is valkey-py's, and its errors are valkey-py's."""
    for cls in type(client).__mro__:
        module = cls.__module__
        if module.split(".", 1)[0] in ("redis", "valkey"):
            return module
    return str(type(client).__module__)


def asyncio_client(client: Any) -> bool | None:
    """Whether ``client`` is an asyncio client of redis-py or valkey-py (standalone, cluster,
    sentinel, or a class derived from one: fakeredis's, an application's); None when it comes
    from neither library (glide's facade, a stand-in), which is not checked."""
    module = client_module(client)
    if module.split(".", 1)[0] not in ("redis", "valkey"):
        return None
    return module.split(".")[1:2] == ["asyncio"]


def is_glide(client: Any) -> bool:
    """Whether ``client`` is a valkey-glide client (``glide.GlideClient``, its cluster twin, or
    an application's subclass), told without importing glide (an optional extra)."""
    return any(cls.__module__.split(".", 1)[0] == "glide" for cls in type(client).__mro__)


def _glide_facade(client: Any) -> bool:
    """Whether ``client`` is the store's wrapper of a glide client (``_glide.GlideFacade``)."""
    return getattr(client, "multiplexed", False) is True and hasattr(client, "idemkey_evalsha")


def _backend_errors(client: Any) -> tuple[_Errors, type[BaseException], _Errors]:
    """(errors to wrap as StoreError, the NOSCRIPT error, "slot is moving" errors) of the
    client's library.

    The cluster client raises its topology errors (no reachable node, slots not covered during
    a failover) as a class outside the RedisError tree; they are store errors all the same.
    """
    if _glide_facade(client):  # the facade says its own (``_glide.BACKEND_ERRORS``)
        facade_errors: tuple[_Errors, type[BaseException], _Errors] = client.idemkey_errors
        return facade_errors
    module = client_module(client)
    # Both asyncio cluster clients (valkey-py forked redis-py's) can tear a connection down
    # under a task that is using it while the topology changes (a slot moving, a failover: on
    # every fifth MOVED the client closes all its connections); the task then gets
    # AttributeError ("'NoneType' object has no attribute 'writelines'") or the library's
    # ConnectionError ("Connection closed by server"). Both are retried like a moving slot
    # (sending a script twice with one owner is safe), then a StoreError; a connection that
    # could not be made is not (``_slot_moving``).
    on_asyncio_cluster = module.endswith(".asyncio.cluster")
    if module.startswith("valkey"):
        from valkey.exceptions import ClusterError as ValkeyClusterError
        from valkey.exceptions import ConnectionError as ValkeyConnectionError
        from valkey.exceptions import NoScriptError as ValkeyNoScript
        from valkey.exceptions import TryAgainError as ValkeyTryAgain
        from valkey.exceptions import ValkeyClusterException, ValkeyError

        torn_down: _Errors = (AttributeError, ValkeyConnectionError) if on_asyncio_cluster else ()
        errors: _Errors = (ValkeyError, ValkeyClusterException, OSError, *torn_down)
        return errors, ValkeyNoScript, (ValkeyClusterError, ValkeyTryAgain, *torn_down)
    from redis.exceptions import (
        ClusterError,
        NoScriptError,
        RedisClusterException,
        RedisError,
        TryAgainError,
    )
    from redis.exceptions import ConnectionError as RedisConnectionError

    torn_down = (AttributeError, RedisConnectionError) if on_asyncio_cluster else ()
    return (
        (RedisError, RedisClusterException, OSError, *torn_down),
        NoScriptError,
        (ClusterError, TryAgainError, *torn_down),
    )


#: The keys every script of a record takes: the record's hash alone, its lease a field of it,
#: so a cluster slot being migrated serves each script through ASK (docs/design.md, "One key").
#: Code that splits a script call's ``keys_and_args`` (the glide facade's ``invoke_script``)
#: splits it here.
SCRIPT_KEYS: Final = 1


def _never_connected(exc: BaseException) -> bool:
    """Whether ``exc`` is a connection that could not be made (refused, unreachable, a connect
    timeout), not one that closed under a command: nothing reached Redis, and the client's own
    retries already tried again, so one more send would only double the wait."""
    if "connecting to" in str(exc):  # redis-py's and valkey-py's message for a failed connect
        return True
    cause = exc.__cause__ or exc.__context__
    return isinstance(cause, ConnectionRefusedError)


def _dropped_errors(client: Any) -> _Errors:
    """The errors of a connection that closed under a command (a server restart, a reset): the
    client's ``ConnectionError`` (its subclasses included) and the builtin one. Not timeouts:
    sending again after one would double the wait on a server that does not answer."""
    if _glide_facade(client):  # ``_glide.DROPPED_ERRORS``
        dropped: _Errors = client.idemkey_dropped_errors
        return dropped
    if client_module(client).startswith("valkey"):
        from valkey.exceptions import ConnectionError as ValkeyConnectionError

        return (ValkeyConnectionError, ConnectionError)
    from redis.exceptions import ConnectionError as RedisConnectionError

    return (RedisConnectionError, ConnectionError)


def _slot_moving(exc: BaseException, moving: _Errors) -> bool:
    """Whether Redis Cluster refused the script because its slot is being migrated.

    A script touches one key, the record, so a migrating slot serves it through ASK (idemkey
    0.2's scripts touched two, and met TRYAGAIN until the slot had moved). What is left: the
    client's redirect handling gives up after its tries (``ClusterError("TTL exhausted.")``,
    exactly that class; ``ClusterDownError`` is a subclass and means something else), TRYAGAIN
    for a script sent while a node still answers for both sides, or a connection the asyncio
    cluster client tore down under the call (``_backend_errors``). Sending the script again is
    safe: every script answers a re-send by its owner as it answered the first.
    On an asyncio cluster client a connection torn down under the call counts too (see
    ``_backend_errors``), but not one that could not be made.
    """
    return type(exc) in moving and not _never_connected(exc)


def _retry_delay(previous: float, deadline: float) -> float:
    """Backoff while a cluster slot moves or a redirect settles: 10 ms doubling to 100 ms."""
    return min(max(previous * 2, 0.01), 0.1, max(0.0, deadline - time.monotonic()))
