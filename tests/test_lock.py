"""constraints.txt, the test environment's lock, holds what pyproject.toml asks for.

The README's test command and .ci/run install through it (`pip install -c constraints.txt ...`),
so a fresh clone runs exactly the versions CI ran. A requirement added to pyproject.toml, or a
range moved past the pinned version, without `nox -s lock` fails here instead of installing a
version nobody ran.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

packaging = pytest.importorskip("packaging")
from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402

from scripts.lock_drift import locked_versions  # noqa: E402

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the noxfile's interpreters: 3.10 has no tomllib
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "constraints.txt"
# The extras the lock covers (noxfile.LOCKED_EXTRAS): the README's two commands, CI's docs
# build and the tools.
LOCKED_EXTRAS = ("demo", "test", "docs", "dev")


def _wanted() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    wanted = [Requirement(text) for text in project["dependencies"]]
    for extra in LOCKED_EXTRAS:
        wanted += [Requirement(text) for text in project["optional-dependencies"][extra]]
    own = canonicalize_name(project["name"])
    return [
        requirement
        for requirement in wanted
        if canonicalize_name(requirement.name) != own
        and (requirement.marker is None or requirement.marker.evaluate())
    ]


def test_the_lock_pins_every_requirement_within_its_range() -> None:
    pins = locked_versions(LOCK.read_text("utf-8"))
    problems = []
    for requirement in _wanted():
        name = canonicalize_name(requirement.name)
        if name not in pins:
            problems.append(f"{requirement}: not in the lock")
        elif not requirement.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{requirement}: the lock pins {pins[name]}")
    assert not problems, "run `nox -s lock`: " + "; ".join(problems)


def test_the_check_reads_a_stale_lock_as_stale() -> None:
    """The check above can fail: a lock that lacks a package, or pins outside a range."""
    pins = locked_versions("redis==5.0.0\nflask==3.1.0 ; python_version < '3'\n")
    assert pins == {"redis": "5.0.0"}
    assert not Requirement("redis>=5.0.1").specifier.contains(pins["redis"])


def test_the_readme_and_ci_install_through_the_lock() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    assert "pip install -c constraints.txt -e '.[test]' && pytest" in readme
    ci = (ROOT / ".ci" / "run").read_text("utf-8")
    assert "-c constraints.txt" in ci
