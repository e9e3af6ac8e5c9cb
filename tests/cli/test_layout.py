"""The command line's shape: ``import idemkey`` stays free of Flask and the CLI, and the demo
app does not depend on the command line (no import cycle, its own error type)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from idemkey.cli import CliError
from idemkey.cli.demo_app import DemoError

ROOT = Path(__file__).resolve().parents[2]
DEMO_APP = ROOT / "idemkey" / "cli" / "demo_app"


def _imported_modules(code: str) -> set[str]:
    """Every module name ``python -X importtime -c code`` reports importing."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        timeout=60,
    )
    names = set()
    for line in result.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def _under(names: set[str], package: str) -> set[str]:
    return {n for n in names if n == package or n.startswith(package + ".")}


def test_import_idemkey_imports_neither_flask_nor_the_cli() -> None:
    names = _imported_modules("import idemkey")
    assert "idemkey" in names  # the parse works: the package itself is listed
    assert _under(names, "flask") == set()
    assert _under(names, "werkzeug") == set()
    assert _under(names, "idemkey.cli") == set()


def test_the_cli_imports_no_web_framework_until_a_demo_command_runs() -> None:
    names = _imported_modules("import idemkey.cli")
    assert "idemkey.cli.probe" in names
    assert _under(names, "flask") == set()


def _is_cli(module: str) -> bool:
    """idemkey.cli or a module under it (idemkey.client is another package)."""
    return module == "idemkey.cli" or module.startswith("idemkey.cli.")


def test_the_demo_app_imports_nothing_of_the_command_line() -> None:
    for path in sorted(DEMO_APP.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                # level 1: the demo package itself; level 3: idemkey. Level 2 is idemkey.cli.
                assert node.level != 2, f"{path.name} imports from idemkey.cli"
                assert not _is_cli(node.module or ""), path.name
            elif isinstance(node, ast.Import):
                assert not any(_is_cli(a.name) for a in node.names), path.name
            if isinstance(node, ast.Name):
                assert node.id != "CliError", f"{path.name} uses the CLI's error type"


def test_the_demo_and_the_cli_have_separate_error_types() -> None:
    assert not issubclass(DemoError, CliError)
    assert not issubclass(CliError, DemoError)
