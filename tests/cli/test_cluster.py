"""stats, doctor, inspect and forget on a real Redis Cluster: every primary is scanned."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis.cluster

from idemkey import Policy, RedisStore, guard
from tests.cli.conftest import CliRunner
from tests.cluster._cluster import ClusterProcesses, running_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.redis]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterProcesses]:
    """A small private cluster (3 masters, no replicas): the CLI only reads and deletes."""
    with running_cluster(masters=3, replicas=0) as processes:
        yield processes


@pytest.fixture
def cluster_url(cluster: ClusterProcesses) -> str:
    return f"redis://127.0.0.1:{cluster.nodes[0].port}/0"


@pytest.fixture
def cluster_store(cluster: ClusterProcesses, prefix: str) -> Iterator[RedisStore]:
    client: redis.cluster.RedisCluster = cluster.client()
    store = RedisStore(client, Policy(prefix=prefix))
    yield store
    store.close()
    client.close()


def test_stats_scans_every_primary(
    idemkey: CliRunner, cluster: ClusterProcesses, cluster_store: RedisStore, cluster_url: str,
    prefix: str,
) -> None:  # fmt: skip
    for i in range(40):
        with guard(cluster_store, f"job-{i}") as call:
            call.save(i)
    per_master = [
        len(list(cluster.node_client(node).scan_iter(match=f"{prefix}:*")))
        for node in cluster.masters()
    ]
    assert sum(per_master) == 40
    assert all(per_master)  # the records really are spread over the three masters
    run = idemkey("stats", "--json", "--redis-url", cluster_url, "--prefix", prefix)
    assert run.code == 0, run.err
    stats = json.loads(run.out)
    assert stats["nodes"] == 3
    assert stats["states"]["complete"] == 40
    assert stats["memory"]["sampled"] == 40


def test_inspect_and_forget_on_a_cluster(
    idemkey: CliRunner, cluster_store: RedisStore, cluster_url: str, prefix: str
) -> None:
    with guard(cluster_store, "invoice-9") as call:
        call.save({"id": "ch_9"})
    at = ("--redis-url", cluster_url, "--prefix", prefix)
    view = json.loads(idemkey("inspect", "invoice-9", "--guard", "--json", *at).out)
    assert (view["state"], view["preview"]) == ("complete", "{'id': 'ch_9'}")
    assert idemkey("forget", "invoice-9", "--guard", "--yes", *at).code == 0
    assert idemkey("inspect", "invoice-9", "--guard", *at).code == 1


def test_doctor_checks_every_primary(idemkey: CliRunner, cluster_url: str) -> None:
    run = idemkey("doctor", "--json", "--pings", "2", "--redis-url", cluster_url)
    assert run.code == 0, run.err
    report = json.loads(run.out)
    checks = report["checks"]
    assert checks[0] == {
        "node": "", "name": "cluster", "verdict": "OK", "detail": "cluster_state ok, 3 primaries"
    }  # fmt: skip
    mode = next(c for c in checks if c["name"] == "mode")
    assert (mode["node"], mode["detail"]) == ("all 3 primaries", "cluster")
    assert len([c for c in checks if c["name"] == "round trip"]) == 3


def test_list_and_uncertain_on_the_cluster(
    idemkey: CliRunner, cluster_store: RedisStore, cluster_url: str, prefix: str
) -> None:
    import contextlib
    import time

    for i in range(12):
        with contextlib.suppress(RuntimeError), guard(cluster_store, f"job-{i}") as call:
            call.step("reserve", lambda: 1)
            raise RuntimeError("after a step")
    base = ("--redis-url", cluster_url, "--prefix", prefix)
    listed = json.loads(idemkey(*base, "list", "--json", "--state", "released").out)
    assert listed["count"] == 12
    assert {tuple(r["steps"]) for r in listed["records"]} == {("reserve",)}
    deadline = time.monotonic() + 20
    while len(found := cluster_store.uncertain(limit=50)) < 12:
        assert time.monotonic() < deadline, found
        time.sleep(0.05)
    entries = json.loads(idemkey(*base, "list", "--uncertain", "--json").out)["uncertain"]
    assert len(entries) == 12
    assert {e["kind"] for e in entries} == {"released_with_steps"}


def test_doctor_runs_a_script_on_every_primary_and_writes_nothing(
    idemkey: CliRunner, cluster: ClusterProcesses, cluster_url: str, prefix: str
) -> None:
    """Each primary runs forget.lua once, on a key of its own slots (another's would answer
    MOVED), which writes nothing there."""

    def evalsha_calls(node: redis.Redis) -> int:
        return int(node.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))

    masters = [cluster.node_client(node) for node in cluster.masters()]
    try:
        calls = [evalsha_calls(m) for m in masters]
        changes = [m.info("persistence")["rdb_changes_since_last_save"] for m in masters]
        run = idemkey("--prefix", prefix, "doctor", "--json", "--pings", "1",
                      "--redis-url", cluster_url)  # fmt: skip
        assert run.code == 0, run.out + run.err
        scripts = [c for c in json.loads(run.out)["checks"] if c["name"] == "scripts"]
        assert [(c["node"], c["verdict"]) for c in scripts] == [("all 3 primaries", "OK")]
        assert [evalsha_calls(m) for m in masters] == [n + 1 for n in calls]
        assert [m.info("persistence")["rdb_changes_since_last_save"] for m in masters] == changes
        assert all(not list(m.scan_iter(match=f"{prefix}:*")) for m in masters)
    finally:
        for m in masters:
            m.close()
