"""A real Celery worker in a subprocess (``celery -A <module> worker``), ready or failed, and
its stop: the one way the Celery tests start and end workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests._servers import wait_until

ROOT = Path(__file__).resolve().parents[2]


def start_worker(
    module: str,
    url: str,
    prefix: str,
    log: Path,
    *,
    hostname: str,
    pool: str = "prefork",
    concurrency: int = 1,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """A worker of ``module`` on broker ``url`` and queue ``prefix``, once its log says ready;
    a worker that exits first fails the test with its log."""
    environ = {**os.environ, "IDEMKEY_CELERY_URL": url, "IDEMKEY_CELERY_PREFIX": prefix}
    environ.update(env or {})
    options = [f"--pool={pool}", f"--concurrency={concurrency}", f"--hostname={hostname}"]
    quiet = ["--without-mingle", "--without-gossip", "--without-heartbeat"]
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", module, "worker", *options, "--loglevel=INFO",
         f"--logfile={log}", *quiet],
        cwd=ROOT, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip

    def ready() -> bool:
        if worker.poll() is not None:
            text = log.read_text() if log.exists() else ""
            pytest.fail(f"the celery worker exited ({worker.returncode}): {text[-2000:]}")
        return log.exists() and " ready." in log.read_text()

    try:
        wait_until(ready, timeout=30, message="the celery worker to be ready")
    except BaseException:
        stop_worker(worker)
        raise
    return worker


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a warm shutdown), then SIGKILL after 10 s."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=10)
