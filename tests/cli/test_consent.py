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
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from idemkey import RedisStore
from idemkey._core import Record, record_for
from idemkey.cli import inspect
from idemkey.guard import GUARD_METHOD
from tests.cli.conftest import ROOT, CliRunner

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


def _lapsed(store: RedisStore, key: str) -> Record:
    """A record whose first executor crashed: in progress, its lease passed."""
    record = record_for(store.policy.prefix, "", GUARD_METHOD, "", key)
    assert type(store.claim(record, "fp-" + key, lease_ms=50, heartbeat=False)).__name__ == (
        "Claimed"
    )
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and real_lease_left(store, record) > 0:
        time.sleep(0.02)
    return record


def real_lease_left(store: RedisStore, record: Record) -> int:
    lease = int(store.client.hget(record.record_key, "lease"))
    seconds, micros = store.client.time()
    return lease - (seconds * 1000 + micros // 1000)


def _prompted(
    argv: tuple[str, ...], idemkey_cmd: list[str], meanwhile: Callable[[], None]
) -> tuple[int, str]:
    """Run ``argv`` on a pseudo-terminal; once it asks, run ``meanwhile``, then answer y."""
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "IDEMKEY_REDIS_URL"}
    try:
        proc = subprocess.Popen(
            [*idemkey_cmd, *argv], stdin=follower, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, cwd=ROOT, env=env,
        )  # fmt: skip
        assert proc.stderr is not None
        err = b""
        while b"[y/N]" not in err:
            chunk = os.read(proc.stderr.fileno(), 1024)
            assert chunk, err
            err += chunk
        meanwhile()
        os.write(leader, b"y\n")
        _, rest = proc.communicate(timeout=60)
    finally:
        os.close(follower)
        os.close(leader)
    return proc.returncode, (err + rest).decode()


@pytest.mark.parametrize("force", [False, True])
def test_forget_deletes_only_the_record_the_operator_confirmed(
    redis_url: str, prefix: str, store: RedisStore, real_client: redis.Redis, force: bool
) -> None:
    """While the prompt is open, a retry takes the lapsed record over (and, without --force,
    completes it): y must not delete the record the operator never saw."""
    record = _lapsed(store, "order-33")
    command = [sys.executable, "-m", "idemkey", "--redis-url", redis_url, "--prefix", prefix]

    def retry() -> None:
        claimed = store.claim(record, "fp-order-33", heartbeat=False)
        assert type(claimed).__name__ == "Claimed"
        if not force:
            assert store.complete(record, claimed.owner, b"stored-answer")  # type: ignore[union-attr]

    argv = ("forget", "order-33", "--guard", *(("--force",) if force else ()))
    code, err = _prompted(argv, command, retry)
    assert f"forget lapsed record {record.record_key}? [y/N]" in err
    assert code == 1, err
    now = "in_progress" if force else "complete"
    assert err.endswith(
        f"idemkey forget: the record is {now} now, not the lapsed record you confirmed; "
        "nothing deleted\n"
    )
    assert real_client.exists(record.record_key) == 1
    if not force:
        assert real_client.hget(record.record_key, "resp") == b"stored-answer"


def test_forget_yes_acts_on_the_record_it_read(
    idemkey: CliRunner, redis_url: str, prefix: str, store: RedisStore,
    real_client: redis.Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """--yes: the record completes between the read and the delete (a stale view): kept."""
    record = _lapsed(store, "order-34")
    real_consent = inspect.consent

    def consent_then_retry(*args: Any, **kwargs: Any) -> None:
        real_consent(*args, **kwargs)
        claimed = store.claim(record, "fp-order-34", heartbeat=False)
        assert store.complete(record, claimed.owner, b"stored-answer")  # type: ignore[union-attr]

    monkeypatch.setattr(inspect, "consent", consent_then_retry)
    run = idemkey(
        "--redis-url", redis_url, "--prefix", prefix, "forget", "order-34", "--guard", "--yes"
    )
    assert run.code == 1, run.err
    assert "the record is complete now, not the lapsed record you confirmed" in run.err
    assert real_client.hget(record.record_key, "resp") == b"stored-answer"


def test_forget_a_record_whose_fence_no_parser_reads(
    idemkey: CliRunner, redis_url: str, prefix: str, store: RedisStore, real_client: redis.Redis
) -> None:
    """The fence shown is compared as stored: a fence written as "007" or "x" (raw redis-py)
    does not keep the record from being forgotten (the remedy for it)."""
    for n, fence in enumerate(("007", "x")):
        record = record_for(prefix, "", GUARD_METHOD, "", f"order-35-{n}")
        real_client.hset(record.record_key, mapping={"fp": "f", "resp": "r", "fence": fence})
        run = idemkey(
            "--redis-url",
            redis_url,
            "--prefix",
            prefix,
            "forget",
            f"order-35-{n}",
            "--guard",
            "--yes",
        )
        assert run.code == 0, run.err
        assert real_client.exists(record.record_key) == 0


@pytest.mark.parametrize("completes", [False, True])
def test_cancel_stops_only_the_run_the_operator_confirmed(
    redis_url: str, prefix: str, store: RedisStore, real_client: redis.Redis, completes: bool
) -> None:
    """While the prompt is open, a retry takes the lapsed claim over (and may complete it): y
    must not cancel the new owner's run, which the operator never saw."""
    record = _lapsed(store, "order-36")
    command = [sys.executable, "-m", "idemkey", "--redis-url", redis_url, "--prefix", prefix]
    after: dict[bytes, bytes] = {}

    def retry() -> None:
        claimed = store.claim(record, "fp-order-36", heartbeat=False)
        assert type(claimed).__name__ == "Claimed"
        if completes:
            assert store.complete(record, claimed.owner, b"stored-answer")  # type: ignore[union-attr]
        after.update(real_client.hgetall(record.record_key))

    code, err = _prompted(("cancel", "order-36", "--guard"), command, retry)
    assert f"cancel in_progress record {record.record_key}? [y/N]" in err
    assert code == 1, err
    if completes:
        assert err.endswith(
            "idemkey cancel: the record is complete now, not the lapsed record you confirmed; "
            "nothing cancelled\n"
        )
    else:
        assert err.endswith(
            "idemkey cancel: the record was claimed again since you confirmed; nothing cancelled\n"
        )
        assert after[b"state"] == b"in_progress"
    assert real_client.hgetall(record.record_key) == after  # its owner and fence unchanged


def test_cancel_yes_acts_on_the_record_it_read(
    idemkey: CliRunner, redis_url: str, prefix: str, store: RedisStore,
    real_client: redis.Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """--yes: a retry takes the lapsed claim over between the read and the cancel: kept."""
    record = _lapsed(store, "order-37")
    real_consent = inspect.consent
    claims: list[Any] = []

    def consent_then_retry(*args: Any, **kwargs: Any) -> None:
        real_consent(*args, **kwargs)
        claims.append(store.claim(record, "fp-order-37", heartbeat=False))

    monkeypatch.setattr(inspect, "consent", consent_then_retry)
    run = idemkey(
        "--redis-url", redis_url, "--prefix", prefix, "cancel", "order-37", "--guard", "--yes"
    )
    assert run.code == 1, run.err
    assert "the record was claimed again since you confirmed; nothing cancelled" in run.err
    [claimed] = claims
    assert real_client.hget(record.record_key, "owner") == claimed.owner.encode()
    assert real_client.hget(record.record_key, "fence") == str(claimed.fence).encode()
    assert store.complete(record, claimed.owner, b"stored-answer")  # still the new owner's run
