"""Script calls on an asyncio cluster client, ASK followed on one connection; hand-written, twin
of ``_sync_redirect``.

redis-py 8.1's and valkey-py 6.2's asyncio cluster clients follow an ASK redirect with two calls,
``ASKING`` and then the command, each on whatever pooled connection of the importing node is
free. With several tasks the command often goes out on another connection than its ASKING; the
importing node answers MOVED, the request bounces until ``TTL exhausted``, and every fifth MOVED
the client closes all its connections under the other tasks (docs/upstream/redis-py-async-ask.md,
scripts/redis_py_ask_repro.py). So on those clients the store routes its script calls itself:

* to the node the client's slot cache names for the key (the first key; the client would pick
  the same node, and a script's keys share one slot);
* an ASK is followed by ``ASKING`` and the script packed in one write on one connection of the
  node named, both replies read (the node's ``execute_pipeline``, as ``send_with_wait`` uses);
* a MOVED makes the client learn the topology again, and the script goes to the new node;
* a NOSCRIPT loads the script on the node that said so, and sends it again;
* the first redirect is followed at once; more are followed for up to the store's
  ``slot_moving_wait``, then the last one is raised (the store makes it a StoreError). A
  TRYAGAIN (a multi-key script in a half-moved slot) is raised at once, for the store's own
  slot-moving retry, which sends through here again.

Any other failure (a dropped or torn-down connection, a timeout, a slot the cache does not know)
is handed to the client's own ``execute_command``, which sends the script once more with its
reconnects, topology refresh and retries: safe, as every script answers a re-send by its owner
as it answered the first.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from .._backend import SCRIPT_KEYS, _retry_delay, client_module
from ._async_runtime import sleep

__all__ = ["ClusterRoute", "route_for"]

_Errors = tuple[type[BaseException], ...]


class ClusterRoute:
    """EVALSHA to the key's node, redirects followed by the store (see the module's doc)."""

    def __init__(
        self,
        client: Any,
        scripts: Mapping[str, Any],
        handover: _Errors,
        wait: Callable[[], float],
    ) -> None:
        module = client_module(client)
        errors = importlib.import_module(module.split(".", 1)[0] + ".exceptions")
        self._client = client
        self._scripts = scripts  # the store's registered scripts: their text for a NOSCRIPT
        self._handover = handover
        self._wait = wait
        self._ask: type[BaseException] = errors.AskError
        self._moved: type[BaseException] = errors.MovedError
        self._noscript: type[BaseException] = errors.NoScriptError
        self._followed: _Errors = (self._ask, self._moved, self._noscript)
        # Raised to the store as they are, never handed to the client (whose ASK handling is
        # what this module avoids): TRYAGAIN goes to the store's slot-moving retry.
        self._raised: _Errors = (self._ask, self._moved, errors.TryAgainError)
        self._pipeline_command: Any = importlib.import_module(module).PipelineCommand
        #: ``numkeys`` of the script calls sent (``_backend.SCRIPT_KEYS``).
        self.keys = SCRIPT_KEYS

    async def evalsha(self, sha: str, keys_and_args: tuple[str | bytes | int, ...]) -> Any:
        command = ("EVALSHA", sha, self.keys, *keys_and_args)
        client = self._client
        try:
            await client.initialize()  # a no-op once the client knows the topology
            node = client.get_node_from_key(keys_and_args[0])
            try:
                return await node.execute_command(*command)
            except self._followed as exc:
                return await self._follow(exc, node, command)
        except self._handover as exc:
            if isinstance(exc, self._raised):
                raise
            return await client.execute_command(*command)

    async def _follow(self, exc: BaseException, node: Any, command: tuple[Any, ...]) -> Any:
        deadline, delay = time.monotonic() + self._wait(), 0.0
        asking, first = False, True
        while True:
            if isinstance(exc, self._moved):  # first: MovedError subclasses AskError
                await self._learn_topology()
                node, asking = self._client.get_node_from_key(command[3]), False
            elif isinstance(exc, self._ask):
                node, asking = await self._node(exc), True
                if node is None:
                    raise exc
            else:  # NOSCRIPT: this node never saw the script (a new master, a restart)
                await node.execute_command("SCRIPT", "LOAD", self._text(exc, command[1]))
            # The first redirect is followed at once, whatever the wait (following one is not
            # waiting for a slot to move); a loop of them backs off until the wait runs out.
            if not first:
                if time.monotonic() >= deadline:
                    raise exc
                await sleep(delay := _retry_delay(delay, deadline))
            first = False
            try:
                if asking:
                    return await self._asking(node, command)
                return await node.execute_command(*command)
            except self._followed as again:
                exc = again

    async def _asking(self, node: Any, command: tuple[Any, ...]) -> Any:
        """ASKING and the command in one write on one connection of ``node``: the importing
        node honours ASKING for the next command of the same connection only."""
        queued = [self._pipeline_command(0, "ASKING"), self._pipeline_command(1, *command)]
        await node.execute_pipeline(queued)
        reply = queued[1].result
        if isinstance(reply, BaseException):
            raise reply
        return reply

    async def _node(self, ask: Any) -> Any:
        """The node an ASK names, learning the topology once if the client does not know it."""
        node = self._client.get_node(host=ask.host, port=ask.port)
        if node is None:
            await self._learn_topology()
            node = self._client.get_node(host=ask.host, port=ask.port)
        return node

    async def _learn_topology(self) -> None:
        # A failure here is left to the next send, which fails or is redirected and says why.
        with contextlib.suppress(*self._handover):
            await self._client.nodes_manager.initialize()

    def _text(self, exc: BaseException, sha: str) -> Any:
        for script in self._scripts.values():
            if script.sha == sha:
                return script.script
        raise exc


def route_for(
    client: Any, scripts: Mapping[str, Any], handover: _Errors, wait: Callable[[], float]
) -> ClusterRoute | None:
    """The store's own route for an asyncio cluster client (redis-py's or valkey-py's), else
    None: the sync cluster clients send ASKING and the command on one connection themselves,
    and a client of one server is never redirected."""
    if not client_module(client).endswith(".asyncio.cluster"):
        return None
    return ClusterRoute(client, scripts, handover, wait)
