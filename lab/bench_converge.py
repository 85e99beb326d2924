"""`make bench-converge`: the control node's cost of a no-op converge of serve.py, in one run, JSON.

- wall time on 1 host and on the largest size, their ratio, and remote commands per host (counted from
  pyinfra's -vvv echo of every command it sends);
- CPU seconds (user + sys of the pyinfra process) per host at each size (default 16 and 48 lab hosts), and
  the same for stock pyinfra running as many no-op operations per host (lab/stock_noop_deploy.py:
  files.directory/files.file, one fact each), with their ratio. The CPU runs are without -v, as a user runs.
- shards: the same no-op converge of every host through `modelfleet converge --shards K` for K = 1 and
  SHARDS (each host its own checkpoint group, so every pool is a unit): wall and CPU seconds of each.
- simulation: both no-op runs recorded on the lab's hosts and replayed at SIM_SIZES hosts with no SSH
  (lab/replay.py), the line CPU = fixed + per_host x hosts fitted to each, and modelfleet's fixed cost and
  per-host cost over stock pyinfra's. `python -m lab.bench_converge --simulate` runs only this part, on the lab
  as it is.
"""

import json
import re
import resource
import subprocess
import sys
import time

import lab
from lab import replay
from modelfleet.base.commands import run_modelfleet, run_pyinfra

STOCK_DEPLOY = "lab/stock_noop_deploy.py"
SHARDS = 4
SIM_SIZES = (1, 48, 250, 1000)
NO_CONFIG = ["--config", "no-such-config.py"]  # pyinfra reads none: the checkout's config.py is modelfleet's


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
        run = run_modelfleet("converge", "inventories/lab.py", "deploys/serve.py", "-y", "--shards", str(count))
    elapsed, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    if run.returncode:
        sys.exit(run.stdout[-3000:] + run.stderr[-2000:])
    return {"shards": count, "wall_s": round(elapsed, 2), "cpu_s": round(cpu, 2)}


def changed(output: str) -> int | None:
    """Changed operations in a run's Grand total (None: no total printed)."""
    total = re.search(r"Grand total\s+(\d+)\s+(\S+)", output)
    return None if not total else (0 if total.group(2) == "-" else int(total.group(2)))


def line(points: dict[int, float]) -> tuple[float, float]:
    """Least-squares fixed + per_host x hosts through (hosts, seconds) points."""
    xs, ys = list(points), list(points.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def simulated(ops: int, sizes=SIM_SIZES) -> dict:
    """Record a no-op converge of serve.py and of the stock deploy on the lab's hosts, replay each at `sizes`
    hosts; CPU and wall seconds of each run, the fitted lines, and modelfleet's over stock's."""
    stock_env = {"MODELFLEET_BENCH_OPS": str(ops)}
    runs: dict[str, dict[int, dict]] = {"modelfleet": {}, "stock_pyinfra": {}}
    # Both sides from compiled modules, as installed packages run (pip compiled pyinfra's; an edited checkout
    # under PYTHONDONTWRITEBYTECODE=1 would compile modelfleet's in every run).
    subprocess.run([sys.executable, "-m", "compileall", "-q", "modelfleet", "lab"], check=True)
    with lab.scenario.applied(checkpoint_group=None):  # each host its own pool and group: copies stay apart
        converge()
        converge(deploy=STOCK_DEPLOY, env=stock_env)
        # Stock pyinfra's side loads no modelfleet code: not the checkout's config.py (modelfleet's inventory
        # guard) nor the inventory's validation.
        for side, deploy, env, extra in (
                ("modelfleet", "deploys/serve.py", {}, []),
                ("stock_pyinfra", STOCK_DEPLOY, {**stock_env, "MODELFLEET_REPLAY_STOCK": "1"}, NO_CONFIG)):
            recording = lab.STATE / f"replay-{side}.json"
            replay.record(recording, deploy=deploy, env=env)
            for n in sizes:
                run = replay.pyinfra("replay", recording, "lab/replay_inventory.py", deploy, extra=extra, env={
                    **env, "MODELFLEET_REPLAY": str(recording), "MODELFLEET_REPLAY_HOSTS": str(n)})
                if run["returncode"] or changed(run["output"]) != 0:
                    sys.exit(f"replayed {side} at {n} hosts: exit {run['returncode']}, not a no-op:\n"
                             + run["output"][-3000:])
                runs[side][n] = {"cpu_s": round(run["cpu_s"], 3), "wall_s": round(run["wall_s"], 2)}
    return {"recorded_hosts": len(lab.status()["hosts"]), **judged(runs)}


def judged(runs: dict[str, dict[int, dict]]) -> dict:
    """The line CPU = fixed + per_host x hosts fitted to each side's runs, and modelfleet's over stock's. A run's
    fixed cost is its 1-host run less one host's fitted cost (the fit's intercept swings with the large runs'
    noise)."""
    fits = {side: {kind: line({int(n): r[kind] for n, r in by_size.items()}) for kind in ("cpu_s", "wall_s")}
            for side, by_size in runs.items()}
    fixed = {side: runs[side][min(runs[side], key=int)]["cpu_s"] - fits[side]["cpu_s"][1] for side in runs}
    top = max(runs["modelfleet"], key=int)
    ours, stock = runs["modelfleet"][top], runs["stock_pyinfra"][top]
    return {
        "runs": runs,
        "fit": {side: {kind: {"intercept_s": round(a, 3), "per_host_s": round(b, 5)} for kind, (a, b) in f.items()}
                for side, f in fits.items()},
        "fixed_cpu_s": {side: round(value, 3) for side, value in fixed.items()},
        "fixed_cpu_ratio": round(fixed["modelfleet"] / fixed["stock_pyinfra"], 2),
        "per_host_cpu_ratio": round(fits["modelfleet"]["cpu_s"][1] / fits["stock_pyinfra"]["cpu_s"][1], 2),
        f"cpu_ratio_{top}_hosts": round(ours["cpu_s"] / stock["cpu_s"], 2),
        f"wall_ratio_{top}_hosts": round(ours["wall_s"] / stock["wall_s"], 2),
    }


def main() -> None:
    if sys.argv[1:] == ["--simulate"]:
        ops = converge()["operations_per_host"]
        print(json.dumps({"date": time.strftime("%Y-%m-%d"), "simulation": simulated(ops)}, indent=2))
        return
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
        "simulation": simulated(ops),
        "shards": {"hosts": high, "runs": shard_runs,
                   "wall_ratio": round(shard_runs[1]["wall_s"] / shard_runs[0]["wall_s"], 2),
                   "cpu_ratio": round(shard_runs[1]["cpu_s"] / shard_runs[0]["cpu_s"], 2)},
    }, indent=2))


if __name__ == "__main__":
    main()
