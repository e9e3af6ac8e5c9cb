"""The version has one source, pyproject.toml, and ``idemkey.__version__`` reports it."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import idemkey

ROOT = Path(__file__).resolve().parent.parent


def _declared_version() -> str:
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    match = re.search(r'^version = "([^"]+)"$', text, re.MULTILINE)
    assert match, "pyproject.toml declares no static version"
    return match.group(1)


def test_the_package_reports_the_version_pyproject_declares() -> None:
    # The test environment installs this checkout (editable), so its metadata is pyproject's;
    # the distribution is idemkey-redis ("idemkey" on the package index is another project).
    assert metadata.version("idemkey-redis") == _declared_version()
    assert idemkey.__version__ == _declared_version()


def test_the_version_is_written_only_in_pyproject() -> None:
    source = (ROOT / "idemkey" / "__init__.py").read_text("utf-8")
    assert _declared_version() not in source
