"""The pages as a newcomer meets them: a fresh virtual environment built from the page's own
install line, then its samples run as printed, twice against one Redis.

The venv is new (``python -m venv``: no system site-packages, nothing of the suite's
environment) and gets exactly what the page's install line says (docs/snippets/install.md,
expanded by scripts/mkdocs_hooks.py): ``pip install -e '.[extra]' beside``, in this checkout,
which stands in for the ``git clone`` the line starts with (the commit under test, not the
published repository). pip's own cache keeps it quick. So a sample that imports a package its
page does not install, or that only works on an empty Redis, fails here.

A page of python blocks runs them under the venv's interpreter with ``tests/_pages.py`` (every
block, then every block again); a page that serves an app starts the server the page names,
from the venv, twice: the first run answers and replays, the second replays the first run's
request; testing.md's files, saved in a new directory, are the venv's pytest run, twice (the
second time under ``-W error``, which the page's pytest.ini is for). CI runs one page per
integration (:data:`CI`); ``nox -s pages`` runs them all (``IDEMKEY_FRESH_PAGES=all``).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from idemkey.http._scope import NO_CREDENTIALS
from scripts.mkdocs_hooks import REPOSITORY, expand_install
from tests._pages import write_page
from tests._servers import RedisServer, free_port, user_environ
from tests.frameworks.test_docs_pages import (
    SAMPLES,
    replays_on_a_second_run,
    retries_behave,
    serving,
    set_up,
)

ROOT = Path(__file__).resolve().parent.parent
#: One page per integration: the core (guard), the client, Flask (getting-started's line, then
#: the Flask page's app) and an ASGI framework (FastAPI).
CI = ("guard.md", "client.md", "getting-started.md", "fastapi.md")
ALL = (
    *CI,
    *("steps.md", "starlette.md", "django.md", "wsgi-asgi.md", "flask.md", "effects.md"),
    *("glide.md", "operators.md", "testing.md"),
)
EVERY = os.environ.get("IDEMKEY_FRESH_PAGES") == "all"


def install_arguments(name: str) -> list[str]:
    """The arguments of the page's ``pip install`` lines, ``.`` made this checkout's path;
    checked to follow the clone of the project's repository."""
    text = expand_install((ROOT / "docs" / name).read_text("utf-8"))
    assert f"git clone {REPOSITORY} && cd idemkey\n" in text, f"{name}: no clone line"
    lines = re.findall(r"^pip install -e (.+?)(?:  #.*)?$", text, re.M)
    assert lines, f"{name}: no install line"
    arguments = [argument for line in lines for argument in shlex.split(line)]
    return [str(ROOT) + a[1:] if a.startswith(".") else a for a in dict.fromkeys(arguments)]


def fresh_venv(where: Path, name: str) -> Path:
    """A new venv with the page's install line installed; its bin directory."""
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(where)
    bin_dir = where / ("Scripts" if sys.platform == "win32" else "bin")
    env = user_environ()
    env.pop("PYTHONPATH", None)  # the suite's path names this checkout: the venv must not see it
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    command = [str(bin_dir / "python"), "-m", "pip", "install", "-q", "-e"]
    done = subprocess.run(
        [*command, *install_arguments(name)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return bin_dir


def pages() -> list[object]:
    skip = [pytest.mark.skip(reason="nox -s pages runs it")]
    return [pytest.param(n, marks=[] if n in CI or EVERY else skip, id=n) for n in ALL]


def run_blocks(bin_dir: Path, name: str, url: str, where: Path, *pairs: str) -> list[list[str]]:
    """The page's blocks run twice by tests/_pages.py under the venv, in the directory
    ``where`` (a sample may write files: effects.md's SQLite database); each run's lines."""
    env = user_environ()
    env.pop("PYTHONPATH", None)
    where.mkdir(exist_ok=True)
    page_path = str(ROOT / "docs" / name)
    done = subprocess.run(
        # -I: neither tests/ (whose typing/ would shadow the module) nor this checkout is on
        # the path; idemkey and its dependencies come from the venv alone.
        [str(bin_dir / "python"), "-I", str(ROOT / "tests" / "_pages.py"), page_path, url, *pairs],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    first, second = done.stdout.split("== run 2\n")
    return [first.removeprefix("== run 1\n").splitlines(), second.splitlines()]


def served_twice(bin_dir: Path, name: str, url: str, tmp_path: Path) -> None:
    """The page's app on the server it names, from the venv: the retries behave, then a
    second run of the server replays the first run's request."""
    (tmp_path / "app").mkdir()
    where, argv = set_up(name, tmp_path / "app", url, bin_dir)
    prefix = SAMPLES[name].prefix
    with serving(argv, where, pythonpath=()) as base:  # the scope: every page's default
        retries_behave(base, url, "/charges", scope=NO_CREDENTIALS, prefix=prefix)
    with serving(argv, where, pythonpath=()) as base:
        replays_on_a_second_run(base, "/charges")


def page_tests_pass_twice(bin_dir: Path, where: Path) -> None:
    """testing.md's files saved in ``where``, a new directory (as the page says: not the
    clone, whose own tests pytest would collect too), and the venv's pytest run there as the
    page says, then again under ``-W error``: the page's tests pass, with no warning."""
    where.mkdir()
    # The app's own Redis URL points at a port nothing listens on: only the kit's stores answer.
    write_page("docs/testing.md", where, redis_url=f"redis://127.0.0.1:{free_port()}")
    env = user_environ()
    env.pop("PYTHONPATH", None)
    env.pop("IDEMKEY_REDIS_URL", None)
    for options in ([], ["-W", "error"]):
        done = subprocess.run(
            [str(bin_dir / "pytest"), *options],
            cwd=where,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert re.search(r"^=+ 3 passed in [\d.]+s =+$", done.stdout, re.M), done.stdout


@pytest.fixture
def url(private_redis_server: RedisServer) -> str:
    return private_redis_server.url


@pytest.mark.redis
@pytest.mark.parametrize("name", pages())
def test_the_page_in_a_fresh_venv_from_its_install_line_twice(
    name: str, url: str, tmp_path: Path
) -> None:
    bin_dir = fresh_venv(tmp_path / "venv", name)
    if name in ("getting-started.md", "flask.md"):  # getting-started's line, Flask's app
        served_twice(bin_dir, "flask.md", url, tmp_path)
    elif name in ("fastapi.md", "starlette.md", "wsgi-asgi.md", "django.md"):
        served_twice(bin_dir, name, url, tmp_path)
    elif name == "testing.md":
        page_tests_pass_twice(bin_dir, tmp_path / "charges-tests")
    elif name == "client.md":

        def serve(port: int) -> list[str]:
            return [str(bin_dir / "idemkey"), "serve", "--port", str(port), "--redis-url", url]

        (tmp_path / "serve").mkdir()
        with serving(serve, tmp_path / "serve", pythonpath=()) as base:
            first, second = run_blocks(
                bin_dir, name, url, tmp_path / "run", f"http://127.0.0.1:8000={base}"
            )
        assert first[-2].startswith("paid: ")
        assert first[-1].startswith("already paid: ")
        assert second[-1] == first[-1]  # the earlier run's payment, refused as a replay
        assert "201 True True" in second
    else:
        first, second = run_blocks(bin_dir, name, url, tmp_path / "run")
        replayed = {
            "guard.md": "charged by this run: []",
            "steps.md": "PSP calls by this run: 0",
        }.get(name)
        if replayed:
            assert replayed not in first, first
            assert replayed in second, second
