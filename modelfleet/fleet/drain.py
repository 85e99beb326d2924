"""Maintenance drain: `modelfleet drain INVENTORY HOST...` takes the hosts' replicas out of their front doors
(in-flight requests finish, no new one reaches them), then stops and disables their engines and weight caches,
so the GPUs are free and a reboot during the maintenance does not start them; nothing is removed (units, env
files, checkpoints stay). `modelfleet undrain` enables and starts them again and puts the replicas back into
their front doors once they answer. A member of a multi-node pool takes its whole pool along (one rank stopped
stops the pool). A converge of a drained host brings it back too: it converges to what the inventory says."""

from __future__ import annotations

from modelfleet.fleet import status as fleet_status
from modelfleet.fleet.rollout import endpoints
from modelfleet.plan import weight_cache
from modelfleet.plan.inventory.plan import Resolved


def with_pools(resolved: Resolved, hosts: list[str]) -> list[str]:
    """The hosts and every member of a multi-node pool one of them belongs to, in inventory order."""
    keep = set(hosts)
    for name in hosts:
        keep |= {member for svc in resolved.hosts[name].services if svc.nnodes > 1
                 for member in resolved.pools[svc.pool].hosts}
    return [name for name in resolved.hosts if name in keep]


def outages(resolved: Resolved, hosts: list[str]) -> list[str]:
    """Each model the drain leaves with no endpoint (every host heading one is drained), with those hosts."""
    return [f"draining {', '.join(hosts)} leaves {model} with no endpoint (served by {', '.join(heads)} only)"
            for model, heads in endpoints(resolved).items() if set(heads) <= set(hosts)]


def drain(resolved: Resolved, hosts: list[str]) -> dict:
    """Out of the front doors first; a front door that refuses stops the drain before any engine stops (the
    replicas already out are put back)."""
    doors = fleet_status.front_doors(resolved, hosts, present=False)
    report = {"hosts": hosts, "front_doors": doors, "stopped": {}, "ok": False}
    if any(doors.values()):
        back = {k: e for k, e in fleet_status.front_doors(resolved, hosts, present=True).items() if e}
        report["stopped_because"] = "a front door did not take a replica out: no engine was stopped"
        report["put_back_errors"] = back
        return report
    report["stopped"] = fleet_status.drain([resolved.hosts[h] for h in hosts])
    report["units"] = {h: units(resolved, h) for h in hosts}
    report["ok"] = not any(report["stopped"].values())
    return report


def undrain(resolved: Resolved, hosts: list[str]) -> dict:
    """Engines (and weight caches, first) enabled and started, then back into the front doors once they answer;
    a host whose units did not start stays out of its front doors."""
    started = fleet_status.undrain([resolved.hosts[h] for h in hosts])
    ready = [h for h in hosts if not started[h]]
    doors = fleet_status.front_doors(resolved, ready, present=True) if ready else {}
    report = {"hosts": hosts, "started": started, "front_doors": doors,
              "units": {h: units(resolved, h) for h in hosts}}
    report["ok"] = not any(started.values()) and not any(doors.values())
    return report


def units(resolved: Resolved, host: str) -> list[str]:
    return [unit for svc in resolved.hosts[host].services for unit in weight_cache.unit_names(svc)]


def lines(report: dict, undo: bool) -> list[str]:
    """The report as one line per host and per front door call."""
    out = [f"{where}: {'back in' if undo else 'out of'} its front door" + (f": FAILED: {error}" if error else "")
           for where, error in report["front_doors"].items()]
    done = report["started"] if undo else report["stopped"]
    for host in report["hosts"]:
        if host not in done:
            continue
        units_ = ", ".join(report["units"].get(host) or []) or "no engine"
        what = "enabled and started" if undo else "stopped and disabled (units and checkpoints kept)"
        out.append(f"{host}: {units_} {what}" + (f": FAILED: {done[host]}" if done[host] else ""))
    if report.get("stopped_because"):
        out.append(f"drain stopped: {report['stopped_because']}")
    return out
