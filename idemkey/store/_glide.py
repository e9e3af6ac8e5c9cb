"""valkey-glide as AsyncRedisStore's client: the few redis-py operations the store sends,
over a ``glide.GlideClient`` or ``glide.GlideClusterClient``.

The store is written against redis-py's asyncio API (``execute_command``, pipelines,
``register_script``, ``get_primaries`` on a cluster). Rather than an ``if glide`` at each of
those places, ``AsyncHeartbeat`` wraps a glide client in :class:`GlideFacade` (or
:class:`GlideClusterFacade`) before the store sees it, and the store runs unchanged on it.
Only this module imports ``glide``; it is imported only when a glide client is given
(``_backend.is_glide``), so ``idemkey`` works without the extra installed.

What differs from redis-py, and why:

* Scripts go through ``invoke_script``: glide's core sends EVALSHA and, on NOSCRIPT (a restart,
  a failover, SCRIPT FLUSH), loads the script and sends again by itself, routed by the script's
  first key on a cluster. The store's own NOSCRIPT fallback is then never reached.
* glide multiplexes every command of a client on one connection per node, so a blocking
  command (XREAD BLOCK, WAIT) stalls all the others behind it. The store's waiters therefore
  poll (``_base._read_limit`` is 0 for this facade) and ``Policy.durability`` (EVALSHA + WAIT)
  is refused at construction with a ConfigurationError.
* glide's clients are asyncio (or trio through anyio) only: RedisStore refuses one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import glide
from glide import GlideClusterClient

from .._core._stored import stored_int
from ..errors import ConfigurationError
from ..policy import Policy
from ._backend import SCRIPT_KEYS

__all__ = [
    "BACKEND_ERRORS",
    "DROPPED_ERRORS",
    "GlideClusterFacade",
    "GlideFacade",
    "GlideNoScript",
    "facade_for",
]

Arg = str | bytes | int


class GlideNoScript(Exception):
    """NOSCRIPT from an ``EVALSHA`` sent with :meth:`GlideFacade.execute_command`: glide raises
    a plain ``RequestError`` for every server error, and the store needs this one by class."""


#: ``_backend._backend_errors`` for the facade. No "slot is moving" class: glide's core retries
#: TRYAGAIN and follows MOVED/ASK itself. The facade carries them (``idemkey_errors``), so
#: ``_backend``, which this module imports, imports nothing of it.
BACKEND_ERRORS: Final = ((glide.GlideError, GlideNoScript, OSError), GlideNoScript, ())

#: ``_backend._dropped_errors`` for the facade: a connection that closed under a command.
DROPPED_ERRORS: Final = (glide.ConnectionError, ConnectionError)


def _encode(args: Iterable[Arg]) -> list[str | bytes]:
    # glide takes text or bytes only; the store's numbers (lease ms, fence, flags) become text.
    return [arg if isinstance(arg, str | bytes) else str(arg) for arg in args]


def _noscript(exc: glide.RequestError) -> BaseException:
    return GlideNoScript(str(exc)) if "NoScriptError" in str(exc) else exc


def _parse_info(reply: Any) -> Any:
    """INFO's text as redis-py parses it (``{"name": "value"}``), for ``_info_settings``."""
    if not isinstance(reply, bytes | str):
        return reply
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else reply
    pairs = (line.partition(":") for line in text.splitlines() if line and line[0] != "#")
    return {name: value for name, _, value in pairs}


# glide.Script's constructor carries no annotations: called through Any, with or without glide.
_SCRIPT: Any = glide.Script


class _Encoder:
    """What ``StoreBase`` reads from ``get_encoder()``: replies stay bytes."""

    decode_responses: Final = False


_ENCODER: Final = _Encoder()


class GlideScript:
    """``register_script``'s result, as redis-py's ``AsyncScript``: ``sha``, ``script``, and
    a call with keys and args that sends it (loading it where the server lacks it)."""

    __slots__ = ("_facade", "_script", "script", "sha")

    def __init__(self, facade: GlideFacade, text: str) -> None:
        self._facade = facade
        self._script: glide.Script = _SCRIPT(text)
        self.script = text
        self.sha = self._script.get_hash()

    async def __call__(self, keys: Sequence[Arg] = (), args: Sequence[Arg] = ()) -> Any:
        return await self._facade.invoke(self._script, keys, args)


class _Pipeline:
    """``client.pipeline(transaction=False)`` for ``_async_status`` and ``_async_keeper``: the
    commands they queue, sent as one non-atomic glide batch (split by slot on a cluster)."""

    def __init__(self, facade: GlideFacade) -> None:
        self._facade = facade
        self._commands: list[list[str | bytes]] = []

    def execute_command(self, *args: Arg) -> _Pipeline:
        self._commands.append(_encode(args))
        return self

    def hmget(self, name: str, *fields: str) -> _Pipeline:
        return self.execute_command("HMGET", name, *fields)

    def hkeys(self, name: bytes | str) -> _Pipeline:
        return self.execute_command("HKEYS", name)

    def pttl(self, name: str) -> _Pipeline:
        return self.execute_command("PTTL", name)

    def pexpire(self, name: str, ms: int) -> _Pipeline:
        return self.execute_command("PEXPIRE", name, ms)

    def xadd(
        self, name: str, fields: Mapping[str, str], *, maxlen: int, approximate: bool = True
    ) -> _Pipeline:
        pairs = [part for pair in fields.items() for part in pair]
        trim = ("MAXLEN", "~" if approximate else "=", maxlen)
        return self.execute_command("XADD", name, *trim, "*", *pairs)

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        return await self._facade.batch(self._commands, raise_on_error)


class GlideFacade:
    """A standalone ``glide.GlideClient`` as the store's client (see the module docstring)."""

    #: Read by ``_base``: this client's waiters poll, never block (one multiplexed connection).
    multiplexed: Final = True
    #: Read by ``_base``: the errors to wrap, NOSCRIPT and "slot is moving"; a dropped
    #: connection's.
    idemkey_errors: Final = BACKEND_ERRORS
    idemkey_dropped_errors: Final = DROPPED_ERRORS

    def __init__(self, client: Any) -> None:
        #: The application's glide client; the store never closes it.
        self.glide = client
        self._scripts: dict[str, glide.Script] = {}

    def get_encoder(self) -> _Encoder:
        return _ENCODER

    def register_script(self, text: str) -> GlideScript:
        script = GlideScript(self, text)
        self._scripts[script.sha] = script._script
        return script

    async def idemkey_evalsha(self, sha: str, keys_and_args: tuple[Arg, ...]) -> Any:
        """The store's hot path (``AsyncRedisStore._evalsha``): one ``invoke_script``."""
        keys, args = keys_and_args[:SCRIPT_KEYS], keys_and_args[SCRIPT_KEYS:]
        return await self.invoke(self._scripts[sha], keys, args)

    async def invoke(self, script: glide.Script, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        return await self.glide.invoke_script(script, keys=_encode(keys), args=_encode(args))

    async def execute_command(self, *args: Arg, target_nodes: Any = None) -> Any:
        """One command; ``target_nodes`` (a node of :meth:`GlideClusterFacade.get_primaries`)
        sends it to that node of a cluster. INFO is parsed as redis-py parses it."""
        command = _encode(args)
        try:
            if target_nodes is None:
                reply = await self.glide.custom_command(command)
            else:
                route = glide.ByAddressRoute(target_nodes.host, target_nodes.port)
                reply = await self.glide.custom_command(command, route)
        except glide.RequestError as exc:
            raise _noscript(exc) from exc
        return _parse_info(reply) if command[0] in ("INFO", b"INFO") else reply

    async def xrevrange(
        self, name: str, maximum: str, minimum: str, count: int
    ) -> list[tuple[bytes, dict[bytes, bytes]]]:
        """XREVRANGE as redis-py answers it: ``[(id, {field: value})]``, newest first (glide
        answers ``{id: [[field, value], ...]}``, in the server's order)."""
        reply = await self.execute_command("XREVRANGE", name, maximum, minimum, "COUNT", count)
        if not reply:
            return []
        return [(entry_id, dict(pairs)) for entry_id, pairs in reply.items()]

    def pipeline(self, transaction: bool = False) -> _Pipeline:
        return _Pipeline(self)

    async def batch(self, commands: list[list[str | bytes]], raise_on_error: bool) -> list[Any]:
        batch = self._new_batch()
        for command in commands:
            batch.custom_command(command)
        replies = await self.glide.exec(batch, raise_on_error)
        return list(replies or ())

    def _new_batch(self) -> Any:
        return glide.Batch(is_atomic=False)


class GlideNode:
    """A cluster primary, as ``get_primaries()`` gives redis-py's: ``name`` is host:port."""

    __slots__ = ("host", "name", "port")

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port, self.name = host, port, f"{host}:{port}"


class GlideClusterFacade(GlideFacade):
    """A ``glide.GlideClusterClient``: the facade, plus the primaries for SCAN and acheck()."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self._primaries: list[GlideNode] = []

    def _new_batch(self) -> Any:
        return glide.ClusterBatch(is_atomic=False)

    def get_primaries(self) -> list[GlideNode]:
        """The primaries found by the last :meth:`initialize` (the store calls it first)."""
        return list(self._primaries)

    async def initialize(self) -> None:
        """Read the primaries from CLUSTER NODES (glide keeps its own slot map, unexposed)."""
        reply = await self.glide.custom_command(["CLUSTER", "NODES"], glide.RandomNode())
        text = reply.decode() if isinstance(reply, bytes) else str(reply)
        primaries = []
        for line in text.splitlines():
            fields = line.split()
            if len(fields) < 8 or "master" not in fields[2].split(",") or "fail" in fields[2]:
                continue
            address = fields[1].split("@", 1)[0]
            host, _, written = address.rpartition(":")
            # ASCII digits only: str.isdigit() also passes "²", which int() refuses.
            port = stored_int(written)
            if port is not None and fields[8:]:  # a primary that serves slots
                primaries.append(GlideNode(host, port))
        self._primaries = primaries


def facade_for(client: Any, policy: Policy | None) -> GlideFacade:
    """The facade for a glide client; ConfigurationError for what cannot work on glide."""
    if policy is not None and policy.durability is not None:
        raise ConfigurationError(
            "Policy.durability is not available on a valkey-glide client: WAIT blocks the "
            "client's one multiplexed connection, stalling every other request; use redis-py "
            "(redis.asyncio) for durable writes"
        )
    if isinstance(client, GlideClusterClient):
        return GlideClusterFacade(client)
    return GlideFacade(client)
