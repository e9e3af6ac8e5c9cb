"""README.md stays the front page: the pitch, the two set-up commands, one HTTP example, the
install line and links. Everything else lives on one page of the docs site, said once."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text("utf-8")


def test_the_readme_holds_the_setup_commands_one_example_and_links() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first_block is not None
    # .ci/run runs the second command; the first plays the demo.
    assert first_block[1].splitlines() == [
        "pip install -c constraints.txt -e '.[demo]' && idemkey demo",
        "pip install -c constraints.txt -e '.[test]' && pytest",
    ]
    assert len(re.findall(r"^```python\n", README, re.M)) == 1  # the one HTTP example
    headings = re.findall(r"^#{2,6} (.+)$", README, re.M)
    assert headings == ["Install, and a first guarded endpoint", "More"]


def test_each_moved_section_is_a_heading_of_its_page() -> None:
    moved = {
        "docs/behaviour.md": [
            "The retry story over HTTP",
            "Every situation",
            "What a retry must resend (`fingerprint`)",
            "Set `prefix`: one per service",
            "Errors in your API's format",
            "Set `scope`",
            "The Redis client",
        ],
        "docs/operators.md": [
            "`idemkey probe`: check an endpoint's retries",
            "A policy to publish",
        ],
        "docs/performance.md": ["Performance"],
        "docs/development.md": ["Development"],
    }
    for page, wanted in moved.items():
        headings = re.findall(r"^#{1,6} (.+)$", (ROOT / page).read_text("utf-8"), re.M)
        assert set(wanted) <= set(headings), (page, set(wanted) - set(headings))
        assert page in README, f"the README links no {page}"
