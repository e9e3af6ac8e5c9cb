"""Reproduce redis-py's asyncio cluster ASK bug: one-key writes into a migrating slot fail.

For the upstream report (issue 23). Standalone: needs only redis-py and a ``redis-server`` (or
``valkey-server``) binary; it starts two cluster nodes on free loopback ports and removes them.

    python scripts/redis_py_ask_repro.py [--server PATH] [--tasks 4] [--writes 200]
                                         [--client redis|valkey]

What happens, in redis-py 8.1's ``redis.asyncio.cluster.RedisCluster._execute_command``: on an
ASK redirect it sends ``ASKING`` with ``await target_node.execute_command("ASKING")`` and then
the command with a second ``target_node.execute_command(...)``. Each call takes a connection
from the node's pool and gives it back, so when other tasks use the same node the command may
go out on another connection than the ``ASKING``. The importing node then answers MOVED (to the
slot's owner, which answers ASK again), and the request bounces until its 16 tries are spent
(``ClusterError: TTL exhausted.``). Every ``reinitialize_steps``-th MOVED (5 by default) the
client also calls ``self.aclose()``, which closes every connection of every node, including
those other tasks are writing to or reading a reply on: they fail with ``AttributeError:
'NoneType' object has no attribute 'writelines'`` or ``ConnectionError: Connection closed by
server``. With one task (the control run) ASKING and the command share the one connection and
every write succeeds. The script MONITORs the importing node to show it: ASKINGs with no SET
after them on their connection (a SET refused with MOVED never reaches MONITOR).

Seen here (redis-py 8.1.0, 200 writes, 4 tasks): 3-16 writes lost per run on Redis 7.0.15 and on
Valkey 9.1.2, about 400 ASKINGs of which about 200 were followed by their SET; 0 lost with 1 task.
valkey-py 6.2.0 (``--client valkey``) sends ASKING the same way and loses more: 155-192 of 200
writes as ``ValkeyClusterException: Valkey Cluster cannot be connected`` in two runs of three.

Exit status: 0 when the concurrent run lost writes and the one-task control lost none (the bug
reproduced), 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import importlib
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import redis
import redis.asyncio.cluster
from redis.crc import key_slot

HOST = "127.0.0.1"
TAG = "{ask-repro}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def two_node_cluster(server: str) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    """Two masters (slots 0-8191 and 8192-16383), joined over the protocol; clients on each."""
    procs, clients = [], []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for n in range(2):
                port, bus = _free_port(), _free_port()
                procs.append(
                    subprocess.Popen(
                        [server, "--bind", HOST, "--port", str(port), "--cluster-enabled", "yes",
                         "--cluster-port", str(bus), "--cluster-config-file", f"{tmp}/n{n}.conf",
                         "--save", "", "--appendonly", "no", "--dir", tmp],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    )
                )  # fmt: skip
                clients.append((redis.Redis(host=HOST, port=port), port, bus))
            for client, _, _ in clients:
                _wait(client.ping, "a node to answer PING")
            (a, _, _), (b, b_port, b_bus) = clients
            a.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 8191)
            b.execute_command("CLUSTER", "ADDSLOTSRANGE", 8192, 16383)
            a.execute_command("CLUSTER", "MEET", HOST, b_port, b_bus)
            for client, _, _ in clients:
                _wait(
                    lambda c=client: c.cluster("info")["cluster_state"] == "ok",
                    "the cluster to be ok",
                )
            yield a, b
        finally:
            for client, _, _ in clients:
                client.close()
            for proc in procs:
                proc.kill()
                proc.wait()


def _wait(predicate: object, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(redis.RedisError):
            if predicate():  # type: ignore[operator]
                return
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def begin_migration(source: redis.Redis, target: redis.Redis, slot: int) -> None:
    """Mark ``slot`` IMPORTING on ``target`` and MIGRATING on ``source``, and move nothing: every
    key not yet on ``source`` is answered ASK (to ``target``)."""
    target.execute_command(
        "CLUSTER", "SETSLOT", slot, "IMPORTING", source.execute_command("CLUSTER", "MYID")
    )
    source.execute_command(
        "CLUSTER", "SETSLOT", slot, "MIGRATING", target.execute_command("CLUSTER", "MYID")
    )


def watch(target: redis.Redis, seen: collections.Counter[str], ready: threading.Event) -> None:
    """MONITOR the importing node, counting ASKINGs and the SETs that follow one on their own
    connection. A SET sent on another connection than its ASKING is refused with MOVED before it
    runs, so MONITOR never shows it: what shows is an ASKING with no SET after it."""
    last: dict[str, str] = {}
    with target.monitor() as monitor:
        ready.set()
        for event in monitor.listen():
            words = event["command"].split()
            if not words:
                continue
            name, conn = words[0].upper(), f"{event['client_address']}:{event['client_port']}"
            if name == "ASKING":
                seen["ASKING"] += 1
            if name == "SET" and TAG in event["command"]:
                seen[
                    "SET after ASKING" if last.get(conn) == "ASKING" else "SET without ASKING"
                ] += 1
            elif name == "SET" and "stop-watch" in event["command"]:
                return
            last[conn] = name


async def writes(
    port: int, tasks: int, count: int, run: str, library: str
) -> collections.Counter[str]:
    """``count`` one-key SETs of new keys in the migrating slot, spread over ``tasks`` tasks."""
    client: Any = redis.asyncio.cluster.RedisCluster(host=HOST, port=port)
    if library == "valkey":  # valkey-py, redis-py's fork, has the same two sends
        import valkey.asyncio.cluster

        client = valkey.asyncio.cluster.ValkeyCluster(host=HOST, port=port)
    await client.initialize()  # its own first-use race is another story: keep it out
    outcomes: collections.Counter[str] = collections.Counter()

    async def one_task(n: int) -> None:
        for i in range(n, count, tasks):
            try:
                await client.set(f"{TAG}:{run}:{i}", b"v")
            except Exception as exc:  # counted, not raised: the point is how many fail
                outcomes[f"{type(exc).__name__}: {exc}"] += 1
            else:
                outcomes["ok"] += 1

    try:
        await asyncio.gather(*(one_task(n) for n in range(tasks)))
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--server", default=shutil.which("redis-server") or shutil.which("valkey-server")
    )
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--client", choices=["redis", "valkey"], default="redis")
    args = parser.parse_args(argv)
    if not args.server:
        parser.error("no redis-server or valkey-server on PATH: pass --server")
    version = subprocess.run([args.server, "--version"], capture_output=True, text=True).stdout
    library = importlib.import_module(args.client)
    print(f"{args.client}-py {library.__version__}; {version.strip()}")
    slot = key_slot(TAG.encode())
    with two_node_cluster(args.server) as (a, b):
        source, target = (a, b) if slot <= 8191 else (b, a)
        begin_migration(source, target, slot)
        port = source.connection_pool.connection_kwargs["port"]
        runs = []
        for tasks, run in ((1, "control"), (args.tasks, "concurrent")):
            seen: collections.Counter[str] = collections.Counter()
            ready = threading.Event()
            watcher = threading.Thread(target=watch, args=(target, seen, ready), daemon=True)
            watcher.start()
            ready.wait(10)
            outcome = asyncio.run(writes(port, tasks, args.writes, run, args.client))
            target.set("stop-watch", b"1")  # a key of target's own slots: ends the MONITOR
            watcher.join(10)
            runs.append((tasks, outcome, seen))
    for tasks, outcome, seen in runs:
        failed = args.writes - outcome["ok"]
        print(
            f"{tasks} task(s): {failed} of {args.writes} writes into migrating slot {slot} failed;"
            f" the importing node got {seen['ASKING']} ASKING, {seen['SET after ASKING']} of"
            f" them followed by the SET on their connection"
        )
        for kind, n in outcome.most_common():
            if kind != "ok":
                print(f"    {n} x {kind}")
    control, concurrent = runs[0][1], runs[1][1]
    reproduced = control["ok"] == args.writes and concurrent["ok"] < args.writes
    print("reproduced" if reproduced else "not reproduced")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
