"""The settings tables' generator: a field without a meaning is refused, and the command prints the block or
writes it between README's markers, refusing a file without them."""

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from modelfleet.plan import settings_doc

REPO = Path(__file__).resolve().parents[2]


def test_a_field_without_meaning_is_refused():
    class Partial(BaseModel):
        said: int = Field(1, description="Has one.")
        unsaid: int = 2

    with pytest.raises(ValueError, match="Partial: no description for unsaid"):
        settings_doc.rows(Partial)


@pytest.mark.slow
def test_command_prints_the_block_and_writes_it_between_the_markers(tmp_path):
    out = subprocess.run([sys.executable, "-m", "modelfleet.plan.settings_doc"], capture_output=True, text=True,
                         check=True, cwd=REPO)
    assert out.stdout == settings_doc.table() + "\n"
    stale = tmp_path / "README.md"
    stale.write_text(f"# title\n\n{settings_doc.BEGIN}\n| `old` | text | unset | gone |\n{settings_doc.END}\n\nafter\n")
    subprocess.run([sys.executable, "-m", "modelfleet.plan.settings_doc", "--write", str(stale)], check=True, cwd=REPO)
    text = stale.read_text()
    assert settings_doc.current_block(text) == settings_doc.table()
    assert text.startswith("# title\n\n") and text.endswith(f"{settings_doc.END}\n\nafter\n") and "`old`" not in text
    no_markers = tmp_path / "other.md"
    no_markers.write_text("nothing here\n")
    failed = subprocess.run([sys.executable, "-m", "modelfleet.plan.settings_doc", "--write", str(no_markers)],
                            capture_output=True, text=True, cwd=REPO)
    assert failed.returncode == 2 and "markers" in failed.stderr and no_markers.read_text() == "nothing here\n"
