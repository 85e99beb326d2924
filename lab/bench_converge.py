"""`make bench-converge`: the control node's cost of a no-op converge of serve.py, in one run, JSON.

- wall time on 1 host and on the largest size, their ratio, and remote commands per host (counted from
  pyinfra's -vvv echo of every command it sends);
- CPU seconds (user + sys of the pyinfra process) per host at each size (default 16 and 48 lab hosts), and
  the same for stock pyinfra running as many no-op operations per host (lab/stock_noop_deploy.py:
  files.directory/files.file, one fact each), with their ratio. The CPU runs are without -v, as a user runs.
- shards: the same no-op converge of every host through `modelfleet converge --shards K` for K = 1 and
  SHARDS (each host its own checkpoint group, so every pool is a unit): wall and CPU seconds of each.
"""

import json
import re
import resource
import sys
import time

import lab
from modelfleet.commands import run_modelfleet, run_pyinfra

STOCK_DEPLOY = "lab/stock_noop_deploy.py"
SHARDS = 4


def cpu_seconds() -> float:
    """User + sys of this process's finished children (each pyinfra run is one)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def converge(hosts: list[str] | None = None, deploy: str = "deploys/serve.py", verbose: bool = False,
             env: dict | None = None) -> dict:
    """One pyinfra run on `hosts` (all when None): wall and CPU seconds, commands and operations per host."""
    cpu, start = cpu_seconds(), time.perf_counter()
    run = run_pyinfra("inventories/lab.py", deploy, limit=hosts or [], extra=["-vvv"] if verbose else [], env=env)
    elapsed, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    out = run.stdout + run.stderr
    if run.returncode:
        sys.exit(out[-4000:])
    counts: dict[str, int] = {}
    for host in re.findall(rf"\[({lab.PREFIX}\d+)\]\s+>>> ", out):
        counts[host] = counts.get(host, 0) + 1
    total = re.search(r"Grand total\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)", out)
    count = len(hosts) if hosts else len(lab.status()["hosts"])
    return {"wall_s": elapsed, "cpu_s": cpu, "commands": counts, "hosts": count,
            "operations_per_host": int(total.group(1)) // count if total else None,
            "changed": None if not total else (0 if total.group(2) == "-" else int(total.group(2)))}


def sharded(count: int) -> dict:
    """A no-op converge of every lab host in `count` shards: wall and CPU seconds (all its processes)."""
    cpu, start = cpu_seconds(), time.perf_counter()
    with lab.scenario.applied(checkpoint_group=None):  # each pool its own group: shards hold whole pools
        run = run_modelfleet("converge", "inventories/lab.py", "deploys/serve.py", "--shards", str(count))
    elapsed, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    if run.returncode:
        sys.exit(run.stdout[-3000:] + run.stderr[-2000:])
    return {"shards": count, "wall_s": round(elapsed, 2), "cpu_s": round(cpu, 2)}


def main() -> None:
    sizes = sorted(int(n) for n in sys.argv[1:]) or [16, 48]
    names = [spec["name"] for spec in lab.up(sizes[-1])]
    converge()  # first converge: installs units, starts engines
    one = converge(names[:1], verbose=True)
    many = converge(verbose=True)
    ops = one["operations_per_host"]
    stock_env = {"MODELFLEET_BENCH_OPS": str(ops)}
    converge(deploy=STOCK_DEPLOY, env=stock_env)  # makes the stock deploy's directories and files
    cpu = {}
    for n in sizes:
        ours = converge(names[:n])
        stock = converge(names[:n], deploy=STOCK_DEPLOY, env=stock_env)
        assert ours["changed"] == 0 and stock["changed"] == 0, (ours, stock)
        cpu[n] = {"modelfleet_cpu_s_per_host": round(ours["cpu_s"] / n, 4),
                  "stock_pyinfra_cpu_s_per_host": round(stock["cpu_s"] / n, 4),
                  "ratio": round(ours["cpu_s"] / stock["cpu_s"], 3),
                  "modelfleet_wall_s": round(ours["wall_s"], 2), "stock_pyinfra_wall_s": round(stock["wall_s"], 2)}
    low, high = sizes[0], sizes[-1]
    sharded(1)  # each host its own checkpoint group: every host gets the hub token once (not a no-op)
    shard_runs = [sharded(1), sharded(SHARDS)]
    print(json.dumps({
        "date": time.strftime("%Y-%m-%d"),
        "hosts": high,
        "noop_converge_s_1_host": round(one["wall_s"], 2),
        f"noop_converge_s_{high}_hosts": round(many["wall_s"], 2),
        "ratio": round(many["wall_s"] / one["wall_s"], 2),
        "remote_commands_per_host_1": one["commands"].get(names[0]),
        "remote_commands_per_host_max": max(many["commands"].values()) if many["commands"] else None,
        "changed_operations_in_noop_run": many["changed"],
        "operations_per_host": ops,
        "control_node_cpu": cpu,
        # What a host adds beyond the fixed cost of starting pyinfra and loading the inventory.
        "marginal_cpu_s_per_host": {
            "modelfleet": round((cpu[high]["modelfleet_cpu_s_per_host"] * high
                                 - cpu[low]["modelfleet_cpu_s_per_host"] * low) / (high - low), 4),
            "stock_pyinfra": round((cpu[high]["stock_pyinfra_cpu_s_per_host"] * high
                                    - cpu[low]["stock_pyinfra_cpu_s_per_host"] * low) / (high - low), 4),
        } if high > low else None,
        "shards": {"hosts": high, "runs": shard_runs,
                   "wall_ratio": round(shard_runs[1]["wall_s"] / shard_runs[0]["wall_s"], 2),
                   "cpu_ratio": round(shard_runs[1]["cpu_s"] / shard_runs[0]["cpu_s"], 2)},
    }, indent=2))


if __name__ == "__main__":
    main()
