"""`make bench-fanout`: checkpoint distribution figures on the lab, one run, JSON.

hub_egress_ratio: bytes the hub double served for a group of 1, 3 and 6 hosts ÷ checkpoint bytes (1.0 means one
download per group). fanout_vs_copy: the group's copy rate (bytes the peers received ÷ the copy operation's
wall time, peers in parallel, each verifying sha256) ÷ the raw copy rate of the same bytes on the same machine
(`cp` of the checkpoint to as many directories at once, on the seed host, page cache warm for both).

receiver: lab/fanout_compare.py on this machine (loopback, the peer server as the fan-out runs it): the fetch
script beside curl with as many streams, curl + sha256sum, aria2c where installed, and cp, with each client's CPU
per GB; on a machine of few cores the receiver's CPU per byte (hashing while it receives) sets its rate.

tree: the same checkpoint to 12 hosts with each server capped at TREE_RATE_MB_S (a link the fan-out shares),
once as a star (model_fanout_width 11: the seed serves everyone) and once as a tree (width TREE_WIDTH: hosts
that got their copy serve the next ones); copy wall time = last peer's finish - first peer's start.
"""

import json
import re
import subprocess
import sys
import time

import lab
from lab import hub, ssh
from modelfleet.commands import run_pyinfra
from modelfleet.host_commands import CURRENT, MANIFEST

ROOT = "/srv/models-fanout"
REVISION = "bench-64m"
TREE_HOSTS, TREE_WIDTH, TREE_RATE_MB_S = 12, 2, 100


def run_model(limit: list[str], **fields) -> str:
    """deploys/model.py over `limit`, the bench's root and revision (and the scenario's other `fields`)."""
    with lab.scenario.applied(model_root=ROOT, revision=REVISION, **fields):
        run = run_pyinfra("inventories/lab.py", "deploys/model.py", limit=limit, extra=["-vvv"])
    if run.returncode:
        sys.exit(run.stdout[-4000:] + run.stderr[-2000:])
    return run.stdout + run.stderr


def fetch_reports(out: str) -> dict[str, dict]:
    """The fetch script's JSON report of each host (host -> report)."""
    return {name: json.loads(text) for name, text in re.findall(rf"\[({lab.PREFIX}\d+)\]\s+(\{{\"commit\".*\}})", out)}


def tree_run(specs: list[dict], width: int) -> dict:
    """One fan-out to all of `specs` from a seed that has the checkpoint, each server capped."""
    for spec in specs[1:]:
        ssh(spec, f"rm -rf {ROOT}")
    start = time.perf_counter()
    out = run_model([s["name"] for s in specs], fanout_width=width, fanout_rate_mb_s=TREE_RATE_MB_S)
    wall = time.perf_counter() - start
    peers = [r for name, r in fetch_reports(out).items() if name != specs[0]["name"]]
    copy_s = max(r["finished_at"] for r in peers) - min(r["finished_at"] - r["seconds"] for r in peers)
    # Per wave (one "Copy ... (wave k/n)" operation each): how many peers each source served at once.
    per_wave = [re.findall(r"modelfleet_fetch\.py \S+ peer http://([0-9.]+):", part)
                for part in out.split("--> Starting operation:") if "from a peer (wave" in part.split("\n")[0]]
    waves = max((int(n) for n in re.findall(r"from a peer \(wave \d+/(\d+)\)", out)), default=0)
    return {"width": width, "peers": len(peers), "waves": int(waves), "copy_wall_s": round(copy_s, 2),
            "pyinfra_wall_s": round(wall, 2),
            "most_peers_one_host_served_at_once": max(max(map(w.count, w)) for w in per_wave if w)}


def main() -> None:
    specs = lab.up(TREE_HOSTS)
    sizes, figures = [1, 3, 6], {}
    for n in sizes:
        group = specs[:n]
        for spec in specs:
            ssh(spec, f"rm -rf {ROOT}")
        hub.reset_stats()
        out = run_model([s["name"] for s in group])
        served = hub.stats()["bytes_served"]
        shown = ssh(group[0], f"cat {ROOT}/tiny-lab/{CURRENT}/{MANIFEST}")
        if shown.returncode:
            sys.exit(f"no manifest on {group[0]['name']}: {shown.stderr}\n{out[-3000:]}")
        manifest = json.loads(shown.stdout)
        total = sum(f["size"] for f in manifest["files"].values())
        peers = [r for name, r in fetch_reports(out).items() if name != group[0]["name"]]
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
    run_model([specs[0]["name"]])  # the seed holds it: the tree runs time the copies alone
    star, tree = tree_run(specs, TREE_HOSTS - 1), tree_run(specs, TREE_WIDTH)
    for spec in specs:
        ssh(spec, f"rm -rf {ROOT}")
    compare = subprocess.run([sys.executable, "lab/fanout_compare.py", "--work", f"{lab.STATE}/fanout-compare",
                              "--files", "8", "--size-mib", "256", "--runs", "3"], capture_output=True, text=True)
    if compare.returncode:
        sys.exit(compare.stdout[-2000:] + compare.stderr[-2000:])
    print(json.dumps({"revision": REVISION, "date": time.strftime("%Y-%m-%d"), "groups": list(figures.values()),
                      "hub_egress_ratio": {n: f["hub_egress_ratio"] for n, f in figures.items()},
                      "fanout_vs_copy": {n: f.get("fanout_vs_copy") for n, f in figures.items() if n > 1},
                      "tree": {"hosts": TREE_HOSTS, "server_cap_mb_s": TREE_RATE_MB_S, "star": star, "tree": tree,
                               "copy_wall_ratio_tree_vs_star": round(tree["copy_wall_s"] / star["copy_wall_s"], 3)},
                      "receiver": json.loads(compare.stdout)},
                     indent=2))


if __name__ == "__main__":
    main()
