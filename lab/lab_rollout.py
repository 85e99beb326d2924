"""`make lab-rollout`: a rolling-upgrade rehearsal on 3 lab hosts serving with vLLM doubles. It upgrades
v0.34.0 → v0.35.0 one host at a time, then tries an image whose engine never gets ready: the first host fails
the gate and is rolled back, and the rollout stops. Prints both reports as JSON."""

import json
import sys

import lab
from modelfleet.base.commands import run_modelfleet, run_pyinfra


def main() -> int:
    lab.up(3)
    with lab.scenario.applied(engine="vllm"):
        first = run_pyinfra("inventories/lab.py", "deploys/serve.py")
    if first.returncode:
        sys.exit(first.stdout[-3000:] + first.stderr[-2000:])
    with lab.scenario.applied(engine="vllm", image=lab.UPGRADE_IMAGE):
        good = run_modelfleet("upgrade", "inventories/lab.py", "-y", "--min-healthy", "2", timeout=1800)
    with lab.scenario.applied(engine="vllm", image=lab.BROKEN_IMAGE):
        bad = run_modelfleet("upgrade", "inventories/lab.py", "-y", "--min-healthy", "2", timeout=1800)
    summary = {}
    for label, result in (("upgrade", good), ("broken_upgrade", bad)):
        report = json.loads(result.stdout)
        for batch in report["batches"]:
            batch.pop("output", None)
            batch.pop("rollback_output", None)
        summary[label] = {"exit": result.returncode, "hosts_upgraded": report["upgraded"],
                          "rolled_back": report["rolled_back"], "stopped": report["stopped"],
                          "endpoint_failures_outside_switching_batch": report["failures_outside_batch"],
                          "endpoint_failures": report["endpoint_failures"], "seconds": report["seconds"]}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
