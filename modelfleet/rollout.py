"""Rolling upgrade: change the image or the model revision in the inventory, then `modelfleet upgrade INVENTORY`.

Batches: a multi-node pool is one batch; single-node hosts go `parallel` at a time, never leaving fewer healthy
endpoints than `min_healthy`. Per batch: prefetch (deploys/prefetch.py: the new revision beside the old one,
the new image pulled, while the old one serves), switch (deploys/serve.py: units restart, the verify gate runs),
and if that fails, put back the image digest and revision the batch ran before (read with `modelfleet status`
first), restart it, stop the rollout and report. A watcher process asks every endpoint /v1/models twice a
second throughout, so the report says how many requests failed, inside and outside the batch being switched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from modelfleet import fleet, render
from modelfleet.commands import run_pyinfra
from modelfleet.inventory import Resolved


def batches(resolved: Resolved, parallel: int) -> list[list[str]]:
    out, singles, seen = [], [], set()
    for name, plan in resolved.hosts.items():
        if name in seen:
            continue
        multi = [svc for svc in plan.services if svc.nnodes > 1]
        if multi:
            members = resolved.pools[multi[0].pool].hosts
            out.append(list(members))
            seen.update(members)
        else:
            singles.append(name)
            seen.add(name)
    out += [singles[i:i + parallel] for i in range(0, len(singles), parallel)]
    return out


class Watcher:
    """Every head endpoint's /v1/models, asked twice a second by a separate process (modelfleet.watch); the
    windows in which each batch switched say which failures were expected (inside the batch) and which not."""

    def __init__(self, resolved: Resolved, workdir: Path):
        targets = {name: [f"{svc.base_url}/v1/models", render.api_key(svc)]
                   for name, plan in resolved.hosts.items() for svc in plan.services if svc.node_rank == 0}
        self.targets_file, self.log = workdir / "targets.json", workdir / "watch.log"
        fd = os.open(self.targets_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # may hold API keys
        with os.fdopen(fd, "w") as f:
            json.dump(targets, f)
        self.windows: list[tuple[float, float, set[str]]] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "modelfleet.watch", str(self.targets_file),
                                      str(self.log)])

    def switching(self, batch: list[str], start: float) -> None:
        self.windows.append((start, time.time(), set(batch)))

    def stop(self) -> dict:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        requests, failures, outside = {}, {}, 0
        for line in self.log.read_text().splitlines():
            stamp, host, result = line.split()
            requests[host] = requests.get(host, 0) + 1
            if result == "fail":
                failures[host] = failures.get(host, 0) + 1
                if not any(a <= float(stamp) <= b and host in batch for a, b, batch in self.windows):
                    outside += 1
        return {"endpoint_requests": requests, "endpoint_failures": failures, "failures_outside_batch": outside}


def _pyinfra(inventory: str, deploy: str, hosts: list[str], data: dict[str, str], env: dict) -> tuple[bool, str]:
    run = run_pyinfra(inventory, deploy, limit=hosts, data=data, env=env, timeout=None)
    return run.returncode == 0, (run.stdout + run.stderr)[-3000:]


def _healthy(status_rows: list[dict]) -> set[str]:
    return {row["host"] for row in status_rows if row["reachable"]
            and all(s["health"] == "200" for s in row["services"] if s["endpoint"])}


def rollout(inventory: str, resolved: Resolved, parallel: int = 1, min_healthy: int = 0,
            env: dict | None = None, log=print) -> dict:
    plans = [resolved.hosts[name] for name in resolved.hosts]
    before = {row["host"]: row for row in fleet.status(plans)}
    report = {"batches": [], "upgraded": [], "rolled_back": [], "stopped": None}
    workdir = Path(tempfile.mkdtemp(prefix="modelfleet-rollout-"))
    watcher = Watcher(resolved, workdir)
    started = time.monotonic()
    try:
        for batch in batches(resolved, parallel):
            healthy = _healthy(fleet.status(plans))
            if len(healthy - set(batch)) < min_healthy:
                report["stopped"] = (f"switching {batch} would leave {len(healthy - set(batch))} healthy endpoint(s), "
                                     f"fewer than min_healthy {min_healthy}")
                break
            entry = {"hosts": batch}
            report["batches"].append(entry)
            log(f"batch {batch}: prefetch")
            ok, out = _pyinfra(inventory, "deploys/prefetch.py", batch, {}, env or {})
            if not ok:
                entry.update(result="prefetch failed", output=out)
                report["stopped"] = f"prefetch failed on {batch}: the old version keeps serving"
                break
            log(f"batch {batch}: switch")
            switch_start = time.time()
            ok, out = _pyinfra(inventory, "deploys/serve.py", batch, {}, env or {})
            if ok:
                watcher.switching(batch, switch_start)
                entry["result"] = "upgraded"
                report["upgraded"] += batch
                continue
            entry.update(result="gate failed: rolled back", output=out)
            log(f"batch {batch}: gate failed, rolling back")
            for host in batch:
                old = next((s for s in before[host].get("services", [])), {})
                data = {k: v for k, v in (("image", old.get("image")), ("revision", old.get("revision"))) if v}
                back, back_out = _pyinfra(inventory, "deploys/serve.py", [host], data, env or {})
                report["rolled_back"].append({"host": host, **data, "ok": back})
                if not back:
                    entry["rollback_output"] = back_out
            watcher.switching(batch, switch_start)
            report["stopped"] = f"the gate failed on {batch}; rolled back to the previous image and revision"
            break
    finally:
        counts = watcher.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    report.update(seconds=round(time.monotonic() - started, 1), **counts)
    return report
