"""`make bench-fanout`: a checkpoint group's fill time against physics, on the lab, one run, JSON.

Every host's fan-out is capped at RATE_MB_S in each direction (`--rate MB/s`; the same cap on every host stands
in for its line rate; low enough that this machine's 2 cores are not the limit: each run's `cpu_busy`, the
machine's busy share of its CPU time from /proc/stat over the run, says whether they were), and the checkpoint is
REVISION (8 x 128 MiB).
`one_copy_s`: one receiver copying from the seed alone (a group of 2); the physical limit for a group is that
time, since every host must receive the checkpoint once at its line rate. For groups of 3, 6 and 12 hosts, in
the same run:

- swarm (model_fanout: swarm): the seed downloads from the hub, then every other host copies piece by piece
  from all the others. `fill_s` = last receiver's finish - first receiver's start (from the fetch reports);
  `fill_vs_one_copy` = fill_s ÷ one_copy_s; hub egress = bytes the hub double served ÷ checkpoint bytes.
- tree (model_fanout: tree, width TREE_WIDTH, the seed holding its copy): the store-and-forward waves, timed
  the same way.

`--receiver` adds lab/fanout_compare.py (the receiver beside curl, aria2c and cp on loopback).
"""

import importlib.util
import json
import re
import subprocess
import sys
import time

import lab
from lab import daemons, hub, ssh
from modelfleet.base.commands import run_pyinfra
from modelfleet.base.host_commands import CURRENT, MANIFEST

ROOT = "/srv/models-fanout"
REVISION, SHARDS, SHARD_MIB = "bench-1g", 8, 128
SIZES, TREE_WIDTH, RATE_MB_S = (3, 6, 12), 2, 25


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the machine, from /proc/stat's cpu line."""
    fields = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def run_model(limit: list[str], rate: int, **fields) -> str:
    """deploys/model.py over `limit`, the bench's root and revision, each host capped at `rate` MB/s (and the
    scenario's other `fields`)."""
    with lab.scenario.applied(model_root=ROOT, revision=REVISION, fanout_rate_mb_s=rate, stall_s=120,
                              **fields):
        run = run_pyinfra("inventories/lab.py", "deploys/model.py", limit=limit, extra=["-vvv"], timeout=1200)
    if run.returncode:
        sys.exit(run.stdout[-4000:] + run.stderr[-2000:])
    return run.stdout + run.stderr


def fetch_reports(out: str) -> dict[str, dict]:
    """The fetch script's JSON report of each host (host -> report)."""
    return {name: json.loads(text) for name, text in re.findall(rf"\[({lab.PREFIX}\d+)\]\s+(\{{\"commit\".*\}})", out)}


def clean(specs: list[dict]) -> None:
    for spec in specs:
        ssh(spec, f"rm -rf {ROOT}")


def timed(specs: list[dict], fanout: str, rate: int, **fields) -> dict:
    """One run of the model stage over `specs`; the receivers' copy window and what the hub served."""
    hub.reset_stats()
    busy0, total0 = cpu_times()
    out = run_model([s["name"] for s in specs], rate, fanout=fanout, **fields)
    busy1, total1 = cpu_times()
    served = hub.stats()["bytes_served"]
    peers = [r for name, r in fetch_reports(out).items() if name != specs[0]["name"]]
    if len(peers) != len(specs) - 1:
        sys.exit(f"{fanout}: {len(peers)} receiver reports for {len(specs) - 1} receivers\n{out[-3000:]}")
    fill = max(r["finished_at"] for r in peers) - min(r["finished_at"] - r["seconds"] for r in peers)
    result = {"hosts": len(specs), "receivers": len(peers), "fill_s": round(fill, 2), "hub_bytes_served": served,
              "cpu_busy": round((busy1 - busy0) / max(1, total1 - total0), 3)}
    if fanout == "tree":
        result["waves"] = max((int(n) for n in re.findall(r"from a peer \(wave \d+/(\d+)\)", out)), default=0)
    else:
        by_peer: dict[str, int] = {}
        for report in peers:
            for name, got in report.get("bytes_by_peer", {}).items():
                by_peer[name] = by_peer.get(name, 0) + got
        result["seed_share_of_bytes_sent"] = round(by_peer.get(specs[0]["name"], 0) / max(1, sum(by_peer.values())), 3)
    return result


def hub_revision() -> None:
    """REVISION in the hub double's data (made once), the double restarted to read it."""
    spec = importlib.util.spec_from_file_location("hub_double", lab.LAB_DIR / "hub_double" / "hub_double.py")
    double = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(double)
    shard_index = lab.STATE / "hub" / "files" / "modelfleet" / "tiny-lab" / REVISION / "model.safetensors.index.json"
    if not shard_index.exists():
        double.generate(lab.STATE / "hub", "modelfleet/tiny-lab", REVISION, SHARDS, SHARD_MIB)
        daemons.stop(lab.STATE, "hub")


def main() -> None:
    receiver = "--receiver" in sys.argv
    rate = int(sys.argv[sys.argv.index("--rate") + 1]) if "--rate" in sys.argv else RATE_MB_S
    specs = lab.up(max(SIZES))
    hub_revision()
    specs = lab.up(max(SIZES))  # the hub double again, now serving REVISION
    clean(specs)
    run_model([specs[0]["name"]], rate, fanout="swarm")
    shown = ssh(specs[0], f"cat {ROOT}/tiny-lab/{CURRENT}/{MANIFEST}")
    total = sum(f["size"] for f in json.loads(shown.stdout)["files"].values())
    one = timed(specs[:2], "swarm", rate)
    figures = {"one_copy": one}
    for n in SIZES:
        clean(specs)
        swarm = timed(specs[:n], "swarm", rate)  # the seed downloads from the hub in this run: hub egress for n hosts
        clean(specs[1:])
        tree = timed(specs[:n], "tree", rate, fanout_width=TREE_WIDTH)
        figures[n] = {"swarm": {**swarm, "hub_egress_ratio": round(swarm["hub_bytes_served"] / total, 3),
                                "fill_vs_one_copy": round(swarm["fill_s"] / one["fill_s"], 3)},
                      "tree": {**tree, "fill_vs_one_copy": round(tree["fill_s"] / one["fill_s"], 3)}}
    clean(specs)
    result = {"revision": REVISION, "checkpoint_bytes": total, "date": time.strftime("%Y-%m-%d"),
              "rate_cap_mb_s_each_way": rate, "one_copy_s": one["fill_s"],
              "one_copy_at_cap_s": round(total / (rate * 1e6), 2),
              "fill_vs_one_copy": {n: {"swarm": figures[n]["swarm"]["fill_vs_one_copy"],
                                       "tree": figures[n]["tree"]["fill_vs_one_copy"]} for n in SIZES},
              "hub_egress_ratio": {n: figures[n]["swarm"]["hub_egress_ratio"] for n in SIZES},
              "groups": {str(n): figures[n] for n in SIZES}, "one_copy": one}
    if receiver:
        compare = subprocess.run([sys.executable, "lab/fanout_compare.py", "--work", f"{lab.STATE}/fanout-compare",
                                  "--files", "8", "--size-mib", "256", "--runs", "3"], capture_output=True, text=True)
        if compare.returncode:
            sys.exit(compare.stdout[-2000:] + compare.stderr[-2000:])
        result["receiver"] = json.loads(compare.stdout)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
