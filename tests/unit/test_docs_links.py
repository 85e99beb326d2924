"""Every relative link of README.md and docs/ names a file that is there (records moved to docs/measurements/ and
guides renamed keep their readers' links working)."""

import re

from tests.conftest import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_of_the_docs_resolves():
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for match in LINK.finditer(page.read_text()):
            target = match.group(1).split("#")[0]
            if target and not target.startswith(("http://", "https://", "mailto:")) and \
                    not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []
