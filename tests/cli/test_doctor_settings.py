"""``idemkey doctor`` reads eviction and persistence settings as ``store.check()`` does: with
CONFIG GET, or from INFO where CONFIG is disabled (managed services rename it away)."""

from __future__ import annotations

import json
from collections.abc import Callable

from tests._servers import RedisServer
from tests.cli.conftest import CliRunner

NO_CONFIG = ["--rename-command", "CONFIG", ""]


def _checks(out: str) -> dict[str, dict[str, str]]:
    return {c["name"]: c for c in json.loads(out)["checks"]}


def test_without_config_the_eviction_policy_comes_from_info(
    idemkey: CliRunner, redis_server_factory: Callable[..., RedisServer]
) -> None:
    server = redis_server_factory([*NO_CONFIG, "--maxmemory-policy", "allkeys-lru"])
    run = idemkey("doctor", "--redis-url", server.url, "--json", "--pings", "1")
    assert run.code == 0, run.err
    checks = _checks(run.out)
    assert checks["maxmemory-policy"]["verdict"] == "WARN"
    assert "allkeys-lru" in checks["maxmemory-policy"]["detail"]
    # INFO tells whether AOF is on, not the RDB save points: unknown, and said so.
    assert checks["persistence"]["verdict"] == "WARN"
    assert "cannot read" in checks["persistence"]["detail"]


def test_without_config_aof_is_seen_in_info(
    idemkey: CliRunner, redis_server_factory: Callable[..., RedisServer]
) -> None:
    server = redis_server_factory(
        [*NO_CONFIG, "--appendonly", "yes", "--maxmemory-policy", "noeviction"]
    )
    run = idemkey("doctor", "--redis-url", server.url, "--json", "--pings", "1")
    assert run.code == 0, run.err
    checks = _checks(run.out)
    assert checks["persistence"] == {
        "node": "",
        "name": "persistence",
        "verdict": "OK",
        "detail": "AOF",
    }
    assert checks["maxmemory-policy"]["verdict"] == "OK"


def test_with_config_the_save_points_are_read(
    idemkey: CliRunner, redis_server_factory: Callable[..., RedisServer]
) -> None:
    server = redis_server_factory(["--save", "900 1"])
    run = idemkey("doctor", "--redis-url", server.url, "--json", "--pings", "1")
    assert run.code == 0, run.err
    assert _checks(run.out)["persistence"]["detail"].startswith("RDB (save 900 1)")
