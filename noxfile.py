"""nox: the single entry point for tests, lint, typing, cluster tests, benchmarks and builds.

    nox                     # tests, lint, typing (the defaults)
    nox -s tests            # the test suite on every Python 3.10-3.13 that actually runs here
    nox -s tests-3.11       # one interpreter
    nox -s bench -- --quick # arguments after -- go to `python -m benchmarks`
    nox -s build            # sdist + wheel, then check the wheel ships the Lua scripts

Interpreters: a version is offered only if ``pythonX.Y -c pass`` succeeds, because pyenv
installs shims for versions that are not enabled and those fail when run. If none of
3.10-3.13 works, the interpreter running nox is used. Run with ``-r`` to reuse the
virtualenvs between runs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint", "typing"]
nox.options.error_on_missing_interpreters = False

ROOT = Path(__file__).resolve().parent
SUPPORTED = ["3.10", "3.11", "3.12", "3.13"]
CURRENT = f"{sys.version_info.major}.{sys.version_info.minor}"
WHEEL_MUST_CONTAIN = [
    "idemkey/lua/claim.lua",
    "idemkey/lua/complete.lua",
    "idemkey/lua/release.lua",
    "idemkey/lua/renew.lua",
    "idemkey/py.typed",
]


def _runs(version: str) -> bool:
    """True if ``python<version>`` exists and starts (pyenv shims may exist but fail)."""
    exe = shutil.which(f"python{version}")
    if exe is None:
        return False
    try:
        result = subprocess.run([exe, "-c", "pass"], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


PYTHONS = [v for v in SUPPORTED if v == CURRENT or _runs(v)] or [CURRENT]


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The test suite, benchmarks excluded. Extra arguments go to pytest.

    `build` is installed so that tests/test_packaging.py builds and inspects a real wheel.
    """
    session.install("-e", ".[test]", "build")
    session.run("pytest", "-m", "not benchmark", *session.posargs)


@nox.session(python=CURRENT)
def lint(session: nox.Session) -> None:
    """ruff lint and format check (no changes made)."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=CURRENT)
def typing(session: nox.Session) -> None:
    """mypy --strict on the package.

    Installs the test extra too: the package imports optional clients (valkey) whose types
    mypy must see, exactly as in .ci/run.
    """
    session.install("-e", ".[test]", "mypy")
    session.run("mypy", "--strict", "idemkey")


@nox.session(python=CURRENT)
def cluster(session: nox.Session) -> None:
    """Tests against a real 3-master Redis cluster that the test session starts."""
    session.install("-e", ".[test]")
    session.run("pytest", "-m", "cluster", *session.posargs)


@nox.session(python=CURRENT)
def bench(session: nox.Session) -> None:
    """The latency-budget suite (benchmarks/). Arguments after -- go to it."""
    session.install("-e", ".[test,bench]")
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session(python=CURRENT)
def build(session: nox.Session) -> None:
    """Build sdist and wheel into dist/, then check the wheel ships the Lua scripts."""
    session.install("build")
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", "--outdir", str(dist))
    wheels = sorted(dist.glob("idemkey-*.whl"))
    if len(wheels) != 1:
        session.error(f"expected one wheel in {dist}, found {[w.name for w in wheels]}")
    with zipfile.ZipFile(wheels[0]) as zf:
        names = set(zf.namelist())
    missing = [name for name in WHEEL_MUST_CONTAIN if name not in names]
    if missing:
        session.error(f"{wheels[0].name} lacks {missing}")
    session.log(f"{wheels[0].name} ships {len(WHEEL_MUST_CONTAIN)} required files")
