"""The atheris target runs (a short, bounded run), when atheris is installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TARGET = Path(__file__).with_name("fuzz_http.py")


def test_the_atheris_target_runs_clean(tmp_path: Path) -> None:
    pytest.importorskip("atheris")
    result = subprocess.run(
        [sys.executable, str(TARGET), "-runs=3000", "-seed=1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # a crash file, if any, lands here
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Done 3000 runs" in result.stderr
