"""nox: the single entry point for tests, lint, typing, cluster tests, benchmarks and builds.

    nox                     # tests, lint, typing (the defaults)
    nox -s tests            # the test suite on every Python 3.10-3.13 that actually runs here
    nox -s tests-3.11       # one interpreter
    nox -s quick            # the inner loop, under 90 s; `pytest` stays the whole suite
    nox -s deep             # the whole suite in its long form (IDEMKEY_DEEP=1)
    nox -s bench -- --quick # arguments after -- go to `python -m benchmarks`
    nox -s build            # sdist + wheel, then check the wheel ships the Lua scripts
    nox -s lock             # constraints.txt again from pyproject.toml (uv pip compile)
    nox -s newest           # the quick tier on the newest releases the index serves (no lock)
    nox -s docs             # the docs site, mkdocs build --strict (-- serve: mkdocs serve)
    nox -s pages            # every page's samples twice, in fresh venvs from their install lines
    nox -s lowest           # the oldest redis/msgspec/xxhash/flask/werkzeug pyproject allows
    nox -s lowest_core      # the same floors, a short list of tests, a small install (CI)
    nox -s lowest_frameworks  # the oldest Django/FastAPI/Starlette/httpx/Celery/SQLAlchemy
    nox -s minimal          # no optional dependency: the tests that need no framework

Interpreters: a version is offered only if ``pythonX.Y -c pass`` succeeds, because pyenv
installs shims for versions that are not enabled and those fail when run. If none of
3.10-3.13 works, the interpreter running nox is used. Run with ``-r`` to reuse the
virtualenvs between runs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint", "typing"]
nox.options.error_on_missing_interpreters = False

ROOT = Path(__file__).resolve().parent
#: The test environment's exact versions (``nox -s lock`` writes it): the README's test command,
#: .ci/run and the everyday sessions install through it, so a fresh clone runs what CI ran.
LOCK = "constraints.txt"
#: The extras the lock covers: the README's two commands (demo, test), CI's (docs) and the
#: tools' (dev: ruff, mypy, nox, build).
LOCKED_EXTRAS = ("demo", "test", "docs", "dev")
SUPPORTED = ["3.10", "3.11", "3.12", "3.13"]
CURRENT = f"{sys.version_info.major}.{sys.version_info.minor}"
#: What the package reads at run time besides its modules: every Lua script, and py.typed.
WHEEL_MUST_CONTAIN = [
    *sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "idemkey" / "lua").glob("*.lua")),
    *sorted(
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "idemkey" / "console" / "templates").glob("*.html")
    ),
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

# The dependencies whose floors `lowest` installs exactly (valkey-glide: the store's tests on
# glide, tests/store/test_glide.py and the GlideAsyncStore contract classes; fakeredis: the
# testing kit's and the demo's embedded store, with redis-py at its floor too).
FLOORED = ("redis", "msgspec", "xxhash", "flask", "werkzeug", "valkey-glide", "fakeredis")
# What `lowest` runs: the core and the Flask, WSGI and ASGI adapters (positional arguments
# after -- replace this list, as .ci/run does to keep its step short).
LOWEST_TESTS = ["tests/unit", "tests/store", "tests/adapters", "tests/test_version.py"]
# The fast variant for CI (`lowest_core`): only what these tests import, so the fresh install
# stays short; the floors are the same.
LOWEST_CORE_EXTRAS = (
    "pytest",
    "pytest-asyncio",
    "pytest-xdist",  # pyproject's addopts run the tests on workers (-n auto)
    "hypothesis",
    "fakeredis",
    "httpx",
    "starlette",
    # tests/adapters/conftest.py loads every harness module: FastAPI and Django ones too.
    "fastapi",
    "django",
)
LOWEST_CORE_TESTS = [
    "tests/unit",
    "tests/store/test_scripts.py",
    "tests/store/test_guard.py",
    "tests/adapters/test_flask.py",
    # The replay's response built on werkzeug's Headers list (issue 39): the floor's too.
    "tests/adapters/test_flask_response.py",
    "tests/adapters/test_wsgi.py",
    "tests/adapters/test_asgi.py",
    # Clients built from a URL, and one asyncio store across event loops and a restart: both
    # failed on redis-py 5 only (no read timeout by default, no command retried).
    "tests/faults/test_url_clients.py",
    "tests/store/test_event_loops.py",
    "tests/store/test_refused.py",
    "tests/test_version.py",
]
# The framework extras whose floors `lowest_frameworks` installs exactly. Starlette is not among
# them: FastAPI 0.110.0 requires starlette<0.37, so the run takes the Starlette that FastAPI's
# floor brings (0.36.3), then swaps in Starlette's own floor for STARLETTE_FLOOR_TESTS.
FRAMEWORK_FLOORED = ("django", "fastapi", "httpx", "celery", "sqlalchemy")
# What those tests import besides the frameworks, from the test extra (newest that fits).
LOWEST_FRAMEWORKS_EXTRAS = (
    "pytest",
    "pytest-asyncio",
    "pytest-xdist",
    "hypothesis",
    "fakeredis",
    "flask",  # tests/client's WSGI app, tests/sql/test_http_fenced.py
    "werkzeug",
    "litestar",  # tests/adapters/conftest.py loads every harness
    "uvicorn",  # tests/frameworks/test_django.py and tests/client serve over real sockets
    "gunicorn",
    "hypercorn",  # tests/adapters/test_asgi_streams.py (the Starlette floor's run)
    "prometheus-client",  # tests/frameworks/test_bounded_labels.py
    "stripe",  # tests/frameworks/test_stripe.py
    "psycopg",  # tests/sql on PostgreSQL (skips when no server answers)
    "aiosqlite",
)
# The integrations' tests: the framework tests, the shared adapter suite (every harness,
# Django, FastAPI and Starlette among them), the client, Celery and the fenced SQL effects.
LOWEST_FRAMEWORKS_TESTS = [
    "tests/frameworks",
    "tests/adapters/test_suite.py",
    "tests/adapters/test_policy_fields.py",
    "tests/adapters/test_response_matrix.py",
    "tests/adapters/test_compress.py",
    "tests/client",
    "tests/contrib/test_celery.py",
    "tests/sql",
]
# Run again on Starlette's floor: the tests that build Starlette or FastAPI apps.
STARLETTE_FLOOR_TESTS = [
    "tests/adapters/test_suite.py",
    "tests/adapters/test_asgi.py",
    "tests/adapters/test_asgi_streams.py",
    "tests/frameworks/test_fastapi.py",
]
# The test extra's packages `minimal` installs: a test runner (on workers) and fakeredis, no
# framework.
MINIMAL_EXTRAS = ("pytest", "pytest-asyncio", "pytest-xdist", "hypothesis", "fakeredis")
# What `minimal` runs: every test that needs no framework, web server, metrics library or
# other optional client. Listed, not discovered: these modules import such packages at the
# top and do not skip without them, so the list says what must pass without extras.
MINIMAL_TESTS = [
    "tests/unit",
    "tests/store",
    "tests/faults",
    "tests/fuzz",
    "tests/typing",
    "tests/test_version.py",
]
MINIMAL_IGNORE = [
    "tests/store/test_clients.py",  # valkey
    "tests/faults/test_crash.py",  # werkzeug (drives the WSGI adapter)
    "tests/faults/test_durability.py",  # werkzeug
    "tests/faults/test_faults.py",  # werkzeug, httpx
    "tests/faults/test_faults_asgi.py",  # httpx
]
# Both runs leave out what has its own session or CI step.
NOT_HEAVY = "not slow and not cluster and not benchmark"
# The inner loop (`nox -s quick`; under 90 s on a loaded 2-core box): every decision without
# Redis, the scripts and both state machines on real Redis and fakeredis, the shared adapter
# suite (decision rows on two harnesses, byte-moving rows on every one) and the in-process
# adapter tests, the generated twins. No server subprocess, nothing slow, no cluster: those
# are in the whole suite, which `pytest` (or `nox -s tests`) still runs, as CI does.
QUICK_TESTS = [
    "tests/unit",
    "tests/store",
    "tests/steps",
    "tests/adapters/test_suite.py",
    "tests/adapters/test_lifecycle.py",
    "tests/adapters/test_options.py",
    "tests/adapters/test_asgi.py",
    "tests/adapters/test_wsgi.py",
    "tests/adapters/test_flask.py",
    "tests/test_generated.py",
]


def _requirements(names: tuple[str, ...], group: str) -> list[str]:
    """The requirement strings for ``names`` in pyproject.toml's ``group`` list.

    A plain scan of the TOML list (the noxfile also runs on Python 3.10, which has no tomllib).
    """
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    start = text.index(f"\n{group} = [")
    listing = text[start : text.index("\n]", start)]
    found = []
    for requirement in re.findall(r'"([^"]+)"', listing):
        name = re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].lower()
        if name in names:
            found.append(requirement)
    return found


def lowest_pins(names: tuple[str, ...] = FLOORED) -> list[str]:
    """``name==floor`` for each of ``names``: the lowest version pyproject.toml allows.

    Every declaration of a package (dependencies and each extra) must name the same floor, so
    there is one floor to test.
    """
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    pins = []
    for name in names:
        floors = set(re.findall(rf'"{name}(?:\[[^\]]*\])?>=([0-9][0-9.]*)"', text))
        if len(floors) != 1:
            raise ValueError(f"pyproject.toml declares {name} with floors {sorted(floors)}")
        pins.append(f"{name}=={floors.pop()}")
    return pins


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The test suite, benchmarks excluded. Extra arguments go to pytest.

    `build` is installed so that tests/test_packaging.py builds and inspects a real wheel.
    """
    session.install("-c", LOCK, "-e", ".[test]", "build")
    session.run("pytest", *session.posargs)  # benchmarks excluded by pyproject's addopts


@nox.session(python=CURRENT)
def deep(session: nox.Session) -> None:
    """The whole suite in its long form (IDEMKEY_DEEP=1, tests/_depth.py; CI runs it for the
    tests that have one, `-m "hypothesis or long_form"`, when it has the minutes): the
    soak races for 25 s, the fuzz tests draw four times their default examples and every other
    hypothesis test 500. Extra arguments go to pytest."""
    session.install("-c", LOCK, "-e", ".[test]", "build")
    session.run("pytest", *session.posargs, env={"IDEMKEY_DEEP": "1"})


@nox.session(python=CURRENT)
def quick(session: nox.Session) -> None:
    """The inner-loop tier: QUICK_TESTS without the heavy markers, in under 90 s. Arguments
    after -- replace the list. Not the whole suite: run `pytest` before you push."""
    session.install("-c", LOCK, "-e", ".[test]")
    # Two workers, not addopts' cores + 2: these tests hardly wait, and each worker imports and
    # collects them all again (measured on a loaded 2-core box: 67 s with two, 79 s with four).
    session.run("pytest", "-m", NOT_HEAVY, "-n", "2", *(session.posargs or QUICK_TESTS))


@nox.session(python=CURRENT)
def lint(session: nox.Session) -> None:
    """ruff lint and format check (no changes made)."""
    session.install("-c", LOCK, "ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=CURRENT)
def typing(session: nox.Session) -> None:
    """mypy --strict on the package and on tests/typing/api.py (user code of the public API).

    Installs the test extra too: the package imports optional clients (valkey) whose types
    mypy must see, exactly as in .ci/run.
    """
    session.install("-c", LOCK, "-e", ".[test]", "mypy")
    session.run("mypy", "--strict", "idemkey")
    session.run("mypy", "--strict", "tests/typing/api.py")


@nox.session(python=CURRENT, venv_backend="venv")
def lowest(session: nox.Session) -> None:
    """The tests on the lowest versions pyproject.toml allows for FLOORED, in a plain venv.

    Installs the test extra with those exact versions (the rest resolves as usual). Positional
    arguments replace LOWEST_TESTS.
    """
    pins = lowest_pins()
    session.install("-e", ".[test]", *pins)
    session.run("python", "-m", "pip", "freeze", "--exclude-editable", silent=False)
    session.run("pytest", "-m", NOT_HEAVY, *(session.posargs or LOWEST_TESTS))


@nox.session(python=CURRENT, venv_backend="venv")
def lowest_core(session: nox.Session) -> None:
    """The same floors with only the packages LOWEST_CORE_TESTS import (CI's step).

    The full test extra takes minutes to install into a fresh venv with nothing cached; the
    core, the Flask extension and the WSGI and ASGI middlewares need Flask, httpx, Starlette
    (one ASGI test), fakeredis and the test runner. Positional arguments replace LOWEST_CORE_TESTS.
    """
    extras = _requirements(LOWEST_CORE_EXTRAS, "test")
    session.install("-e", ".[flask]", *extras, *lowest_pins())
    session.run("python", "-m", "pip", "freeze", "--exclude-editable", silent=False)
    session.run("pytest", "-m", NOT_HEAVY, *(session.posargs or LOWEST_CORE_TESTS))


@nox.session(python=CURRENT, venv_backend="venv")
def lowest_frameworks(session: nox.Session) -> None:
    """The integrations' tests on the floors of the framework extras (FRAMEWORK_FLOORED).

    Django, FastAPI, httpx, Celery and SQLAlchemy at the exact lowest version pyproject.toml
    allows; the test tools resolve as usual. FastAPI's floor brings its own Starlette (below
    Starlette's floor, as a user of the fastapi extra alone gets it); Starlette's floor is then
    installed over it (without dependencies: pip would refuse it beside FastAPI 0.110.0) for
    STARLETTE_FLOOR_TESTS. Positional arguments replace LOWEST_FRAMEWORKS_TESTS (and skip
    that second run).
    """
    extras = _requirements(LOWEST_FRAMEWORKS_EXTRAS + FRAMEWORK_FLOORED, "test")
    session.install("-e", ".", *extras, *lowest_pins(FRAMEWORK_FLOORED))
    session.run("python", "-m", "pip", "freeze", "--exclude-editable", silent=False)
    session.run("pytest", "-m", NOT_HEAVY, *(session.posargs or LOWEST_FRAMEWORKS_TESTS))
    if session.posargs:
        return
    (starlette_floor,) = lowest_pins(("starlette",))
    session.install("--no-deps", starlette_floor)
    session.run("pytest", "-m", NOT_HEAVY, *STARLETTE_FLOOR_TESTS)


@nox.session(python=CURRENT, venv_backend="venv")
def minimal(session: nox.Session) -> None:
    """MINIMAL_TESTS with no optional dependency (redis, msgspec, xxhash, no framework).

    From the test extra only pytest, pytest-asyncio, hypothesis and fakeredis are installed.
    """
    session.install("-e", ".", *_requirements(MINIMAL_EXTRAS, "test"))
    ignore = [f"--ignore={path}" for path in MINIMAL_IGNORE]
    session.run("pytest", "-m", NOT_HEAVY, *ignore, *(session.posargs or MINIMAL_TESTS))


@nox.session(python=CURRENT)
def cluster(session: nox.Session) -> None:
    """Tests against a real 3-master Redis cluster that the test session starts."""
    session.install("-c", LOCK, "-e", ".[test]")
    session.run("pytest", "-m", "cluster", *session.posargs)


@nox.session(python=CURRENT)
def bench(session: nox.Session) -> None:
    """The latency-budget suite (benchmarks/). Arguments after -- go to it."""
    session.install("-e", ".[test,bench]")
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session(python=CURRENT)
def bench_smoke(session: nox.Session) -> None:
    """The `benchmark`-marked tests: the quick suite under loose ratio budgets, in one process
    (-n 0): ratios timed beside other workers' tests would measure the neighbours."""
    session.install("-c", LOCK, "-e", ".[test]")
    session.run("pytest", "-m", "benchmark", "-n", "0", *session.posargs)


@nox.session(python=CURRENT)
def docs(session: nox.Session) -> None:
    """The docs site (mkdocs.yml) built with --strict into site/, as CI does; ``-- serve``
    serves it on localhost:8000 instead."""
    session.install("-c", LOCK, "-e", ".[docs]")
    session.env["NO_MKDOCS_2_WARNING"] = "1"
    if session.posargs[:1] == ["serve"]:
        session.run("mkdocs", "serve", *session.posargs[1:])
    else:
        session.run("mkdocs", "build", "--strict", *session.posargs)


#: The pages' tests: run as printed, twice against one Redis, in process and on real servers,
#: and each page in a fresh venv built from its own install line.
PAGE_TESTS = [
    "tests/test_pages.py",
    "tests/test_pages_fresh.py",
    "tests/steps/test_docs.py",
    "tests/frameworks/test_docs_pages.py",
    "tests/test_behaviour_page.py",
    "tests/contrib/test_queues_page.py",
    "tests/test_install_lines.py",
]


@nox.session(python=CURRENT)
def pages(session: nox.Session) -> None:
    """Every documentation page's samples as a newcomer runs them: twice against one Redis,
    and every page of tests/test_pages_fresh.py in a fresh venv from the page's install line
    (CI's pytest runs one page per integration that way)."""
    session.install("-c", LOCK, "-e", ".[test]")
    session.env["IDEMKEY_FRESH_PAGES"] = "all"
    session.run("pytest", *(session.posargs or PAGE_TESTS))


@nox.session(python=CURRENT)
def build(session: nox.Session) -> None:
    """Build sdist and wheel into dist/, then check the wheel ships the Lua scripts."""
    session.install("build")
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", "--outdir", str(dist))
    wheels = sorted(dist.glob("idemkey_redis-*.whl"))
    if len(wheels) != 1:
        session.error(f"expected one wheel in {dist}, found {[w.name for w in wheels]}")
    with zipfile.ZipFile(wheels[0]) as zf:
        names = set(zf.namelist())
    missing = [name for name in WHEEL_MUST_CONTAIN if name not in names]
    if missing:
        session.error(f"{wheels[0].name} lacks {missing}")
    session.log(f"{wheels[0].name} ships {len(WHEEL_MUST_CONTAIN)} required files")


@nox.session(python=CURRENT)
def lock(session: nox.Session) -> None:
    """Write constraints.txt: every package of LOCKED_EXTRAS pinned, for Python 3.10 and later
    on any platform (uv's universal resolution; tests/test_lock.py fails when pyproject.toml
    asks for a package or a range the lock does not hold)."""
    session.install("uv>=0.9")
    extras = [arg for extra in LOCKED_EXTRAS for arg in ("--extra", extra)]
    session.run(
        "uv", "pip", "compile", "pyproject.toml", *extras, "--universal",
        "--python-version", "3.10", "--upgrade", "--output-file", LOCK,
        "--custom-compile-command", "nox -s lock",
    )  # fmt: skip


#: The packages whose versions ``newest`` reports (the closing note of each landing names them).
NEWEST_REPORTED = (
    "redis", "pytest", "pytest-asyncio", "pytest-xdist", "hypothesis", "starlette", "fastapi",
    "django", "flask", "werkzeug", "celery", "sqlalchemy", "mcp", "fakeredis", "msgspec",
    "uvicorn", "hypercorn", "gunicorn", "httpx",
)  # fmt: skip
#: What ``newest`` runs: the quick tier, and the integrations whose upstreams move fastest.
# (Not the pages or the packaging tests: they build venvs and wheels, a minute of CI's 20, and
# the main leg runs them.)
NEWEST_TESTS = [
    *QUICK_TESTS,
    "tests/contrib",
    "tests/sql",
    "tests/frameworks/test_fastapi.py",
    "tests/frameworks/test_django.py",
]


@nox.session(python=CURRENT, venv_backend="venv")
def newest(session: nox.Session) -> None:
    """The test extra at the newest releases the package index serves (no lock, upgraded), in a
    fresh venv, running NEWEST_TESTS: the next upstream release that breaks idemkey fails the
    next landing (.ci/run runs it), not a newcomer's first run. Positional arguments replace
    NEWEST_TESTS."""
    session.install("--upgrade", "-e", ".[test]", "build")
    session.run(
        "python", "-c",
        "import sys; from importlib.metadata import version\n"
        "for name in sys.argv[1:]: print(f'{name}=={version(name)}')",
        *NEWEST_REPORTED, silent=False,
    )  # fmt: skip
    session.run("pytest", "-m", NOT_HEAVY, "-n", "2", *(session.posargs or NEWEST_TESTS))
