"""The published text of a public sample (tests/fixtures/public-samples: each file's provenance header ends at its
first `# ---` line; see that folder's README)."""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parents[1] / "fixtures" / "public-samples"


def public_sample(name: str) -> str:
    return (FOLDER / name).read_text().split("# ---\n", 1)[1]


def public_sample_lines(name: str) -> list[str]:
    return public_sample(name).splitlines()
