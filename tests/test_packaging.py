"""The built wheel ships what the package reads at run time: the Lua scripts and py.typed.

Hatchling includes every file under ``idemkey/``; this proves it on a real build rather than
trusting it (docs/design.md#the-scripts). Skipped when ``build`` is not installed
(``pip install build``).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

REQUIRED_FILES = [
    "idemkey/lua/checkpoint.lua",
    "idemkey/lua/claim.lua",
    "idemkey/lua/complete.lua",
    "idemkey/lua/release.lua",
    "idemkey/lua/renew.lua",
    "idemkey/py.typed",
]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("build") is None:
        pytest.skip("the 'build' package is not installed")
    outdir = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "build", "--wheel", "--outdir", str(outdir)]
    # With hatchling importable, build in this environment: no download of the build backend,
    # and seconds instead of tens of seconds.
    if importlib.util.find_spec("hatchling") is not None:
        cmd.append("--no-isolation")
    cmd.append(str(ROOT))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"wheel build failed:\n{proc.stdout}\n{proc.stderr}"
    wheels = list(outdir.glob("idemkey_redis-*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {outdir}, found {wheels}"
    return wheels[0]


def test_wheel_contains_lua_scripts_and_py_typed(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    missing = [name for name in REQUIRED_FILES if name not in names]
    assert not missing, f"{wheel.name} lacks {missing}"


def test_wheel_ships_no_tests_or_benchmarks(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        stray = [n for n in zf.namelist() if n.startswith(("tests/", "benchmarks/"))]
    assert not stray, f"{wheel.name} ships {stray[:5]}"


def test_wheel_is_idemkey_redis_with_the_metrics_extras(wheel: Path) -> None:
    # "idemkey" on the package index is another project: the distribution is idemkey-redis.
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        meta = zf.read(name).decode("utf-8")
    head = meta.split("\n\n", 1)[0].splitlines()
    assert "Name: idemkey-redis" in head
    extras = {line.split(": ", 1)[1] for line in head if line.startswith("Provides-Extra: ")}
    assert {"prometheus", "otel", "flask", "client", "testing"} <= extras
    assert any(line.startswith("Requires-Dist: prometheus-client") and "'prometheus'" in line
               for line in head)  # fmt: skip
    assert any(line.startswith("Requires-Dist: opentelemetry-api") and "'otel'" in line
               for line in head)  # fmt: skip


def test_the_installed_command_prints_the_wheels_version(wheel: Path, tmp_path: Path) -> None:
    # Installed as a user installs it (no editable checkout first on sys.path), the `idemkey`
    # console script reports the version from the distribution's metadata.
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         str(wheel)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    version = wheel.name.split("-")[1]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(target), "PYTHONNOUSERSITE": "1"}
    proc = subprocess.run(
        [sys.executable, str(target / "bin" / "idemkey"), "--version"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"idemkey {version} (the idemkey-redis distribution)\n"
