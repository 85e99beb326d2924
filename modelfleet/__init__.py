"""modelfleet: pyinfra stages that turn GPU servers into serving nodes for open-weight models."""

from pathlib import Path

__version__ = "0.1.0"

# templates/ (jinja2) and files/ (payloads copied to hosts) ship inside the package; the repository's top-level
# templates/ and files/ are links to them.
PACKAGE_DIR = Path(__file__).resolve().parent
TEMPLATES_DIR = PACKAGE_DIR / "templates"
FILES_DIR = PACKAGE_DIR / "files"
# A checkout's root (inventories/, lab/); an installed wheel has none, and nothing shipped reads it.
REPO_ROOT = PACKAGE_DIR.parent
