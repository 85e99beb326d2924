"""Converging more hosts than one control-node process handles well: the inventory split into shards of whole
pools, one pyinfra process per shard, one summary.

Hosts that a run coordinates stay in one shard: the hosts of a pool (the NCCL gate, admission, multi-node
units start together) and the hosts sharing a checkpoint (the fan-out copies from the group's first host).
Those groups are the units; shards are filled largest unit first, each into the shard with the fewest hosts.
Each shard is an ordinary `pyinfra -y INVENTORY DEPLOY --limit ...` run: the run lock, validation and
reports work as in one run, and its output goes to reports/converge/shard-<k>.log.
"""

from __future__ import annotations

import re
import subprocess
import time

from modelfleet.base import masking
from modelfleet.base.commands import pyinfra_argv
from modelfleet.host.operations.report import reports_dir
from modelfleet.plan.inventory.plan import Resolved


def units(resolved: Resolved) -> list[list[str]]:
    """Hosts that must converge in the same process, in inventory order (pools and checkpoint groups joined)."""
    parent = {name: name for name in resolved.hosts}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    linked: dict[tuple, list[str]] = {}
    for name, plan in resolved.hosts.items():
        for svc in plan.services:
            linked.setdefault(("pool", svc.pool), []).append(name)
            linked.setdefault(("checkpoint", svc.checkpoint_group, svc.model.id), []).append(name)
    for names in linked.values():
        for name in names[1:]:
            parent[root(name)] = root(names[0])
    groups: dict[str, list[str]] = {}
    for name in resolved.hosts:
        groups.setdefault(root(name), []).append(name)
    return list(groups.values())


def split(resolved: Resolved, count: int) -> list[list[str]]:
    """At most `count` shards of whole units, as even in hosts as the units allow; none empty."""
    shards: list[list[str]] = [[] for _ in range(count)]
    for unit in sorted(units(resolved), key=len, reverse=True):
        min(shards, key=len).extend(unit)
    order = list(resolved.hosts)
    return [sorted(shard, key=order.index) for shard in shards if shard]


def slice_of(resolved: Resolved, spec: str) -> tuple[int, int, list[str]]:
    """`--shard K/N`: slice K of the N that split() makes, the same on every control node that reads the same
    inventory (whole units, filled in inventory order); empty where the units make fewer than N."""
    parts = re.fullmatch(r"([0-9]{1,3})/([0-9]{1,3})", spec)
    if not (parts and 1 <= int(parts[1]) <= int(parts[2]) <= 256):
        raise ValueError(f"--shard {spec!r}: expected K/N in ASCII digits with 1 <= K <= N <= 256")
    number, count = int(parts[1]), int(parts[2])
    shards = split(resolved, count)
    return number, count, shards[number - 1] if number <= len(shards) else []


def empty_slices(resolved: Resolved, spec: str) -> str | None:
    """What `--shard K/N` with more slices than the hosts make says (each K/N job still runs; the ones past the
    units converge nothing)."""
    count, made = int(spec.partition("/")[2]), len(units(resolved))
    if count <= made:
        return None
    return (f"--shard {spec}: the hosts chosen make only {made} slice(s) of whole pools and checkpoint groups, so "
            f"slices {made + 1}-{count} of {count} converge nothing: use N at most {made}")


def converge(inventory: str, deploy: str, shards: list[list[str]], progress=print, options: list[str] = (),
             numbers: list[int] | None = None, of: int | None = None) -> dict:
    """Run one pyinfra process per shard at once (`options`: pyinfra's --group-data/--data, as validated); wait
    for all; the summary (ok only if every shard was). `numbers`: the shards' numbers (default 1, 2, ...), which
    name their logs, of `of` (default: as many as given)."""
    running = []
    logs = reports_dir("converge")
    logs.mkdir(parents=True, exist_ok=True)
    for number, hosts in zip(numbers or range(1, len(shards) + 1), shards, strict=True):
        log = logs / f"shard-{number}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(pyinfra_argv(inventory, deploy, limit=hosts, extra=options), stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        running.append((number, hosts, log, proc, time.monotonic()))
    results = []
    for number, hosts, log, proc, started in running:
        code = proc.wait()
        log.write_text(masking.mask(log.read_text(errors="replace")))  # the child masks; this is the report's own
        seconds = round(time.monotonic() - started, 2)
        progress(f"shard {number}/{of or len(shards)}: {len(hosts)} host(s), exit {code}, {seconds} s ({log})")
        results.append({"shard": number, "hosts": hosts, "returncode": code, "seconds": seconds, "log": str(log)})
    return {"inventory": inventory, "deploy": deploy, "ok": all(r["returncode"] == 0 for r in results),
            "shards": results}
