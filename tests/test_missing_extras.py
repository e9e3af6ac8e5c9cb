"""An optional module imported without its extra says which extra to install (one line naming
``pip install 'idemkey-redis[EXTRA]'``), not a bare ``No module named 'flask'``. Each case runs
in a fresh interpreter where the package cannot be imported (``sys.modules[name] = None``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CASES = [
    # (what the user runs, the packages missing, the extra)
    ("import idemkey.adapters.flask", ("flask",), "flask"),
    ("import idemkey.adapters.fastapi", ("fastapi",), "fastapi"),
    ("import idemkey.adapters.django", ("django",), "django"),
    ("import idemkey.contrib.celery", ("celery",), "celery"),
    ("import idemkey.console", ("jinja2",), "console"),
    ("import idemkey.console", ("starlette",), "console"),
    (
        "from idemkey.contrib.sqlalchemy import effects_table; effects_table()",
        ("sqlalchemy",),
        "sql",
    ),
]


def _run(code: str, blocked: tuple[str, ...], path: str = "") -> subprocess.CompletedProcess[str]:
    prelude = "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in blocked)
    if path:
        prelude += f"sys.path.insert(0, {path!r})\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(("code", "blocked", "extra"), CASES, ids=[c[0] for c in CASES])
def test_a_missing_extra_names_its_install_line(
    code: str, blocked: tuple[str, ...], extra: str
) -> None:
    result = _run(code, blocked)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(("ImportError", "ModuleNotFoundError")), result.stderr
    assert f"pip install 'idemkey-redis[{extra}]'" in last, result.stderr


def test_an_unsupported_mcp_is_named_with_the_range_required(tmp_path: Path) -> None:
    """mcp 2.x installed (a stand-in package with its metadata: 2.x has no FastMCP module)."""
    (tmp_path / "mcp" / "server").mkdir(parents=True)
    (tmp_path / "mcp" / "__init__.py").write_text("")
    (tmp_path / "mcp" / "server" / "__init__.py").write_text("")
    info = tmp_path / "mcp-2.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mcp\nVersion: 2.0.0\n")
    result = _run("import idemkey.contrib.mcp", (), str(tmp_path))
    last = result.stderr.strip().splitlines()[-1]
    assert "found mcp 2.0.0 but needs" in last, result.stderr
    assert "mcp>=1.30,<2" in last, result.stderr
