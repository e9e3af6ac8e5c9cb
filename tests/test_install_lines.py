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
from scripts.mkdocs_hooks import INSTALL, REPOSITORY, expand_install, install

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


def _pages() -> list[Path]:
    """The site's pages (the install template, docs/snippets/, is what they include)."""
    return [p for p in sorted((ROOT / "docs").rglob("*.md")) if "snippets" not in p.parts]


def _sources() -> dict[str, str]:
    """Each file we print, docs pages as the site shows them (install lines expanded)."""
    paths = [ROOT / "README.md", *_pages()]
    paths += [p for d in ("idemkey", "benchmarks") for p in sorted((ROOT / d).rglob("*.py"))]
    paths += sorted((ROOT / "benchmarks").rglob("*.md"))
    return {str(p.relative_to(ROOT)): expand_install(p.read_text("utf-8")) for p in paths}


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
    text = expand_install((ROOT / "docs" / "getting-started.md").read_text("utf-8"))
    assert f"git clone {REPOSITORY} && cd idemkey\n" in text  # the checkout, then:
    assert requirements(text)[:2] == [".[flask]", f"{DISTRIBUTION}[flask]"]  # and once published


def test_every_page_installs_through_the_one_template() -> None:
    """A page says what it installs with ``<!-- install [extras] beside -->``, expanded from
    docs/snippets/install.md at build time: no page carries a copy of the lines."""
    with_installs = []
    for page in _pages():
        raw = page.read_text("utf-8")
        fenced = "\n".join(re.findall(r"```(?:bash|console)?\n(.*?)```", raw, re.S))
        copies = re.findall(r"^(?:\$ )?(?:git clone|pip install .*idemkey-redis).*$", fenced, re.M)
        assert not copies, f"{page.name}: {copies} (use <!-- install [...] -->)"
        if INSTALL.search(raw):
            with_installs.append(page.name)
    integrations = {"flask.md", "fastapi.md", "starlette.md", "django.md", "wsgi-asgi.md"}
    assert integrations | {"getting-started.md", "guard.md", "steps.md", "client.md"} <= set(
        with_installs
    )


def test_the_template_clones_the_repository_pyproject_names() -> None:
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    urls = text[text.index("[project.urls]") :].split("\n\n")[0]
    assert f'Repository = "{REPOSITORY}"' in urls
    lines = install("fastapi", " uvicorn").splitlines()
    assert lines[:4] == [
        "```bash",
        f"git clone {REPOSITORY} && cd idemkey",
        "pip install -e '.[fastapi]' uvicorn  # into your project's environment",
        "```",
    ]
    assert requirements(install())[:2] == [".", DISTRIBUTION]  # no extra: the bare package
    assert expand_install("<!-- install [flask,testing] pytest -->") == install(
        "flask,testing", " pytest"
    )


def test_the_readme_prints_the_template_as_the_site_does() -> None:
    """The README is read on GitHub and the package index, where nothing expands: it carries
    the flask lines as the template renders them, checked here."""
    assert install("flask") in (ROOT / "README.md").read_text("utf-8")


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    # The test environment installs this checkout (`pip install -e '.[test]'`) as idemkey-redis.
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out == f"idemkey {metadata.version(DISTRIBUTION)} (the {DISTRIBUTION} distribution)\n"
