"""`make bench-fanout`: checkpoint distribution figures on the lab, one run, JSON.

hub_egress_ratio: bytes the hub double served for a group of 1, 3 and 6 hosts ÷ checkpoint bytes (1.0 means one
download per group). fanout_vs_copy: the group's copy rate (bytes the peers received ÷ the copy operation's
wall time, peers in parallel, each verifying sha256) ÷ the raw copy rate of the same bytes on the same machine
(`cp` of the checkpoint to as many directories at once, on the seed host, page cache warm for both).
"""

import json
import re
import sys
import time

import lab
from lab import hub, ssh
from modelfleet.commands import run_pyinfra

ROOT = "/srv/models-fanout"
REVISION = "bench-64m"


def run_model(limit: list[str]) -> str:
    run = run_pyinfra("inventories/lab.py", "deploys/model.py", limit=limit, extra=["-vvv"],
                      env={"MODELFLEET_LAB_MODEL_ROOT": ROOT, "MODELFLEET_LAB_REVISION": REVISION})
    if run.returncode:
        sys.exit(run.stdout[-4000:] + run.stderr[-2000:])
    return run.stdout + run.stderr


def main() -> None:
    specs = lab.up(6)
    sizes, figures = [1, 3, 6], {}
    for n in sizes:
        group = specs[:n]
        for spec in specs:
            ssh(spec, f"rm -rf {ROOT}")
        hub.reset_stats()
        out = run_model([s["name"] for s in group])
        served = hub.stats()["bytes_served"]
        shown = ssh(group[0], f"cat {ROOT}/tiny-lab/current/.modelfleet-manifest.json")
        if shown.returncode:
            sys.exit(f"no manifest on {group[0]['name']}: {shown.stderr}\n{out[-3000:]}")
        manifest = json.loads(shown.stdout)
        total = sum(f["size"] for f in manifest["files"].values())
        reports = re.findall(rf"\[({lab.PREFIX}\d+)\]\s+(\{{\"commit\".*\}})", out)  # the fetch script's JSON, per host
        peers = [json.loads(text) for name, text in reports if name != group[0]["name"]]
        figures[n] = {"hosts": n, "checkpoint_bytes": total, "hub_bytes_served": served,
                      "hub_egress_ratio": round(served / total, 3)}
        if n > 1:
            received = sum(c["bytes_fetched"] for c in peers)
            seconds = max(c["seconds"] for c in peers)
            dest = " ".join(f"/srv/rawcopy-{i}" for i in range(n - 1))
            cp = ssh(group[0], f"rm -rf {dest}; s=$(date +%s.%N); for d in {dest}; do "
                               f"cp -r {ROOT}/tiny-lab/current/ $d & done; wait; e=$(date +%s.%N); "
                               f"rm -rf {dest}; echo $s $e").stdout.split()
            raw_rate = (n - 1) * total / (float(cp[1]) - float(cp[0]))
            figures[n].update(fanout_bytes=received, fanout_seconds=seconds,
                              fanout_rate_mb_s=round(received / seconds / 1e6, 1),
                              raw_copy_rate_mb_s=round(raw_rate / 1e6, 1),
                              fanout_vs_copy=round(received / seconds / raw_rate, 3))
    for spec in specs:
        ssh(spec, f"rm -rf {ROOT}")
    print(json.dumps({"revision": REVISION, "date": time.strftime("%Y-%m-%d"), "groups": list(figures.values()),
                      "hub_egress_ratio": {n: f["hub_egress_ratio"] for n, f in figures.items()},
                      "fanout_vs_copy": {n: f.get("fanout_vs_copy") for n, f in figures.items() if n > 1}},
                     indent=2))


if __name__ == "__main__":
    main()
