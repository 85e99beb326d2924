"""modelfleet: pyinfra stages that turn GPU servers into serving nodes for open-weight models."""

from pathlib import Path

__version__ = "0.1.0"

# The repository root holds templates/, files/ and lab/ (the card fixes the top level).
REPO_ROOT = Path(__file__).resolve().parent.parent
