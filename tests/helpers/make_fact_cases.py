"""Regenerate tests/facts/<fact>/<case>.yaml from recorded outputs (tests/fixtures).

The expected `fact` is what the parser returns today; review the diff by hand before committing (the
hand-written assertions in tests/unit/test_facts_fixtures.py pin the values that matter).
"""

import importlib
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
H200 = FIXTURES / "gpu-hosts" / "h200x1-ubuntu2404"
PUBLIC = FIXTURES / "public-samples"

CASES = {
    "gpu.NvidiaGpus": {"h200x1": H200 / "nvidia-smi-query-gpu-header.txt"},
    "gpu.NvidiaVersions": {"h200x1": H200 / "nvidia-smi-version.txt"},
    "gpu.NvidiaKernelModule": {"h200x1_open": H200 / "proc-driver-version.txt"},
    "gpu.NvidiaTopology": {"h200x1": H200 / "nvidia-smi-topo.txt",
                           "b300x8_9nic": PUBLIC / "b300x8-nvidia-smi-topo-m-9nic.txt",
                           "b300x7_no_nic": PUBLIC / "b300x7-nvidia-smi-topo-m.txt"},
    "host.BlockDevices": {"h200x1": H200 / "lsblk-json.txt"},
    "host.OsRelease": {"ubuntu2404": H200 / "os-release.txt"},
}
COMMAND_ARGS = {}


def recorded_lines(path: Path) -> list[str]:
    text = path.read_text()
    if "\n# ---\n" in text and text.startswith("# "):
        text = text.split("\n# ---\n", 1)[1]
    return [line for line in text.splitlines() if not line.startswith("__rc=")]


def main() -> None:
    for fact_path, cases in CASES.items():
        module, cls_name = fact_path.rsplit(".", 1)
        cls = getattr(importlib.import_module(f"modelfleet.host.facts.{module}"), cls_name)
        folder = ROOT / "tests" / "facts" / fact_path
        folder.mkdir(parents=True, exist_ok=True)
        for case, source in cases.items():
            lines = recorded_lines(source)
            fact = cls().process(lines)
            doc = {"command": cls().command(), "output": lines, "fact": fact}
            header = f"# recorded output: {source.relative_to(ROOT)}\n"
            (folder / f"{case}.yaml").write_text(header + yaml.safe_dump(doc, sort_keys=False, width=200))
            print(folder / f"{case}.yaml", file=sys.stderr)


if __name__ == "__main__":
    main()
