"""MkDocs hook: the reference tables, generated from the code at build time.

``<!-- readme-pitch -->`` becomes README.md's opening paragraph and list (the site's home).
``<!-- install [flask] uvicorn -->`` becomes the install lines, written once in
docs/snippets/install.md: a checkout (``git clone`` of :data:`REPOSITORY`, then ``pip install -e
'.[flask]' uvicorn``), and the published form for when it exists.
``<!-- project-line -->`` becomes the version, the install line and the repository
(:func:`project_line`).
``<!-- policy-fields -->`` becomes a table of every :class:`idemkey.Policy` option
(``dataclasses.fields``: name, type, default; derived fields left out) with its meaning, the
``#:`` comment above the field in idemkey/policy.py. ``<!-- problem-codes -->`` becomes the
table of idemkey's problem codes (idemkey/http/_problems.py's titles) with the status each is
answered with, read from the calls that answer it (:func:`problem_statuses`), and its ``retry``
advice (``RETRY``). Nothing is
copied by hand: a new field or code appears on the site with the change that adds it, and a
field without a comment, or a code whose status is not found, fails the build.

:data:`DOCUMENTED` lists the modules whose public names the API reference (docs/reference/)
renders with mkdocstrings; :func:`undocumented` reads them with griffe (statically, as
mkdocstrings does: the docs build needs no framework installed), and a class or function in a
module's ``__all__`` without a docstring fails the build (:func:`on_config`).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "idemkey"


def field_comments(source: str, class_name: str) -> dict[str, str]:
    """Each annotated field of ``class_name`` in ``source`` -> its ``#:`` comment lines, joined."""
    lines = source.splitlines()
    tree = ast.parse(source)
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    comments = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above = []
            index = node.lineno - 2
            while index >= 0 and lines[index].strip().startswith("#:"):
                above.insert(0, lines[index].strip()[2:].strip())
                index -= 1
            comments[node.target.id] = " ".join(above)
    return comments


def _rst_to_markdown(text: str) -> str:
    text = re.sub(r":(?:class|data|func|mod|meth|attr):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`").replace("|", "\\|")


def _default(field: dataclasses.Field[Any]) -> str:
    value = field.default
    if value is dataclasses.MISSING:
        return "(required)"
    if callable(value):
        return f"`{value.__module__}.{value.__qualname__}`"
    if isinstance(value, frozenset):
        return f"`{{{', '.join(repr(v) for v in sorted(value))}}}`"
    return f"`{value!r}`"


def policy_table() -> str:
    from idemkey.policy import Policy

    comments = field_comments((PACKAGE / "policy.py").read_text("utf-8"), "Policy")
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for field in dataclasses.fields(Policy):
        if not field.init:  # derived (lease_ms, ttl_ms, compress_at): not an option
            continue
        meaning = comments.get(field.name)
        if not meaning:
            raise ValueError(f"Policy.{field.name} has no #: comment in idemkey/policy.py")
        kind = str(field.type).replace("|", "\\|")
        rows.append(
            f"| `{field.name}` | `{kind}` | {_default(field)} | {_rst_to_markdown(meaning)} |"
        )
    return "\n".join(rows)


def problem_statuses() -> dict[str, set[str]]:
    """Each problem code -> the statuses the package answers it with, read from the source.

    ``render(policy, 400, "code", ...)`` and ``exchange.unreadable(500, "code", ...)`` name
    both; ``status = self.policy.mismatch_status`` before a call names a Policy field; a code
    made into a ``BodyError("code", ...)`` takes the status of the ``unreadable(<status>,
    <x>.code, ...)`` call that answers it, unless a call of its own names its status.
    """
    from idemkey.policy import Policy

    call = re.compile(r'(?:render\(\s*[\w.]+,|unreadable\()\s*([\w.]+),\s*"(\w+)"', re.S)
    assigned = re.compile(r"\bstatus = [\w.]*\.(\w+)\n")
    body_error = re.compile(r'BodyError\("(\w+)"')
    passed_on = re.compile(r"unreadable\((\d{3}), \w+\.code\b")
    statuses: dict[str, set[str]] = {}
    passed: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text("utf-8")
        for match in call.finditer(text):
            status, code = match.groups()
            if not status.isdigit():
                fields = assigned.findall(text, 0, match.start())
                if fields and hasattr(Policy(), fields[-1]):
                    default = getattr(Policy(), fields[-1])
                    status = f"`Policy.{fields[-1]}` ({default} by default)"
            statuses.setdefault(code, set()).add(status)
        for status in passed_on.findall(text):
            for code in body_error.findall(text):
                passed.setdefault(code, set()).add(status)
    for code, found in passed.items():  # a code answered elsewhere first keeps that status
        statuses.setdefault(code, found)
    return statuses


def problem_table() -> str:
    from idemkey.http._problems import _TITLES, PROBLEM_TYPE, RETRY

    statuses = problem_statuses()
    rows = ["| code | status | `retry` | title | `type` |", "|---|---|---|---|---|"]
    for code, title in _TITLES.items():
        found = sorted(statuses.get(code, set()))
        if not found:
            raise ValueError(f"no status found for the problem code {code!r}")
        if code not in RETRY:
            raise ValueError(f"the problem code {code!r} has no retry advice (RETRY)")
        where = ", ".join(found)
        rows.append(f"| `{code}` | {where} | `{RETRY[code]}` | {title} | `{PROBLEM_TYPE}{code}` |")
    return "\n".join(rows)


def readme_pitch() -> str:
    """README.md's opening paragraph and its first list: the pitch, kept in one place."""
    text = (ROOT / "README.md").read_text("utf-8")
    paragraphs = text.split("\n\n")
    opening = paragraphs[1]  # after the "# idemkey" title
    bullets = next(p for p in paragraphs if p.startswith("- "))
    return f"{opening}\n\n{bullets}"


#: The repository: pyproject.toml's ``[project.urls] Repository``, and the install lines' clone.
REPOSITORY = "https://github.com/idemkey/idemkey"
INSTALL = re.compile(
    r"^<!-- install(?: \[(?P<extras>[\w,-]+)\])?(?P<beside>(?: [\w-]+)*) -->$", re.M
)


def install(extras: str = "", beside: str = "") -> str:
    """The install lines (docs/snippets/install.md) for ``extras`` ("flask,testing") and the
    packages installed beside (" uvicorn")."""
    template = (ROOT / "docs" / "snippets" / "install.md").read_text("utf-8")
    text = template.replace("{beside}", beside).replace("{repository}", REPOSITORY)
    if not extras:  # the bare package: '.' and "idemkey-redis"
        text = text.replace("'.[{extras}]'", ".").replace("[{extras}]", "")
    return text.replace("{extras}", extras).rstrip("\n")


def expand_install(markdown: str) -> str:
    """Every ``<!-- install [...] ... -->`` line of ``markdown`` replaced by :func:`install`."""
    return INSTALL.sub(lambda m: install(m["extras"] or "", m["beside"]), markdown)


#: The modules of the API reference (docs/reference/api.md, client.md, adapters.md,
#: contrib.md): every class and function in their ``__all__`` must have a docstring.
DOCUMENTED = (
    "idemkey",
    "idemkey.store",
    "idemkey.client",
    "idemkey.adapters.flask",
    "idemkey.adapters.fastapi",
    "idemkey.adapters.starlette",
    "idemkey.adapters.django",
    "idemkey.adapters.wsgi",
    "idemkey.adapters.asgi",
    "idemkey.contrib.celery",
    "idemkey.contrib.mcp",
    "idemkey.contrib.sqlalchemy",
    "idemkey.testing",
)


def undocumented(modules: tuple[str, ...] = DOCUMENTED, search: Path = ROOT) -> list[str]:
    """``module.name`` of each class or function in a module's ``__all__`` without a
    docstring, and ``module.Class.method`` of each public method such a class defines without
    one (names re-exported from a private module are followed to their definition); a name in
    ``__all__`` that the module does not define is listed too."""
    import griffe

    loader = griffe.GriffeLoader(search_paths=[str(search)])
    # By path: by name, griffe may find another copy (an installed one) first.
    package = loader.load(search / "idemkey")
    loader.resolve_aliases(external=False)
    missing = []
    for dotted in modules:
        module = package if dotted == "idemkey" else package[dotted.removeprefix("idemkey.")]
        for name in module.exports or ():
            name = name if isinstance(name, str) else name.name
            if name not in module.members:
                missing.append(f"{dotted}.{name} (in __all__, not defined)")
                continue
            member = module.members[name]
            target = member.final_target if member.is_alias else member
            if (target.is_class or target.is_function) and not target.docstring:
                missing.append(f"{dotted}.{name}")
            if target.is_class:  # and its public methods (those it defines)
                for method, value in target.members.items():
                    value = value.final_target if value.is_alias else value
                    public = not method.startswith("_") and value.is_function
                    if public and value.parent is target and not value.docstring:
                        missing.append(f"{dotted}.{name}.{method}")
    return missing


def on_config(config: Any, **_: Any) -> Any:
    from mkdocs.exceptions import PluginError

    missing = undocumented(DOCUMENTED, ROOT)
    if missing:
        raise PluginError(f"public names without a docstring: {', '.join(missing)}")
    return config


def _toml_string(text: str, table: str, key: str) -> str | None:
    """The string ``key = "..."`` in ``[table]`` of a TOML text, None when it has none."""
    body = re.search(rf"^\[{re.escape(table)}\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
    found = body and re.search(rf'^{re.escape(key)}\s*=\s*"([^"]*)"', body[1], re.M)
    return found[1] if found else None


def project_line(pyproject: str | None = None) -> str:
    """The home page's first facts: the version (pyproject.toml's, the one the package reports
    once installed), the install line from a checkout, and the repository when
    ``[project.urls]`` names one."""
    text = (ROOT / "pyproject.toml").read_text("utf-8") if pyproject is None else pyproject
    # Read with two patterns, not tomllib: the docs tests also run on Python 3.10.
    name, version = (_toml_string(text, "project", key) for key in ("name", "version"))
    if not (name and version):
        raise ValueError("pyproject.toml names no [project] name and version")
    urls = (_toml_string(text, "project.urls", k) for k in ("Repository", "Source", "Homepage"))
    repository = next((url for url in urls if url), None)
    where = f" · [repository]({repository})" if repository else ""
    return (
        f"**{name} {version}**{where} · install from a checkout: "
        "`pip install -e '.[flask]'` (the extra for your framework; "
        "[Getting started](getting-started.md#install))"
    )


OUTSIDE_DOCS = re.compile(r"\[([^\]]+)\]\(\.\./([^)#\s]+)(?:#[^)\s]*)?\)")


def on_page_markdown(markdown: str, **_: Any) -> str:
    # A link out of docs/ (to the README, to benchmarks/) works on GitHub, not on the site:
    # the site names the repository file instead.
    markdown = OUTSIDE_DOCS.sub(r"\1 (`\2` in the repository)", markdown)
    markdown = expand_install(markdown)
    if "<!-- readme-pitch -->" in markdown:
        markdown = markdown.replace("<!-- readme-pitch -->", readme_pitch())
    if "<!-- project-line -->" in markdown:
        markdown = markdown.replace("<!-- project-line -->", project_line())
    if "<!-- policy-fields -->" in markdown:
        markdown = markdown.replace("<!-- policy-fields -->", policy_table())
    if "<!-- problem-codes -->" in markdown:
        markdown = markdown.replace("<!-- problem-codes -->", problem_table())
    return markdown
