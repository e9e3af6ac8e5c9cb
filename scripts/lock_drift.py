"""Which installed packages the lock pins at another version: ``python scripts/lock_drift.py
constraints.txt`` prints one ``name installed (lock: version)`` line per such package and
nothing when the environment running it holds exactly the lock's versions.

`.ci/run` asks it of the newest releases' venv (``nox -s newest``): where that venv holds the
lock's versions, the suite has just run on them and the step says so instead of running again.
A package the lock does not name is drift too (a new dependency of an upgraded one).
"""

from __future__ import annotations

import sys
from importlib.metadata import distributions
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

__all__ = ["drift", "locked_versions"]


def locked_versions(text: str) -> dict[str, str]:
    """``name -> version`` of each ``name==version`` line of a lock whose marker holds here."""
    pins: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "-")):
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        (spec,) = requirement.specifier  # a lock pins: exactly one ==
        pins[canonicalize_name(requirement.name)] = spec.version
    return pins


def drift(lock_text: str, installed: dict[str, str]) -> list[str]:
    """One line per installed package at a version the lock does not pin, sorted by name."""
    pins = locked_versions(lock_text)
    return [
        f"{name} {version} (lock: {pins.get(name, 'not pinned')})"
        for name, version in sorted(installed.items())
        if pins.get(name) != version
    ]


def _installed() -> dict[str, str]:
    """The environment's distributions, but the ones the lock never holds: pip's own tools and
    idemkey itself (installed editable from the checkout)."""
    skip = {"pip", "setuptools", "wheel", "idemkey-redis"}
    found = {canonicalize_name(d.metadata["Name"]): d.version for d in distributions()}
    return {name: version for name, version in found.items() if name not in skip}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/lock_drift.py LOCK_FILE", file=sys.stderr)
        return 2
    for line in drift(Path(argv[0]).read_text(encoding="utf-8"), _installed()):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
