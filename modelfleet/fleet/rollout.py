"""Rolling upgrade: change the image, the model revision or the driver release (`driver_version`) in the
inventory, then `modelfleet upgrade INVENTORY`. Batches: a multi-node pool is one batch; single-node hosts go
`parallel` at a time, never leaving fewer healthy endpoints than `min_healthy`. Per batch: prefetch
(deploys/prefetch.py: the new revision beside the old one, the new image pulled, while the old one serves),
switch (deploys/serve.py: units restart, the verify gate runs), and if that fails, put back the image digest
and revision the batch ran before (read with `modelfleet status` first), restart it, stop the rollout and
report. A batch whose driver changes is drained first (its units stopped and disabled), then serve.py installs
the driver with Fabric Manager, reboots, and passes admission, the NCCL gate and verify before its units start
again; a failure leaves that batch drained and reported (a driver is not rolled back in place). A watcher asks
every endpoint /v1/models twice a second throughout, so the report says how many requests failed, inside and
outside the batch being switched.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from modelfleet.base.commands import run_pyinfra
from modelfleet.fleet import status as fleet_status
from modelfleet.host.operations.report import report_path
from modelfleet.plan import render
from modelfleet.plan.inventory.plan import Resolved
from modelfleet.run.deploys import deploy


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


def endpoints(resolved: Resolved) -> dict[str, list[str]]:
    """Each model clients call (its served name) -> the hosts heading its endpoints (one per pool)."""
    out: dict[str, list[str]] = {}
    for name, plan in resolved.hosts.items():
        for svc in plan.services:
            if svc.node_rank == 0:
                out.setdefault(svc.served_name, []).append(name)
    return out


def outages(resolved: Resolved, planned: list[list[str]]) -> list[str]:
    """Batches that take every endpoint of a model down at once: all of its endpoints where it has several (a
    smaller batch would keep one serving), its only one where it has one (a single host, a single multi-node
    pool: no batch keeps it serving)."""
    out = []
    for number, batch in enumerate(planned, 1):
        for model, heads in endpoints(resolved).items():
            if not set(heads) <= set(batch):
                continue
            if len(heads) > 1:
                out.append(f"batch {number} ({', '.join(batch)}) takes all {len(heads)} endpoints of {model} down "
                           "at once")
                continue
            pools = {svc.pool for svc in resolved.hosts[heads[0]].services if svc.served_name == model}
            members = [h for pool in sorted(pools) for h in (resolved.pools[pool].hosts if pool in resolved.pools
                                                              else [heads[0]])]
            where = f"pool {', '.join(sorted(pools))} on {', '.join(dict.fromkeys(members))}" if len(members) > 1 \
                else f"host {heads[0]}"
            out.append(f"batch {number} ({', '.join(batch)}) takes the only endpoint of {model} ({where}) down "
                       "while it switches")
    return out


class Watcher:
    """Every head endpoint's /v1/models, asked twice a second from a thread of this process (the CLI carries no
    gevent patching, so it runs while pyinfra's child processes do); the windows in which each batch switched
    say which failures were expected (inside the batch) and which not."""

    def __init__(self, resolved: Resolved, interval_s: float = 0.5):
        self.targets = {name: (f"{svc.base_url}/v1/models", render.api_key(svc))
                        for name, plan in resolved.hosts.items() for svc in plan.services if svc.node_rank == 0}
        self.samples: list[tuple[float, str, bool]] = []
        self.windows: list[tuple[float, float, set[str]]] = []
        self.interval_s, self.stopping = interval_s, threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stopping.is_set():
            for host, (url, key) in self.targets.items():
                request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
                try:
                    with urllib.request.urlopen(request, timeout=2) as response:
                        response.read()
                    self.samples.append((time.time(), host, True))
                except (urllib.error.URLError, OSError):
                    self.samples.append((time.time(), host, False))
            self.stopping.wait(self.interval_s)

    def switching(self, batch: list[str], start: float) -> None:
        self.windows.append((start, time.time(), set(batch)))

    def stop(self) -> dict:
        self.stopping.set()
        self.thread.join(timeout=10)
        requests, failures, outside = {}, {}, 0
        for stamp, host, ok in self.samples:
            requests[host] = requests.get(host, 0) + 1
            if not ok:
                failures[host] = failures.get(host, 0) + 1
                if not any(a <= stamp <= b and host in batch for a, b, batch in self.windows):
                    outside += 1
        return {"endpoint_requests": requests, "endpoint_failures": failures, "failures_outside_batch": outside}


def _pyinfra(inventory: str, deploy: str, hosts: list[str], data: dict[str, str], env: dict,
             inventory_args: list[str] = ()) -> tuple[bool, str]:
    # The rollout's own data (a rollback's image and revision) comes last: it wins over the operator's --data.
    run = run_pyinfra(inventory, deploy, limit=hosts, env=env, timeout=None,
                      extra=[*inventory_args, *(arg for k, v in data.items() for arg in ("--data", f"{k}={v}"))])
    return run.returncode == 0, (run.stdout + run.stderr)[-3000:]


def rollback_data(resolved: Resolved, host: str, row: dict) -> tuple[dict[str, str], str | None]:
    """The `--data` that puts EVERY service of `host` back on the image and revision it ran before (`row`: the
    host's status before the rollout), or why no `--data` can (then nothing is run). pyinfra's `--data` reaches
    every host of the inventory alike, so it can say one image and revision, at host level: that serves where the
    host's services all ran the same ones and none of its `services` entries names its own (which would win
    over the host's). A host whose services ran different ones is left for the operator, each one named, rather
    than put back on the first one's."""
    if not resolved.hosts[host].services:  # a front door's own host serves no engine: nothing to put back
        return {}, None
    was = {(s.get("image"), s.get("revision")) for s in row.get("services", [])}
    own = {k for entry in resolved.data.get(host, {}).get("services") or [] if isinstance(entry, dict)
           for k in ("image", "revision") if k in entry}
    if len(was) > 1 or own:
        ran = "; ".join(f"{s.get('pool')}: {s.get('image')} at {s.get('revision')}" for s in row.get("services", []))
        why = (f"its services ran different images or revisions ({ran})" if len(was) > 1 else
               f"its `services` entries name their own {' and '.join(sorted(own))}, which `--data` cannot reach")
        return {}, f"not rolled back: {why}; set them back in the inventory and run deploys/serve.py on {host}"
    image, revision = next(iter(was)) if was else (None, None)
    return {k: v for k, v in (("image", image), ("revision", revision)) if v}, None


def driver_moves(plan, row: dict) -> bool:
    """Does this host's driver change in this rollout? (A release is asked for and another one is loaded.)"""
    wanted = plan.stack.driver_version
    return bool(plan.stack.manage and plan.hardware.vendor == "nvidia" and wanted and row.get("reachable")
                and row.get("driver") != wanted)


def _healthy(status_rows: list[dict]) -> set[str]:
    return {row["host"] for row in status_rows if row["reachable"]
            and all(s["health"] == "200" for s in row["services"] if s["endpoint"])}


def _left_drained(report: dict, entry: dict, watcher: Watcher, start: float, stopped: str, **outcome) -> None:
    """Stop the rollout with this batch drained (its units stopped and disabled), saying why."""
    watcher.switching(entry["hosts"], start)
    entry.update(outcome)
    report["drained"] += entry["hosts"]
    report["stopped"] = stopped


def unserved(resolved: Resolved, batch: list[str], healthy: set[str]) -> list[str]:
    """Models that switching `batch` would leave with no healthy endpoint although they have hosts outside it
    (the default guard: a model served twice is never taken down whole by a rollout)."""
    def models(name: str) -> set[str]:
        return {svc.model.id for svc in resolved.hosts[name].services}

    inside = set().union(*(models(h) for h in batch))
    outside = [h for h in resolved.hosts if h not in batch]
    return sorted(m for m in inside if any(m in models(h) for h in outside)
                  and not any(m in models(h) for h in outside if h in healthy))


def _back_in(everything: Resolved, batch: list[str], log) -> dict[str, str]:
    """The batch's replicas back in their front doors once they answer; what refused (nothing: all back in)."""
    if not fleet_status.behind_front_doors(everything, batch):
        return {}
    log(f"batch {batch}: back into the front door")
    return {k: e for k, e in fleet_status.front_doors(everything, batch, present=True).items() if e}


def restart_budgets(resolved: Resolved, batch: list[str], since: float) -> list[dict]:
    """Each pool of the batch whose recipe has a ready budget: the seconds its restart took to ready in the
    batch's serve run (reports/timeline/<pool>.json, written by a run started after `since`) beside the
    recipe's restart budget; `over` None where the run restarted no unit of the pool (no timeline of it)."""
    out = []
    pools = {svc.pool: svc for host in batch for svc in resolved.hosts[host].services}
    for pool, svc in pools.items():
        budget = svc.recipe.ready_budget_s
        if budget is None:
            continue
        path = report_path("timeline", pool)
        timeline = json.loads(path.read_text()) if path.exists() else {}
        # The run's start is the kernel's record of its process start, on a boot time in whole seconds.
        fresh = timeline.get("pyinfra_started_at", 0) >= since - 2 and timeline.get("ready_s") is not None
        ready = timeline["ready_s"] if fresh else None
        out.append({"pool": pool, "recipe": svc.recipe.id, "budget_s": budget.restart, "ready_s": ready,
                    "over": None if ready is None else ready > budget.restart})
    return out


def switch_batch(everything: Resolved, batch: list[str], switch, drain=None, log=print,
                 step=lambda name: None) -> tuple[str, object]:
    """
    One batch's switch, in the rollout's order: its replicas out of their front doors (requests in flight end on
    them, no new one reaches them), drained where `drain` is given (() -> host -> error or None), `switch()`
    (-> (ok, output): the batch restarts on the new version and passes its gate), then back into the front doors.
    `step(name)` hears each step as it starts. Returns (outcome, detail):
    ("upgraded", None); ("back in failed", errors) after an upgrade; ("front door refused", errors), with what
    was taken out put back (errors then name what stayed out too); ("drain failed", errors); ("switch failed",
    output), still out of its front doors (whoever rolls back puts it back with `_back_in`).
    """
    if fleet_status.behind_front_doors(everything, batch):
        log(f"batch {batch}: out of the front door")
        step("front door")
        refused = {k: e for k, e in fleet_status.front_doors(everything, batch, present=False).items() if e}
        if refused:
            stayed_out = _back_in(everything, batch, log)
            return "front door refused", {**refused, **{f"{k} (putting back)": e for k, e in stayed_out.items()}}
    if drain:
        step("drain")
        refused = {h: e for h, e in drain().items() if e}
        if refused:
            return "drain failed", refused
    log(f"batch {batch}: switch")
    step("switch")
    ok, out = switch()
    if not ok:
        return "switch failed", out
    step("front door")
    refused = _back_in(everything, batch, log)
    return ("back in failed", refused) if refused else ("upgraded", None)


def _back_in_failed(report: dict, batch: list[str], refused: dict) -> None:
    if refused:
        report["stopped"] = (report["stopped"] + "; " if report["stopped"] else "") + (
            f"putting {batch} back into the front door failed: {refused}")


@dataclass
class _Run:
    """What every batch of one rollout shares: the inventory and its arguments, the hosts' status before it, the
    report being written, the watcher, and `where` (batch, hosts, step) for an interrupted run's report."""

    inventory: str
    resolved: Resolved
    everything: Resolved
    before: dict[str, dict]
    report: dict
    watcher: Watcher
    env: dict
    log: Callable[[str], None]
    inventory_args: list[str]
    where: dict = field(default_factory=dict)

    def pyinfra(self, name: str, hosts: list[str], data: dict | None = None) -> tuple[bool, str]:
        return _pyinfra(self.inventory, deploy(name), hosts, data or {}, self.env, self.inventory_args)


def rollout(inventory: str, resolved: Resolved, parallel: int = 1, min_healthy: int | None = None,
            env: dict | None = None, log=print, limit: tuple[str, ...] = (), inventory_args: list[str] = (),
            everything: Resolved | None = None, allow_outage: bool = False) -> dict:
    """`inventory_args`: the `--group-data` / `--data` arguments every pyinfra run of the rollout gets.
    `allow_outage`: the operator accepted an outage (the command that finishes an interrupted run says so too).
    `everything`: the whole inventory when `resolved` is cut down by --limit (the front doors' hosts).
    A replica behind a front door is taken out of it before its batch switches and put back after its gate.
    `min_healthy` None: each model keeps a healthy endpoint outside the switching batch where it has one."""
    plans = [resolved.hosts[name] for name in resolved.hosts]
    run = _Run(inventory=inventory, resolved=resolved, everything=everything or resolved,
               before={row["host"]: row for row in fleet_status.status(plans)},
               report={"batches": [], "upgraded": [], "rolled_back": [], "drained": [], "stopped": None},
               watcher=Watcher(resolved), env=env or {}, log=log, inventory_args=inventory_args)
    report, started = run.report, time.monotonic()
    try:
        for number, batch in enumerate(batches(resolved, parallel), 1):
            run.where.update(batch=number, hosts=batch, step="health check")
            stop = _refused(resolved, batch, _healthy(fleet_status.status(plans)), min_healthy)
            if stop:
                report["stopped"] = stop
                break
            if not _batch(run, number, batch):
                break
    except KeyboardInterrupt:  # Ctrl-C: what was cut off, where each host stands, and how to finish
        again = " ".join(["modelfleet", "upgrade", shlex.quote(inventory), "--parallel", str(parallel),
                          *(["--min-healthy", str(min_healthy)] if min_healthy is not None else []),
                          *(["--allow-outage"] if allow_outage else []),
                          *(f"--limit {shlex.quote(name)}" for name in limit),
                          *(shlex.quote(arg) for arg in inventory_args)])
        where = run.where
        report["stopped"] = (f"interrupted in batch {where.get('batch')} {where.get('hosts')} during its "
                             f"{where.get('step')}; finish with: {again}")
        report["interrupted"] = {**where, "finish_with": again}
        log(f"interrupted in batch {where.get('batch')} {where.get('hosts')} during its {where.get('step')}")
    finally:
        counts = run.watcher.stop()
    after = {row["host"]: row for row in fleet_status.status(plans)}
    if "interrupted" in report:
        _hosts_now(report, after, log)
    before = run.before
    report["drivers"] = {h: {"before": before[h].get("driver"), "after": after[h].get("driver")} for h in after}
    report["rebooted"] = [h for h in after if before[h].get("boot") and after[h].get("boot") != before[h]["boot"]]
    report.update(seconds=round(time.monotonic() - started, 1), **counts)
    return report


def _refused(resolved: Resolved, batch: list[str], healthy: set[str], min_healthy: int | None) -> str | None:
    """Why switching `batch` now would leave too little serving (None: it may switch)."""
    if min_healthy is not None and len(healthy - set(batch)) < min_healthy:
        return (f"switching {batch} would leave {len(healthy - set(batch))} healthy endpoint(s), "
                f"fewer than min_healthy {min_healthy}")
    down = [] if min_healthy is not None else unserved(resolved, batch, healthy)
    if down:
        return (f"switching {batch} would leave {', '.join(down)} with no healthy endpoint "
                "(its other hosts are not healthy); fix them first, or set --min-healthy 0")
    return None


def _batch(run: _Run, number: int, batch: list[str]) -> bool:
    """One batch: prefetch, switch (drained first where its driver moves), and on a failed gate the rollback.
    False when the rollout stops here (the report says why)."""
    resolved, report, log, where = run.resolved, run.report, run.log, run.where
    moving = [h for h in batch if driver_moves(resolved.hosts[h], run.before[h])]
    entry = {"hosts": batch, "driver_upgrade": bool(moving)}
    report["batches"].append(entry)
    log(f"batch {batch}: prefetch")
    where["step"] = "prefetch"
    ok, out = run.pyinfra("prefetch", batch)
    if not ok:
        entry.update(result="prefetch failed", output=out)
        report["stopped"] = f"prefetch failed on {batch}: the old version keeps serving"
        return False
    switch_start = time.time()

    def drain():
        log(f"batch {batch}: drain for the driver upgrade ({', '.join(moving)})")
        return fleet_status.drain([resolved.hosts[h] for h in batch])

    outcome, out = switch_batch(run.everything, batch, lambda: run.pyinfra("serve", batch),
                                drain=drain if moving else None, log=log, step=lambda name: where.update(step=name))
    if outcome == "front door refused":
        entry.update(result="front door refused", errors=out)
        report["stopped"] = f"taking {batch} out of the front door failed: {out}; nothing switched"
        return False
    if outcome == "drain failed":
        _left_drained(report, entry, run.watcher, switch_start, f"draining {batch} failed: {out}",
                      result="drain failed", errors=out)
        return False
    if outcome in ("upgraded", "back in failed"):
        run.watcher.switching(batch, switch_start)
        entry["result"] = "upgraded"
        entry["ready_budget"] = restart_budgets(resolved, batch, switch_start)
        for pool in (p for p in entry["ready_budget"] if p["over"]):
            line = (f"batch {number} {batch}: pool {pool['pool']} ready {pool['ready_s']} s after its run "
                    f"started, over its restart budget of {pool['budget_s']} s ({pool['recipe']})")
            report.setdefault("over_budget", []).append(line)
            log(line)
        report["upgraded"] += batch
        if outcome == "back in failed":
            _back_in_failed(report, batch, out)
            return False
        return True
    if moving:
        _left_drained(report, entry, run.watcher, switch_start, f"the driver upgrade failed on {batch}; the batch "
                      "stays drained, the rest is untouched", result="driver upgrade failed", output=out)
        return False
    entry.update(result="gate failed: rolled back", output=out)
    _roll_back(run, entry, batch)
    run.watcher.switching(batch, switch_start)
    left = [r["host"] for r in report["rolled_back"] if r.get("refused")]
    report["stopped"] = f"the gate failed on {batch}; rolled back to the previous image and revision" + (
        f" (not {', '.join(left)}: see rolled_back)" if left else "")
    _back_in_failed(report, batch, _back_in(run.everything, batch, log))
    return False


def _roll_back(run: _Run, entry: dict, batch: list[str]) -> None:
    """Every host of the batch, every service, back on the image and revision it ran before the rollout."""
    run.log(f"batch {batch}: gate failed, rolling back")
    run.where["step"] = "rollback"
    for host in batch:
        data, refused = rollback_data(run.resolved, host, run.before[host])
        if refused:
            run.log(f"batch {batch}: {host}: {refused}")
            run.report["rolled_back"].append({"host": host, "ok": False, "refused": refused})
            continue
        back, back_out = run.pyinfra("serve", [host], data)
        run.report["rolled_back"].append({"host": host, **data, "ok": back})
        if not back:
            entry["rollback_output"] = back_out


def _hosts_now(report: dict, after: dict[str, dict], log) -> None:
    """An interrupted rollout's report: where each host stands now, and the command that finishes it."""
    report["interrupted"]["hosts_now"] = {
        h: {"reachable": row.get("reachable"),
            "services": [{k: s.get(k) for k in ("unit", "image", "revision", "health")}
                         for s in row.get("services", [])]} for h, row in after.items()}
    for h, row in report["interrupted"]["hosts_now"].items():
        log(f"  {h}: " + ("unreachable" if not row["reachable"] else "; ".join(
            f"{s['image']} health {s['health']}" for s in row["services"]) or "no service"))
    log(f"finish with: {report['interrupted']['finish_with']}")
