"""The public API type-checks in user code: ``mypy --strict tests/typing/api.py``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_the_public_api_type_checks_under_mypy_strict() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "tests/typing/api.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
