"""`make lab-driver-upgrade`: a rolling driver upgrade rehearsed on 3 bare lab H200 hosts. They are built at
driver 580.95.05 and serve (vLLM doubles); then the inventory asks for 580.159.04 and `modelfleet upgrade`
drains, installs, reboots, gates and restarts one host at a time while the others keep serving. Prints a JSON
report: batches, reboots, drivers before and after, failed requests inside and outside the batch, seconds."""

from __future__ import annotations

import json
import sys

import lab
from lab import REPO_ROOT
from modelfleet.base.commands import run_modelfleet, run_pyinfra

OLD, NEW = "580.95.05", "580.159.04"


def rehearse(specs: list[dict], old: str = OLD, new: str = NEW) -> dict:
    """Build `specs` (bare lab hosts) at driver `old`, then roll them to `new`; the summary of both runs."""
    names = [s["name"] for s in specs]
    with lab.scenario.applied(engine="vllm", only=names, driver_version=old):
        built = run_pyinfra("inventories/lab.py", "deploys/serve.py", timeout=1200, cwd=REPO_ROOT)
    if built.returncode:
        raise RuntimeError(f"building at {old} failed:\n{(built.stdout + built.stderr)[-4000:]}")
    restarts_before = {name: lab.restarts(name) for name in names}
    with lab.scenario.applied(engine="vllm", only=names, driver_version=new):
        upgrade = run_modelfleet("upgrade", "inventories/lab.py", "-y", "--min-healthy", str(len(names) - 1),
                                 timeout=1800, cwd=REPO_ROOT)
    report = json.loads(upgrade.stdout)
    failures = sum(report["endpoint_failures"].values())
    return {"exit": upgrade.returncode, "from": old, "to": new,
            "batches": [{k: b.get(k) for k in ("hosts", "driver_upgrade", "result")} for b in report["batches"]],
            "drivers": report["drivers"], "rebooted": report["rebooted"],
            "reboots": sum(lab.restarts(name) - restarts_before[name] for name in names),
            "stopped": report["stopped"], "drained": report["drained"],
            "requests": sum(report["endpoint_requests"].values()),
            "failed_requests_inside_batch": failures - report["failures_outside_batch"],
            "failed_requests_outside_batch": report["failures_outside_batch"], "seconds": report["seconds"],
            "upgrade_stderr_tail": upgrade.stderr[-1500:] if upgrade.returncode else ""}


def main() -> int:
    lab.down()  # the rehearsal's own lab, like lab-rebuild: three bare hosts
    specs = lab.up(3, personas=["h200x1-bare"])
    summary = rehearse(specs)
    print(json.dumps(summary, indent=2))
    return summary["exit"]


if __name__ == "__main__":
    sys.exit(main())
