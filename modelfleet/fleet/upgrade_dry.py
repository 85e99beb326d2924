"""`modelfleet upgrade --dry`: per batch, what changes on each host (the image it runs → the inventory's, the
revision, the driver release) and the drain before its switch (out of its front doors; units stopped for a
driver upgrade). What runs now is read from the hosts, as the rollout reads it first (`modelfleet status`); a
host that cannot be read says so. Nothing is changed, nothing is asked of a registry or the hub: an image
given by tag is pinned to its digest by the run, which restarts a unit only when the digest moved."""

from __future__ import annotations

from modelfleet.fleet import status as fleet_status
from modelfleet.fleet.rollout import batches, driver_moves
from modelfleet.plan.inventory.plan import Resolved
from modelfleet.plan.inventory.schema import COMMIT_RE


def _without_digest(image: str | None) -> str | None:
    return image.partition("@")[0] if image else image


def _image(running: str | None, wanted: str) -> dict:
    if running is None:
        moves = None
    elif "@sha256:" in wanted:
        moves = running != wanted
    else:  # a tag: the run asks the registry for its digest; the same tag may still move
        moves = True if _without_digest(running) != wanted else None
    out = {"old": running, "new": wanted, "changes": moves}
    if moves is None and running is not None:
        out["note"] = "same tag: the run pins its digest again and restarts only if it moved"
    return out


def _venv(running: str | None, venv) -> dict:
    """A venv engine's `image`: the venv its unit runs (status: venv:<path>); the path names the lock."""
    return _change(running, f"venv:{venv.path}")


def _change(old, new) -> dict:
    return {"old": old, "new": new, "changes": None if old is None else old != new}


def _revision(running: str | None, wanted: str) -> dict:
    if COMMIT_RE.match(wanted) or running is None:
        return _change(running, wanted)
    return {"old": running, "new": wanted, "changes": None,
            "note": f"{wanted} is a branch or tag: the run resolves it to a commit, a change if that is not {running}"}


def host_changes(plan, row: dict) -> dict:
    """One host: each service's image and revision, old → new, and the driver."""
    running = {s["pool"]: s for s in row.get("services", [])}
    out = {"reachable": bool(row.get("reachable"))}
    if not row.get("reachable"):
        out["note"] = f"not read: {row.get('error') or 'unreachable'} (old values unknown)"
    out["services"] = [{"pool": svc.pool, "unit": svc.unit_name,
                        "image": _venv(running.get(svc.pool, {}).get("image") or None, svc.venv) if svc.venv
                        else _image(running.get(svc.pool, {}).get("image") or None, svc.image),
                        "revision": _revision(running.get(svc.pool, {}).get("revision") or None,
                                              svc.revision or "main")}
                       for svc in plan.services]
    if plan.stack.manage and plan.hardware.vendor == "nvidia":
        wanted = plan.stack.driver_version or f"branch {plan.stack.driver_branch} (the loaded release is kept)"
        out["driver"] = {"old": row.get("driver"), "new": wanted,
                         "changes": driver_moves(plan, row) if row.get("reachable") else None}
    return out


def preview(resolved: Resolved, everything: Resolved, parallel: int, rows: list[dict] | None = None) -> dict:
    """The rollout's batches with each host's changes and the batch's drain. `rows`: `fleet_status.status` of the
    hosts (read here when not given)."""
    plans = [resolved.hosts[name] for name in resolved.hosts]
    by_host = {row["host"]: row for row in (fleet_status.status(plans) if rows is None else rows)}
    out = []
    for number, batch in enumerate(batches(resolved, parallel), 1):
        changes = {h: host_changes(resolved.hosts[h], by_host.get(h, {})) for h in batch}
        doors = [{"front_door": rp.name, "router_host": rp.host, "replica": w.url, "pool": w.pool}
                 for rp, w in fleet_status.behind_front_doors(everything, batch)]
        stopped = [svc.unit_name for h in batch if (changes[h].get("driver") or {}).get("changes")
                   for svc in resolved.hosts[h].services]
        out.append({"batch": number, "hosts": batch, "changes": changes,
                    "drain": {"out_of_front_doors": doors, "units_stopped_for_driver": stopped,
                              "summary": _drain_line(doors, stopped)}})
    return {"batches": out}


def _drain_line(doors: list[dict], stopped: list[str]) -> str:
    parts = []
    if doors:
        parts.append("out of " + ", ".join(sorted({d["front_door"] for d in doors})) + " before the switch, back "
                     "in after its gate (" + ", ".join(d["replica"] for d in doors) + ")")
    if stopped:
        parts.append("units stopped and disabled for the driver upgrade: " + ", ".join(stopped))
    return "; ".join(parts) or "none: no front door, no driver change"
