"""Every reference to the documentation points at a file and a section that exist.

Docstrings, comments and Markdown cite ``docs/design.md#<section>`` and the other documents;
a renamed heading or a moved file must fail here, not leave a contributor a dead link. The
first design documents (DESIGN.md, STYLE.md) were never part of the repository: nothing may
cite them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(
    [ROOT / "README.md", ROOT / "noxfile.py"]
    + [p for d in ("docs", "benchmarks") for p in (ROOT / d).rglob("*.md")]
    + [p for d in ("idemkey", "tests", "benchmarks") for p in (ROOT / d).rglob("*.py")]
)
# A document path with a section, as cited in prose or in a Markdown link.
CITATION = re.compile(r"((?:\.\./)?(?:docs/)?[a-z_][a-z_-]*\.md)#([A-Za-z0-9_-]+)")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")

# Files that still cite DESIGN.md or STYLE.md, owned by work in flight when docs/design.md was
# written; each is to point at a docs/design.md section instead. Remove an entry with its fix:
# the test fails for a file missing here and for an entry that no longer cites them.
KNOWN_STALE: set[str] = set()


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(document: Path) -> set[str]:
    headings = re.findall(r"^#{1,6} +(.+?) *$", document.read_text("utf-8"), re.MULTILINE)
    return {slug(heading) for heading in headings}


def resolve(source: Path, cited: str) -> Path:
    """A cited document: relative to the citing Markdown file, else to the repository."""
    if source.suffix == ".md" and (source.parent / cited).exists():
        return (source.parent / cited).resolve()
    if (ROOT / cited).exists():
        return ROOT / cited
    return ROOT / "docs" / Path(cited).name


def test_every_cited_section_exists() -> None:
    citations = []
    for source in SOURCES:
        for cited, anchor in CITATION.findall(source.read_text("utf-8")):
            citations.append((source, cited, anchor))
    assert any(cited.endswith("design.md") for _, cited, _ in citations)
    broken = [
        f"{source.relative_to(ROOT)}: {cited}#{anchor}"
        for source, cited, anchor in citations
        if not resolve(source, cited).exists() or anchor not in anchors(resolve(source, cited))
    ]
    assert not broken, broken


@pytest.mark.parametrize(
    "document",
    [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "docs").glob("*/*.md")),
        ROOT / "benchmarks/RESULTS.md",
    ],
    ids=lambda path: str(path.relative_to(ROOT)),
)
def test_every_relative_markdown_link_exists(document: Path) -> None:
    broken = []
    for target in MARKDOWN_LINK.findall(document.read_text("utf-8")):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (document.parent / path).resolve() if path else document
        missing_section = anchor and linked.suffix == ".md" and anchor not in anchors(linked)
        if not linked.exists() or missing_section:
            broken.append(target)
    assert not broken, broken


def test_nothing_cites_the_design_documents_that_are_not_in_the_repository() -> None:
    citing = {
        str(source.relative_to(ROOT))
        for source in SOURCES
        if re.search(r"\b(DESIGN|STYLE)\.md\b", source.read_text("utf-8"))
    }
    citing.discard("tests/test_docs_links.py")  # this file names them to forbid them
    assert citing == KNOWN_STALE


BLOB = "https://github.com/idemkey/idemkey/blob/main/"


def test_the_readme_links_absolute_urls_that_name_files_of_the_repository() -> None:
    """The README is the package index's page too, where a relative link leads nowhere: every
    link is absolute, and one into the repository names a file (and section) that exist."""
    links = MARKDOWN_LINK.findall((ROOT / "README.md").read_text("utf-8"))
    assert [link for link in links if not re.match(r"https?://", link)] == []
    ours = [link[len(BLOB) :] for link in links if link.startswith(BLOB)]
    assert len(ours) >= 10
    for target in ours:
        path, _, anchor = target.partition("#")
        assert (ROOT / path).is_file(), target
        assert not anchor or anchor in anchors(ROOT / path), target
