"""Commands that change records act only with consent: ``--yes``, or ``y`` on a terminal.

Run as an operator runs them (``python -m idemkey`` in a subprocess) against the session's real
redis-server: with stdin from ``/dev/null`` (a cron job, a pipe, ``ssh host idemkey``, a CI
step) ``cancel`` and ``forget`` refuse with a line naming ``--yes`` and leave the record as it
was; with ``--yes`` they act; on a terminal (a pseudo-terminal) they ask, and only ``y`` acts.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from collections.abc import Callable

import pytest
import redis

from idemkey import RedisStore
from idemkey._core import Record, record_for
from idemkey.guard import GUARD_METHOD
from tests.cli.conftest import ROOT

pytestmark = pytest.mark.redis

Command = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def idemkey_cli(redis_url: str, prefix: str) -> Command:
    """``idemkey_cli(*argv, stdin=...)``: the command line in its own process."""
    env = {k: v for k, v in os.environ.items() if k != "IDEMKEY_REDIS_URL"}

    def run(*argv: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "idemkey", "--redis-url", redis_url, "--prefix", prefix]
        return subprocess.run(
            [*command, *argv], stdin=stdin, capture_output=True, text=True, cwd=ROOT, env=env,
            timeout=60,
        )  # fmt: skip

    return run


def in_progress(store: RedisStore, key: str) -> Record:
    record = record_for(store.policy.prefix, "", GUARD_METHOD, "", key)
    claimed = store.claim(record, "fp-" + key, heartbeat=False)
    assert type(claimed).__name__ == "Claimed"
    return record


@pytest.mark.parametrize(
    ("argv", "verb"),
    [(("cancel", "order-31", "--guard"), "cancel"), (("forget", "order-31", "--guard"), "forget")],
)
def test_without_a_terminal_a_change_needs_yes(
    idemkey_cli: Command,
    store: RedisStore,
    real_client: redis.Redis,
    argv: tuple[str, ...],
    verb: str,
) -> None:
    record = record_for(store.policy.prefix, "", GUARD_METHOD, "", "order-31")
    claimed = store.claim(record, "fp", heartbeat=False)
    if verb == "forget":  # a completed record: forget's usual case
        assert store.complete(record, claimed.owner, b"done")  # type: ignore[union-attr]
    before = real_client.hgetall(record.record_key)
    refused = idemkey_cli(*argv)  # stdin: /dev/null
    assert refused.returncode == 2, refused.stderr
    assert refused.stdout == ""
    assert refused.stderr.splitlines() == [
        f"idemkey {verb}: stdin is not a terminal, so nobody can confirm: pass --yes to {verb} "
        f"without asking; nothing {'cancelled' if verb == 'cancel' else 'deleted'}"
    ]
    assert real_client.hgetall(record.record_key) == before  # intact
    done = idemkey_cli(*argv, "--yes")
    assert done.returncode == 0, done.stderr
    if verb == "cancel":
        assert done.stdout.startswith(f"cancelled in_progress record {record.record_key}")
        assert real_client.hget(record.record_key, "state") is None  # its owner lost it
    else:
        assert done.stdout == f"forgot complete record {record.record_key} (1 keys deleted)\n"
        assert real_client.exists(record.record_key) == 0


@pytest.mark.parametrize(("answer", "acts"), [(b"y\n", True), (b"n\n", False), (b"\n", False)])
def test_on_a_terminal_the_command_asks(
    idemkey_cli: Command,
    store: RedisStore,
    real_client: redis.Redis,
    answer: bytes,
    acts: bool,
) -> None:
    record = in_progress(store, "order-32")
    before = real_client.hgetall(record.record_key)
    leader, follower = pty.openpty()
    try:
        os.write(leader, answer)  # typed ahead: the terminal keeps it until the command reads
        run = idemkey_cli("cancel", "order-32", "--guard", stdin=follower)
    finally:
        os.close(follower)
        os.close(leader)
    assert f"cancel in_progress record {record.record_key}? [y/N]" in run.stderr
    if acts:
        assert run.returncode == 0, run.stderr
        assert real_client.hget(record.record_key, "state") is None
    else:
        assert run.returncode == 1
        assert run.stderr.endswith("idemkey cancel: not confirmed; nothing cancelled\n")
        assert real_client.hgetall(record.record_key) == before
