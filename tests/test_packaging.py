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
    wheels = list(outdir.glob("idemkey-*.whl"))
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
