"""The built wheel ships what the package reads at run time: the Lua scripts, the console's
templates and py.typed.

Hatchling includes every file under ``idemkey/``; this proves it on a real build rather than
trusting it (docs/design.md#the-scripts). Skipped when ``build`` is not installed
(``pip install build``).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Every Lua script and py.typed, read from the tree, as the noxfile's build session reads it.
REQUIRED_FILES = [
    *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "idemkey" / "lua").glob("*.lua")),
    *sorted(
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "idemkey" / "console" / "templates").glob("*.html")
    ),
    "idemkey/py.typed",
]


def test_the_noxfile_build_checks_every_script() -> None:
    if importlib.util.find_spec("nox") is None:
        pytest.skip("nox is not installed")
    spec = importlib.util.spec_from_file_location("_noxfile", ROOT / "noxfile.py")
    assert spec is not None
    assert spec.loader is not None
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    assert noxfile.WHEEL_MUST_CONTAIN == REQUIRED_FILES
    assert "idemkey/lua/checkpoint.lua" in REQUIRED_FILES
    assert "idemkey/console/templates/console.html" in REQUIRED_FILES


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


def test_the_wheel_carries_the_license_file_and_says_what_the_package_is(wheel: Path) -> None:
    """The MIT text travels with every copy (PEP 639: .dist-info/licenses/), and the index
    page shows the license, the supported Pythons and frameworks, and the project's links."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (license_file,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert zf.read(license_file) == (ROOT / "LICENSE").read_bytes()
        (name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        head = zf.read(name).decode("utf-8").split("\n\n", 1)[0].splitlines()
    assert "MIT License" in (ROOT / "LICENSE").read_text("utf-8")
    assert "License-Expression: MIT" in head
    assert "License-File: LICENSE" in head
    classifiers = {line.split(": ", 1)[1] for line in head if line.startswith("Classifier: ")}
    wanted = {f"Programming Language :: Python :: 3.{minor}" for minor in range(10, 14)}
    wanted |= {f"Framework :: {f}" for f in ("Flask", "Django", "FastAPI", "AsyncIO", "Celery")}
    wanted.add("Development Status :: 4 - Beta")
    assert wanted <= classifiers
    assert any(c.startswith("Topic :: ") for c in classifiers)
    assert not any(c.startswith("License :: ") for c in classifiers)  # PEP 639: the expression
    urls = dict(line.split(": ", 1)[1].split(", ", 1) for line in head if "Project-URL" in line)
    assert urls["Repository"] == "https://github.com/idemkey/idemkey"


def test_the_project_files_exist() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text("utf-8")
    assert "keepachangelog.com" in changelog
    for version in ("0.3.0", "0.2.0", "0.1.0"):
        assert f"\n## [{version}] - " in changelog, version
    assert "**Breaking: a record is one key.**" in changelog  # 0.3.0's layout change
    assert "nox -s quick" in (ROOT / "CONTRIBUTING.md").read_text("utf-8")
    assert "docs/development.md" in (ROOT / "CONTRIBUTING.md").read_text("utf-8")
    security = (ROOT / "SECURITY.md").read_text("utf-8")
    assert "security/advisories/new" in security
    assert "write to Redis" in security


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


def test_bench_from_an_installed_wheel_says_it_needs_a_checkout(
    wheel: Path, tmp_path: Path
) -> None:
    """``idemkey bench`` from a wheel installed in a fresh venv, run in a directory holding a
    ``benchmarks`` package of its own: that package is never imported, the command says where
    the suite lives and exits 2."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # The test run's own packages serve the dependencies; nothing is downloaded. Not
    # --system-site-packages: run from a venv, that names the base interpreter's packages, which
    # hold none of them. A path line in a .pth puts this environment's packages after the new
    # venv's own, without running its .pth files (the editable install of the checkout).
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    (Path(purelib) / "outer.pth").write_text(sysconfig.get_path("purelib") + "\n")
    pip = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)]
    subprocess.run(pip, check=True, timeout=300)
    elsewhere = tmp_path / "project"
    (elsewhere / "benchmarks").mkdir(parents=True)
    (elsewhere / "benchmarks" / "__init__.py").write_text(
        "def main(argv):\n    print('not idemkey suite')\n    return 0\n"
    )
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    # The console script, and python -m, which puts the current directory on the path.
    for command in ([str(venv / "bin" / "idemkey")], [str(python), "-m", "idemkey"]):
        proc = subprocess.run(
            [*command, "bench", "--", "--quick"],
            cwd=elsewhere,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert "not idemkey suite" not in proc.stdout
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "runs the benchmark suite of a source checkout" in proc.stderr
        assert "site-packages" in proc.stderr  # where this idemkey is installed
        assert "Traceback" not in proc.stderr
