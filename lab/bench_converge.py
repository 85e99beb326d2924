"""`make bench-converge`: wall time of a no-op converge of serve.py on 1 and on N lab hosts in one run, their
ratio, and remote commands per host (counted from pyinfra's -vvv echo of every command it sends)."""

import json
import re
import sys
import time

import lab
from modelfleet.commands import run_pyinfra


def converge(limit: str | None = None) -> tuple[float, dict[str, int], str]:
    start = time.perf_counter()
    run = run_pyinfra("inventories/lab.py", "deploys/serve.py", limit=[limit] if limit else [], extra=["-vvv"])
    elapsed = time.perf_counter() - start
    out = run.stdout + run.stderr
    if run.returncode:
        sys.exit(out[-4000:])
    counts: dict[str, int] = {}
    for host in re.findall(rf"\[({lab.PREFIX}\d+)\]\s+>>> ", out):
        counts[host] = counts.get(host, 0) + 1
    return elapsed, counts, out


def main() -> None:
    hosts = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    lab.up(hosts)
    converge()  # first converge: installs units, starts engines
    one, one_counts, _ = converge(limit=f"{lab.PREFIX}1")
    many, many_counts, out = converge()
    changed = re.search(r"Grand total\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)", out)
    print(json.dumps({
        "hosts": hosts,
        "noop_converge_s_1_host": round(one, 2),
        f"noop_converge_s_{hosts}_hosts": round(many, 2),
        "ratio": round(many / one, 2),
        "remote_commands_per_host_1": one_counts.get(f"{lab.PREFIX}1"),
        "remote_commands_per_host_max": max(many_counts.values()) if many_counts else None,
        "changed_operations_in_noop_run": None if not changed else
        (0 if changed.group(2) == "-" else int(changed.group(2))),
    }, indent=2))


if __name__ == "__main__":
    main()
