"""``idemkey doctor``'s scripts check runs a script, as every claim does: a server that loads the
scripts but cannot run them (an ACL without EVALSHA, a read-only replica) fails it, and the run
itself writes nothing."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

from idemkey.store import SCRIPTS
from idemkey.store import diagnostics as dx
from tests._servers import RedisServer
from tests.cli.conftest import CliRunner

SHAS = {name: hashlib.sha1(script.encode()).hexdigest() for name, script in SCRIPTS.items()}


def _scripts(run_out: str) -> dict[str, str]:
    checks: dict[str, dict[str, str]] = {c["name"]: c for c in json.loads(run_out)["checks"]}
    return checks["scripts"]


def test_check_scripts_compares_the_sha1_and_says_why_they_cannot_run() -> None:
    assert dx.check_scripts(SHAS, SHAS).verdict == "OK"
    assert dx.check_scripts({k: v.upper() for k, v in SHAS.items()}, SHAS).verdict == "OK"
    wrong = dx.check_scripts({**SHAS, "claim": "0" * 40}, SHAS)
    assert (wrong.verdict, "claim" in wrong.detail) == ("FAIL", True)
    refused = dx.check_scripts(SHAS, SHAS, "EVALSHA forget: NoPermissionError: no")
    assert refused.verdict == "FAIL"
    assert "NoPermissionError" in refused.detail


def test_doctor_fails_a_redis_whose_acl_denies_evalsha(
    idemkey: CliRunner, redis_server_factory: Callable[..., RedisServer]
) -> None:
    server = redis_server_factory()
    with server.client() as admin:
        admin.execute_command(
            "ACL", "SETUSER", "default", "on", "nopass", "~*", "&*", "+@all", "-evalsha", "-eval"
        )
    run = idemkey("doctor", "--redis-url", server.url, "--pings", "1", "--json")
    assert run.code == 1, run.out + run.err
    scripts = _scripts(run.out)
    assert scripts["verdict"] == "FAIL"
    assert "NoPermissionError" in scripts["detail"]
    assert json.loads(run.out)["verdict"] == "FAIL"


def test_doctor_fails_the_scripts_on_a_replica(
    idemkey: CliRunner, redis_server_factory: Callable[..., RedisServer]
) -> None:
    primary = redis_server_factory()
    replica = redis_server_factory(["--replicaof", primary.host, str(primary.port)])
    run = idemkey("doctor", "--redis-url", replica.url, "--pings", "1", "--json")
    assert run.code == 1
    scripts = _scripts(run.out)
    assert scripts["verdict"] == "FAIL"
    assert "ReadOnlyError" in scripts["detail"]


def test_doctor_writes_nothing(
    idemkey: CliRunner, redis_server_factory: Callable[..., RedisServer]
) -> None:
    """No key made, none changed: the data set's change counter stays where it was, and the
    replication stream gets nothing (a DEL of a missing key is not propagated)."""
    server = redis_server_factory()
    with server.client() as admin:
        admin.set("kept", "1")
        before = admin.info("persistence")["rdb_changes_since_last_save"]
        offset = admin.info("replication")["master_repl_offset"]
        run = idemkey("doctor", "--redis-url", server.url, "--pings", "1", "--json")
        assert run.code == 0, run.out + run.err
        assert _scripts(run.out)["verdict"] == "OK"
        assert admin.info("persistence")["rdb_changes_since_last_save"] == before
        assert admin.info("replication")["master_repl_offset"] == offset
        assert admin.keys("*") == [b"kept"]
