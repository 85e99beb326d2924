"""No collision passes validation: on each host, every port a front door listens on, every unit and every file
modelfleet writes belongs to one thing (a pool, its weight cache or keyed proxy, a front door). Two that would
share one (a pool named `router-<model>` beside that model's front door, two front doors on one port) are
refused, naming the host, both owners and the field to change; otherwise one would overwrite the other.

The names come from the modules that write them (router, replica_door, weight_cache, the plans), so a new file
of theirs is claimed here without a second list."""

from __future__ import annotations

from modelfleet import replica_door, router, weight_cache
from modelfleet.inventory.plan import HostPlan


def _owned(plan: HostPlan) -> list[tuple[str, str, str, str]]:
    """(kind, value, owner, the field that renames it) for everything the host's services and front doors
    take."""
    out = []
    for svc in plan.services:
        owner = f"pool {svc.pool}"
        out += [("unit", svc.unit_name, owner, "pool"), ("file", svc.env_file, owner, "pool"),
                ("file", svc.secrets_config_file, owner, "pool"), ("file", svc.auth_file, owner, "pool")]
        if weight_cache.spec(svc):
            owner = f"the weight cache of pool {svc.pool}"
            out += [("unit", weight_cache.unit_name(svc), owner, "pool"),
                    ("file", weight_cache.env_file(svc), owner, "pool")]
        if svc.door_address:
            owner = f"the keyed proxy of pool {svc.pool}"
            out += [("unit", replica_door.unit_name(svc), owner, "pool")]
            out += [("file", path, owner, "pool") for key, path in replica_door.paths(svc).items() if key != "unit"]
    for rp in plan.routers:
        owner = f"the front door of {rp.served_name}"
        out += [("unit", rp.unit_name, owner, "served_name"), ("unit", rp.proxy_unit_name, owner, "served_name")]
        out += [("file", path, owner, "served_name") for key, path in router.paths(rp).items()
                if key not in ("unit", "proxy_unit", "installed")]
        for port, what in ((rp.port, "its front door"), (rp.backend_port, "its router behind the front door"),
                           (rp.metrics_port, "its router's metrics")):
            out.append(("port", str(port), f"{owner} ({what})", "router_port"))
    return out


def collisions(hosts: dict[str, HostPlan]) -> list[tuple[str, str, str]]:
    """(host, field, reason) for each unit, file or front-door port two owners on one host would share. Ports of
    pools are checked with the services (and against front doors by the front door's own check)."""
    errors = []
    for name, plan in hosts.items():
        taken: dict[tuple[str, str], tuple[str, str]] = {}
        for kind, value, owner, fld in _owned(plan):
            first = taken.setdefault((kind, value), (owner, fld))
            if first[0] == owner or first[0].split(" (")[0] == owner.split(" (")[0]:
                continue
            fix = "give one of them another `router_port`" if kind == "port" else \
                f"rename one of them (`{first[1]}` of {first[0]}, or `{fld}` of {owner})"
            named = "pool" if "pool" in (first[1], fld) else fld  # a pool's name is the one free to change
            errors.append((f"host {name}", named, f"{kind} {value} would be both {first[0]}'s and {owner}'s, one "
                                                f"overwriting the other: {fix}"))
    return errors
