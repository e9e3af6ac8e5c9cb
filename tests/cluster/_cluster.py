"""A real Redis Cluster of ``redis-server`` processes on free ports, for tests.

:class:`ClusterProcesses` starts ``masters * (1 + replicas)`` :class:`tests._servers.RedisServer`
processes with ``--cluster-enabled yes`` (Redis or Valkey, whichever the suite runs), joins them
as ``redis-cli --cluster create ... --cluster-replicas N`` would, over the protocol (no
``redis-cli`` needed), waits (with a deadline) until every node agrees the
cluster is up, and tears everything down on :meth:`ClusterProcesses.close`. Each node's bus port
is chosen free too (``--cluster-port``, Redis 7+), so the usual "port + 10000" clash cannot happen.

The levers fault tests need sit here as well: kill a master and wait for its replica to be
promoted, restart a node, and move a slot between masters by hand (``CLUSTER SETSLOT
IMPORTING/MIGRATING`` + ``MIGRATE``), one batch at a time, so a test can run requests while a
slot is half-moved.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import redis
import redis.asyncio.cluster
import redis.cluster
from redis.cluster import ClusterNode
from redis.crc import key_slot

from tests._servers import (
    HOST,
    RedisServer,
    RedisServerError,
    free_port,
    no_retry,
    redis_server_executable,
    retried_on_a_taken_port,
    server_version,
    wait_until,
    write_confirmed,
)

__all__ = ["ClusterProcesses", "running_cluster"]

SLOTS = 16384


def _server_version() -> tuple[int, ...]:
    exe = redis_server_executable()
    return server_version(exe)[1][:2] if exe else (0, 0)


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def _info(text: bytes | str | dict[str, Any]) -> dict[str, str]:
    """INFO / CLUSTER INFO as a dict of strings, whether redis-py parsed it already or not."""
    if isinstance(text, dict):
        return {str(name): str(value) for name, value in text.items()}
    if isinstance(text, bytes):
        text = text.decode()
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {name.strip(): value.strip() for name, value in pairs}


class ClusterProcesses:
    """A Redis Cluster made of private ``redis-server`` processes on 127.0.0.1.

    ``node_timeout_ms`` is ``cluster-node-timeout``: a killed master is failed over after about
    twice that. Kept low so failover tests finish quickly.
    """

    def __init__(
        self,
        masters: int = 3,
        replicas: int = 1,
        *,
        node_timeout_ms: int = 1500,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
    ) -> None:
        self._bus_ports: dict[RedisServer, int] = {}  # each node's cluster bus port
        self.masters_wanted = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.startup_timeout = startup_timeout
        self.nodes: list[RedisServer] = []
        self._extra_args = list(extra_args)

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> ClusterProcesses:
        try:
            for _ in range(self.masters_wanted * (1 + self.replicas)):
                self.nodes.append(retried_on_a_taken_port(self._started_node))
            self._create()
            self.wait_healthy(self.startup_timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _create(self) -> None:
        """What ``redis-cli --cluster create --cluster-replicas N`` does, over the protocol.

        No ``redis-cli`` needed, so a machine with only a packaged ``valkey-server`` (no apt
        step) runs the cluster tests too: distinct config epochs, the slots split evenly over
        the first ``masters`` nodes, every node met, then each replica told whom to follow.
        """
        masters = self.nodes[: self.masters_wanted]
        for epoch, node in enumerate(self.nodes, start=1):
            self._ask(node, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
        for index, master in enumerate(masters):
            first = index * SLOTS // len(masters)
            last = (index + 1) * SLOTS // len(masters) - 1
            self._ask(master, "CLUSTER", "ADDSLOTS", *range(first, last + 1))
        first_node = self.nodes[0]
        for node in self.nodes[1:]:
            # Redis 7 takes the bus port (chosen free, above); before, it is always port + 10000.
            bus = [self._bus_ports[node]] if _server_version() >= (7, 0) else []
            self._ask(first_node, "CLUSTER", "MEET", HOST, node.port, *bus)
        self._wait(self._all_met, self.startup_timeout, "every cluster node to know every other")
        for index, replica in enumerate(self.nodes[self.masters_wanted :]):
            master = masters[index % len(masters)]
            self._ask(replica, "CLUSTER", "REPLICATE", self.node_id(master))
        self._wait(self._replicas_known, self.startup_timeout, "every node to know the replicas")

    def _cluster_nodes(self, node: RedisServer) -> list[list[str]]:
        return [line.split() for line in self._ask(node, "CLUSTER", "NODES").decode().splitlines()]

    def _all_met(self) -> bool:
        """Every node lists every node, none of them still in the handshake."""
        for node in self.nodes:
            lines = self._cluster_nodes(node)
            if len(lines) != len(self.nodes) or any("handshake" in ln[2] for ln in lines):
                return False
        return True

    def _replicas_known(self) -> bool:
        wanted = self.masters_wanted * self.replicas
        return all(
            sum("slave" in ln[2].split(",") for ln in self._cluster_nodes(node)) == wanted
            for node in self.nodes
        )

    def _started_node(self) -> RedisServer:
        """A new node, answering PING. Its ports are both given (RedisServer would pick a fresh
        one for itself only, not for the bus port among its arguments): a port another process
        took fails the start, which :func:`retried_on_a_taken_port` makes again on fresh ones."""
        node = self._new_node()
        try:
            return node.start()
        except BaseException:
            self._bus_ports.pop(node, None)
            node.close()
            raise

    def _new_node(self) -> RedisServer:
        args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",  # in the server's own temporary directory
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
            # A replica whose master died long ago may still be promoted: tests kill masters.
            "--cluster-replica-validity-factor",
            "0",
            # Replicas sync at once (not after the default 5 s), at start and after a restart.
            "--repl-diskless-sync-delay",
            "0",
            *self._extra_args,
        ]
        if _server_version() >= (7, 0):
            bus_port = free_port()
            node = RedisServer([*args, "--cluster-port", str(bus_port)], port=free_port())
            self._bus_ports[node] = bus_port
            return node
        # Before 7.0 the bus port is always port + 10000: find a port whose twin is free too.
        for _ in range(50):
            port = free_port()
            if port + 10000 < 65536 and _port_is_free(port + 10000):
                node = RedisServer(args, port=port)
                self._bus_ports[node] = port + 10000
                return node
        raise RedisServerError("no free port pair for a cluster node")

    def close(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.close()

    def __enter__(self) -> ClusterProcesses:
        return self.start() if not self.nodes else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- clients ------------------------------------------------------------------------------

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        return [ClusterNode(HOST, node.port) for node in self.nodes if node.running]

    def client(self, **kwargs: Any) -> redis.cluster.RedisCluster:
        """A ``RedisCluster`` (bytes replies, bounded socket timeouts unless overridden)."""
        kwargs.setdefault("decode_responses", False)
        kwargs.setdefault("socket_timeout", 5.0)
        kwargs.setdefault("socket_connect_timeout", 2.0)
        return redis.cluster.RedisCluster(startup_nodes=self.startup_nodes, **kwargs)

    def async_client(self, **kwargs: Any) -> redis.asyncio.cluster.RedisCluster:
        """The asyncio twin of :meth:`client` (close it with ``aclose()``)."""
        kwargs.setdefault("decode_responses", False)
        kwargs.setdefault("socket_timeout", 5.0)
        kwargs.setdefault("socket_connect_timeout", 2.0)
        nodes = [
            redis.asyncio.cluster.ClusterNode(HOST, node.port)
            for node in self.nodes
            if node.running
        ]
        return redis.asyncio.cluster.RedisCluster(startup_nodes=nodes, **kwargs)

    def node_client(self, node: RedisServer, **kwargs: Any) -> redis.Redis:
        """A plain client on one node, for CLUSTER commands (short timeouts, no retries)."""
        kwargs.setdefault("socket_timeout", 2.0)
        kwargs.setdefault("socket_connect_timeout", 1.0)
        kwargs.setdefault("retry", no_retry())
        return node.client(**kwargs)

    # ---- topology -----------------------------------------------------------------------------

    def _ask(self, node: RedisServer, *command: str | int) -> Any:
        client = self.node_client(node)
        try:
            return client.execute_command(*command)
        finally:
            client.close()

    def node_by_port(self, port: int) -> RedisServer:
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(port)

    def node_id(self, node: RedisServer) -> str:
        return str(self._ask(node, "CLUSTER", "MYID").decode())

    def topology(self) -> dict[int, tuple[int, int]]:
        """``{master port: (first slot, last slot)}`` as a live node sees it (first range)."""
        for node in self.nodes:
            if not node.running or node.paused:
                continue
            with contextlib.suppress(redis.RedisError):
                ranges = self._ask(node, "CLUSTER", "SLOTS")
                return {int(r[2][1]): (int(r[0]), int(r[1])) for r in ranges}
        raise RedisServerError("no live node answers CLUSTER SLOTS")

    def master_for_slot(self, slot: int) -> RedisServer:
        for node in self.nodes:
            if not node.running or node.paused:
                continue
            with contextlib.suppress(redis.RedisError):
                for first, last, master, *_ in self._ask(node, "CLUSTER", "SLOTS"):
                    if int(first) <= slot <= int(last):
                        return self.node_by_port(int(master[1]))
        raise RedisServerError(f"no live node knows who serves slot {slot}")

    def masters(self) -> list[RedisServer]:
        """The running nodes that are masters now (their own view)."""
        found = []
        for node in self.nodes:
            if node.running and not node.paused:
                with contextlib.suppress(redis.RedisError):
                    if _info(self._ask(node, "INFO", "replication")).get("role") == "master":
                        found.append(node)
        return found

    def replicas_of(self, master: RedisServer) -> list[RedisServer]:
        master_id = self.node_id(master)
        found = []
        for node in self.nodes:
            if node is master or not node.running or node.paused:
                continue
            with contextlib.suppress(redis.RedisError):
                lines = self._ask(node, "CLUSTER", "NODES").decode().splitlines()
                me = next(line.split() for line in lines if "myself" in line.split()[2])
                if me[3] == master_id:
                    found.append(node)
        return found

    def healthy(self) -> bool:
        """Every running node says cluster_state ok, knows every slot, and has no failing peer.

        A node that is down is expected to be flagged ``fail`` by the others; it does not make
        the cluster unhealthy as long as its slots are served by a promoted replica.
        """
        running = [node for node in self.nodes if node.running and not node.paused]
        masters_seen: set[int] | None = None
        for node in running:
            try:
                info = _info(self._ask(node, "CLUSTER", "INFO"))
                slots = self._ask(node, "CLUSTER", "SLOTS")
            except redis.RedisError:
                return False
            if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != str(SLOTS):
                return False
            masters = {int(r[2][1]) for r in slots}
            if masters_seen is None:
                masters_seen = masters
            elif masters != masters_seen:
                return False  # the nodes do not agree (yet) on who serves what
            live_ports = {n.port for n in running}
            if not masters <= live_ports:
                return False
        return masters_seen is not None

    def wait_healthy(self, timeout: float = 20.0) -> None:
        wait_until(self.healthy, timeout, "the Redis cluster to be healthy", interval=0.05)

    def replicas_synced(self) -> bool:
        """Every master has its replicas connected, each at the master's replication offset."""
        for master in self.masters():
            info = self._ask(master, "INFO", "replication")  # parsed by redis-py
            if int(info.get("connected_slaves", 0)) < self.replicas:
                return False
            offset = int(info.get("master_repl_offset", -1))
            replicas = [v for k, v in info.items() if k.startswith("slave") and k[5:].isdigit()]
            for replica in replicas:
                if replica.get("state") != "online" or int(replica.get("offset", -2)) != offset:
                    return False
        return True

    def wait_replicas_synced(self, timeout: float = 20.0) -> None:
        self._wait(self.replicas_synced, timeout, "every replica to catch up")

    def slots_of(self, master: RedisServer) -> list[tuple[int, int]]:
        """The slot ranges ``master`` serves, as a live node sees them now."""
        for node in self.nodes:
            if not node.running or node.paused:
                continue
            with contextlib.suppress(redis.RedisError):
                ranges = self._ask(node, "CLUSTER", "SLOTS")
                return [(int(r[0]), int(r[1])) for r in ranges if int(r[2][1]) == master.port]
        raise RedisServerError("no live node answers CLUSTER SLOTS")

    def _replica_link_up(self, replica: RedisServer, master: RedisServer) -> bool:
        """``replica`` says it replicates ``master``, its link is up and no sync is running."""
        info = _info(self._ask(replica, "INFO", "replication"))
        return (
            info.get("role") == "slave"
            and info.get("master_port") == str(master.port)
            and info.get("master_link_status") == "up"
            and info.get("master_sync_in_progress") == "0"
        )

    def _replica_offset(self, replica: RedisServer, master: RedisServer) -> int | None:
        """The offset ``master`` last had acknowledged by ``replica`` (online), else None."""
        info = self._ask(master, "INFO", "replication")  # parsed by redis-py
        for name, value in info.items():
            if not (name.startswith("slave") and name[5:].isdigit()):
                continue
            if int(value.get("port", -1)) == replica.port and value.get("state") == "online":
                return int(value.get("offset", -1))
        return None

    def wait_replica_attached(
        self, replica: RedisServer, master: RedisServer, timeout: float = 60.0
    ) -> None:
        """Wait until ``replica`` is ``master``'s replica and has caught up with it.

        Three waits, each with its own deadline so a timeout names the one that stalled: the
        replica reports ``master_link_status:up`` towards ``master`` with no sync in progress
        (after a full resync of the dataset); the master lists it ``online`` with an
        acknowledged offset that reaches the master's offset read once the link was up (writes
        keep flowing under load, so "equal" could be a moving target; "reached" is monotone);
        and a new write on ``master`` is confirmed by ``WAIT 1``. From then on a durable write
        on ``master`` is answered by this replica.
        """
        self._wait(
            lambda: self._replica_link_up(replica, master),
            timeout,
            f"node {replica.port} to replicate {master.port} with master_link_status:up",
        )
        target = int(self._ask(master, "INFO", "replication").get("master_repl_offset", 0))
        self._wait(
            lambda: (self._replica_offset(replica, master) or -1) >= target,
            timeout,
            f"node {replica.port} to acknowledge {master.port}'s offset {target}",
        )
        # "Online" at the reached offset is not yet streaming: after a diskless full sync the
        # master sends new writes only once the replica's first ACK comes (up to a second, seen
        # here holding a durable claim's WAIT at 0 for 500 ms).
        probe = self._key_on(master)
        client = self.node_client(master)
        try:
            self._wait(
                lambda: write_confirmed(client, probe),
                timeout,
                f"node {replica.port} to acknowledge a new write on {master.port}",
            )
        finally:
            client.close()

    def _wait(self, predicate: Callable[[], object], timeout: float, message: str) -> None:
        """Poll a node's state every 50 ms, through the errors of a node still starting."""
        wait_until(predicate, timeout, message, interval=0.05, ignore=(redis.RedisError,))

    def _key_on(self, master: RedisServer) -> str:
        """A key in a slot ``master`` serves."""
        ranges = self.slots_of(master)
        for i in range(100_000):
            key = f"idemkey-probe-{i}"
            if any(first <= key_slot(key.encode()) <= last for first, last in ranges):
                return key
        raise RedisServerError(f"no probe key found for node {master.port}")

    def kill_master_for_slot(self, slot: int) -> RedisServer:
        """SIGKILL the master serving ``slot``; returns it (restart it with ``restart_node``)."""
        master = self.master_for_slot(slot)
        master.kill()
        return master

    def wait_failover(self, slot: int, old: RedisServer, timeout: float = 20.0) -> RedisServer:
        """Wait until a running node other than ``old`` serves ``slot`` and the cluster is ok."""

        def promoted() -> RedisServer | None:
            try:
                master = self.master_for_slot(slot)
            except RedisServerError:
                return None
            return master if master is not old and self.healthy() else None

        return wait_until(promoted, timeout, f"a replica to take over slot {slot}", interval=0.05)

    def restart_node(self, node: RedisServer, timeout: float = 20.0) -> None:
        """Start a killed node again; it rejoins (as a replica of its promoted replica)."""
        node.restart(kill=True)
        self._wait(
            lambda: _info(self._ask(node, "CLUSTER", "INFO")).get("cluster_state") == "ok",
            timeout,
            "the restarted node to rejoin",
        )
        self.wait_healthy(timeout)

    # ---- slot migration by hand ---------------------------------------------------------------

    def begin_migration(self, slot: int, target: RedisServer) -> RedisServer:
        """Mark ``slot`` IMPORTING on ``target`` and MIGRATING on its master; return the master."""
        source = self.master_for_slot(slot)
        if source is target:
            raise ValueError("the target already serves the slot")
        source_id, target_id = self.node_id(source), self.node_id(target)
        self._ask(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        self._ask(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        return source

    def migrate_some(self, slot: int, source: RedisServer, target: RedisServer, count: int) -> int:
        """MIGRATE up to ``count`` keys of ``slot`` from ``source`` to ``target``; how many."""
        keys = self._ask(source, "CLUSTER", "GETKEYSINSLOT", slot, count)
        if keys:
            self._ask(source, "MIGRATE", HOST, target.port, "", 0, 5000, "REPLACE", "KEYS", *keys)
        return len(keys)

    def finish_migration(self, slot: int, source: RedisServer, target: RedisServer) -> None:
        """Move the keys left, then give the slot to ``target`` on every master."""
        while self.migrate_some(slot, source, target, 100):
            pass
        target_id = self.node_id(target)
        # The target first, so it owns the slot before the source starts redirecting (MOVED).
        self._ask(target, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        self._ask(source, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        for node in self.masters():
            if node is not source and node is not target:
                self._ask(node, "CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def keys_per_master(self) -> dict[int, int]:
        return {node.port: int(self._ask(node, "DBSIZE")) for node in self.masters()}

    def __repr__(self) -> str:
        return f"<ClusterProcesses ports={[n.port for n in self.nodes]}>"


@contextlib.contextmanager
def running_cluster(
    masters: int = 3, replicas: int = 1, **options: Any
) -> Iterator[ClusterProcesses]:
    """A started :class:`ClusterProcesses`, closed on exit: what a cluster fixture yields.

    Without a server binary the test is skipped, or fails when ``IDEMKEY_REQUIRE_REDIS=1`` (CI);
    a cluster that does not come up fails the test without a traceback.
    """
    if redis_server_executable() is None:
        reason = "the cluster tests need redis-server or valkey-server"
        if os.environ.get("IDEMKEY_REQUIRE_REDIS", "") == "1":
            pytest.fail(
                f"{reason}, but IDEMKEY_REQUIRE_REDIS=1 requires a real Redis", pytrace=False
            )
        pytest.skip(reason)
    try:
        processes = ClusterProcesses(masters=masters, replicas=replicas, **options).start()
    except RedisServerError as exc:
        pytest.fail(f"could not start a Redis cluster: {exc}", pytrace=False)
    try:
        yield processes
    finally:
        processes.close()
