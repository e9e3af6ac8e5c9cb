"""Every ``pip install`` line we print installs this project: the distribution ``idemkey-redis``.

``idemkey`` on the package index is another project, so a line naming it (or any other
distribution) installs the wrong thing. Read from README.md, docs/**/*.md, the package's and
the benchmarks' sources (docstrings, error messages, RESULTS.md) and the CLI's ``--help`` of
every command; each
requirement must be ``idemkey-redis[...]`` (optionally ``@ git+URL`` or ``@ file:`` a checkout),
the checkout ``.``, or a server or worker a page runs its sample on (:data:`BESIDE`), and every
extra it names must exist in pyproject.toml.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

from idemkey.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parent.parent
DISTRIBUTION = "idemkey-redis"
#: What a page installs beside idemkey-redis: the server or worker that runs its sample, and
#: the test runner. Never a distribution named idemkey-anything but this one.
BESIDE: frozenset[str] = frozenset({"gunicorn", "uvicorn", "pytest", "rq", "arq", "dramatiq"})

# After "pip install", on its line: options, quoted requirements, or bare ones (name, path,
# [extras]).
_TOKEN = re.compile(r"""[ \t]+('[^'\n]*'|"[^"\n]*"|-[\w-]+|[\w.~/][\w.~/\-\[\],]*)""")
_REQUIREMENT = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[(?P<extras>[^\]]*)\])?"
    r"(?:\s*@\s*(?P<url>\S+))?$"
)
_LOCAL = re.compile(r"^\.(?:\[(?P<extras>[^\]]*)\])?$")


def _extras() -> set[str]:
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    start = text.index("[project.optional-dependencies]")
    section = text[start : text.index("\n[", start + 1)]
    return set(re.findall(r"^([a-z][a-z0-9-]*) = \[", section, re.MULTILINE))


def requirements(text: str) -> list[str]:
    """The requirements of every ``pip install`` in ``text`` (quotes removed)."""
    found = []
    for match in re.finditer(r"pip install", text):
        pos, these, takes_value = match.end(), [], False
        while token := _TOKEN.match(text, pos):
            pos = token.end()
            value = token.group(1)
            if takes_value:  # the file of -c / -r: not a requirement
                takes_value = False
                continue
            if value.startswith("-"):
                takes_value = value in ("-c", "-r", "--constraint", "--requirement")
                continue  # -e, -U, --no-deps
            these.append(value.strip("'\""))
        found += these or [""]  # "" : nothing readable on the line (wrapped?), which fails
    return found


def _help_texts(capsys: pytest.CaptureFixture[str]) -> str:
    texts = []
    for argv in (["--help"], *([name, "--help"] for name in COMMANDS)):
        assert main(argv) == 0
        texts.append(capsys.readouterr().out)
    return "\n".join(texts)


def _sources() -> dict[str, str]:
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    paths += [p for d in ("idemkey", "benchmarks") for p in sorted((ROOT / d).rglob("*.py"))]
    paths += sorted((ROOT / "benchmarks").rglob("*.md"))
    return {str(p.relative_to(ROOT)): p.read_text("utf-8") for p in paths}


def _check(requirement: str) -> str | None:
    """Why ``requirement`` is wrong, or None."""
    extras = _extras()
    local = _LOCAL.match(requirement)
    match = local or _REQUIREMENT.match(requirement)
    if not requirement:
        return "no requirement on the same line (keep the command on one line)"
    if match is None:
        return "not a requirement of this project"
    if not local:
        name = re.sub(r"[-_.]+", "-", match["name"]).lower()
        if name in BESIDE and not match["extras"] and not match["url"]:
            return None
        if name != DISTRIBUTION:
            return f"names the distribution {match['name']!r}, not {DISTRIBUTION!r}"
        if match["url"] and not match["url"].startswith(("git+", "file:")):
            return "a direct reference that is neither a git URL nor a checkout"
    unknown = {e.strip() for e in (match["extras"] or "").split(",") if e.strip()} - extras
    return f"names extras {sorted(unknown)} that pyproject.toml lacks" if unknown else None


def test_the_parser_reads_the_forms_we_print() -> None:
    assert requirements("`pip install -e '.[demo]' && idemkey demo`") == [".[demo]"]
    assert requirements("``pip install 'idemkey-redis[client]'``") == ["idemkey-redis[client]"]
    assert requirements('x: pip install "idemkey-redis[demo]", "') == ["idemkey-redis[demo]"]
    assert requirements('pip install "idemkey-redis[flask] @ git+https://h/o/r"') == [
        "idemkey-redis[flask] @ git+https://h/o/r"
    ]
    assert requirements("(`pip install\n  'idemkey-redis[otel]'`)") == [""]  # wrapped: fails
    assert _check("idemkey[testing]") is not None  # the other project on the index
    assert _check("idemkey-redis[nope]") is not None
    assert _check("fakeredis") is not None  # a dependency, never installed by hand
    assert _check("uvicorn") is None  # the server a page's sample runs on
    assert _check("idemkey-redis[flask] @ file:///path/to/checkout") is None
    assert _check("idemkey_redis[sql]") is None
    assert _check(".[test,bench]") is None


def test_every_install_line_names_this_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    sources = _sources()
    sources["idemkey --help (every command)"] = _help_texts(capsys)
    bad, seen = [], 0
    for where, text in sources.items():
        for requirement in requirements(text):
            seen += 1
            why = _check(requirement)
            if why:
                bad.append(f"{where}: pip install {requirement}: {why}")
    assert not bad, "\n".join(bad)
    assert seen >= 10  # the README's, the docs', the error messages': the parser finds them


def test_getting_started_says_how_to_install_before_publication() -> None:
    page = requirements((ROOT / "docs" / "getting-started.md").read_text("utf-8"))
    assert ".[flask]" in page  # from a checkout
    assert any(r.startswith(f"{DISTRIBUTION}[flask] @ git+") for r in page)  # from git
    assert "docs/getting-started.md#install" in (ROOT / "README.md").read_text("utf-8")


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    # The test environment installs this checkout (`pip install -e '.[test]'`) as idemkey-redis.
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out == f"idemkey {metadata.version(DISTRIBUTION)} (the {DISTRIBUTION} distribution)\n"
