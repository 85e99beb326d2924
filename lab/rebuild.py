"""The bare-metal rebuild rehearsal (`make lab-rebuild`): lab hosts with GPUs but no driver, Docker or toolkit
(H200, 8x B300, 8x MI355X) go through deploys/gpu_stack.py twice, with preflight before and after, and one
B300 first left with Fabric Manager at another version than its driver (the skew behind CUDA error 802).
Prints one JSON report per host.

Evidence is read from outside the run where it can be: reboots are docker's restart count of the host's
container, versions are what the host's nvidia-smi and nv-fabricmanager answer over SSH.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import lab
from lab import REPO_ROOT
from modelfleet.base.commands import run_pyinfra
from modelfleet.base.host_commands import amd_gpu_count_sh, driver_version_sh, fabric_manager_version_sh

SKEWED_FABRIC_MANAGER = "580.95.05"  # an older release in the lab's CUDA repository than the driver's


def pyinfra(names: list[str], deploy: str, reports: Path, *extra: str, yes: bool = True) -> subprocess.CompletedProcess:
    """`yes=False` with `--dry`: pyinfra then prints the operations it detects would change."""
    with lab.scenario.applied(only=names):
        return run_pyinfra("inventories/lab.py", f"deploys/{deploy}", yes=yes, extra=extra, cwd=REPO_ROOT,
                           env={"MODELFLEET_REPORTS": str(reports)})


def table(output: str, title: str) -> dict[str, list[str]]:
    """Rows of one of pyinfra's tables ("Detected changes:", "Results:"): operation name -> its cells."""
    rows, inside = {}, False
    for line in output.splitlines():
        if line.startswith("--> "):
            inside = line.strip() == f"--> {title}"
            continue
        cells = re.split(r"\s{2,}", line.strip())
        if inside and len(cells) > 2 and cells[0] not in ("Operation", "Grand total"):
            rows[cells[0]] = cells[1:]
    return rows


def dry_run_truth(dry: subprocess.CompletedProcess, real: subprocess.CompletedProcess) -> dict:
    """Operations `--dry` said would change vs operations that changed in the real run (all hosts)."""
    said = {op for op, cells in table(dry.stdout + dry.stderr, "Detected changes:").items() if cells[0] != "-"}
    did = {op for op, cells in table(real.stdout + real.stderr, "Results:").items() if cells[1] != "-"}
    return {"matches": said == did and bool(said), "operations": len(did), "only_in_dry_run": sorted(said - did),
            "only_in_real_run": sorted(did - said)}


def changed_operations(run: subprocess.CompletedProcess) -> int:
    """Host-operations that changed something, from pyinfra's results table."""
    total = re.search(r"Grand total\s+(\d+)\s+(\S+)", run.stdout + run.stderr)
    return 0 if not total or total.group(2) == "-" else int(total.group(2))


def verdicts(reports: Path, names: list[str]) -> dict:
    out = {}
    for name in names:
        report = json.loads((reports / "preflight" / f"{name}.json").read_text())
        out[name] = {"ok": report["ok"], "problems": report["problems"]}
    return out


def versions(spec: dict) -> dict:
    """What the host's own tools answer (one line each, empty when the tool is absent or fails)."""
    answer = lab.ssh(spec, f"echo \"$({driver_version_sh()})\"; echo \"$({fabric_manager_version_sh()})\"; "
                           f"echo \"$({amd_gpu_count_sh()})\"; apt-mark showhold").stdout
    lines = answer.splitlines() + ["", "", ""]
    return {"driver": lines[0] or None, "fabric_manager": lines[1] or None,
            "amd_gpus": int(lines[2] or 0), "held": [x for x in lines[3:] if x]}


def skew_fabric_manager(spec: dict, reports: Path) -> None:
    """Build the host, then move its Fabric Manager to another release by hand, as an operator might."""
    built = pyinfra([spec["name"]], "gpu_stack.py", reports)
    if built.returncode:
        raise RuntimeError(f"{spec['name']}: building the host to skew failed\n{built.stdout[-3000:]}")
    moved = lab.ssh(spec, "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --allow-downgrades "
                          f"--allow-change-held-packages nvidia-fabricmanager-580={SKEWED_FABRIC_MANAGER}-1 "
                          "&& systemctl restart nvidia-fabricmanager || true")
    if moved.returncode:
        raise RuntimeError(f"{spec['name']}: could not install Fabric Manager {SKEWED_FABRIC_MANAGER}: {moved.stderr}")


def rehearse(specs: list[dict], skewed: str | None, reports: Path) -> list[dict]:
    names = [s["name"] for s in specs]
    for spec in specs:
        if spec["name"] == skewed:
            skew_fabric_manager(spec, reports)
    before = {name: lab.restarts(name) for name in names}
    preflight_before = pyinfra(names, "preflight.py", reports)
    verdict_before = verdicts(reports, names)
    dry = pyinfra(names, "gpu_stack.py", reports / "dry", "--dry", yes=False)
    first = pyinfra(names, "gpu_stack.py", reports)
    if first.returncode:
        raise RuntimeError(f"deploys/gpu_stack.py failed on {', '.join(names)}:\n"
                           f"{(first.stdout + first.stderr)[-4000:]}")
    stack = {n: json.loads((reports / "gpu_stack" / f"{n}.json").read_text()) for n in names}
    after_first = {name: lab.restarts(name) for name in names}
    second = pyinfra(names, "gpu_stack.py", reports)
    after_second = {name: lab.restarts(name) for name in names}
    preflight_after = pyinfra(names, "preflight.py", reports)
    verdict_after = verdicts(reports, names)
    truth = dry_run_truth(dry, first)
    out = []
    for spec in specs:
        name = spec["name"]
        out.append({
            "host": name, "persona": spec["persona"], "skewed_fabric_manager_before": name == skewed,
            "stages": stack[name]["stages"], "packages_installed": stack[name]["packages_installed"],
            "reboots_taken": after_first[name] - before[name], "reboot_reason": stack[name]["reboot"]["reason"],
            "first_run_ok": first.returncode == 0, "dry_run_vs_first_run": truth,
            "second_run": {"ok": second.returncode == 0, "changed_operations_all_hosts": changed_operations(second),
                           "reboots": after_second[name] - after_first[name]},
            "preflight_before": verdict_before[name], "preflight_after": verdict_after[name],
            "preflight_exit": {"before": preflight_before.returncode, "after": preflight_after.returncode},
            "answers_after": versions(spec),
        })
    out_dir = reports / "lab-rebuild"
    out_dir.mkdir(parents=True, exist_ok=True)
    for row in out:
        (out_dir / f"{row['host']}.json").write_text(json.dumps(row, indent=2) + "\n")
    if second.returncode:
        print(second.stdout[-4000:], file=sys.stderr)
    return out


def main() -> None:
    lab.down()
    specs = lab.up(4, personas=["h200x1-bare", "b300x8-bare", "b300x8-bare", "mi355x8-bare"])
    reports = Path(os.environ.get("MODELFLEET_REPORTS", REPO_ROOT / "reports"))
    print(json.dumps(rehearse(specs, skewed=specs[2]["name"], reports=reports), indent=2))


if __name__ == "__main__":
    main()
