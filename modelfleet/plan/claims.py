"""No collision passes validation: on each host, every port a front door listens on, every unit and every file
modelfleet writes belongs to one thing (a pool, its weight cache or keyed proxy, a front door). Two that would
share one (a pool named `router-<model>` beside that model's front door, two front doors on one port) are
refused, naming the host, both owners and the field to change; otherwise one would overwrite the other.

The names come from the modules that write them (router, replica_door, weight_cache, the plans), so a new file
of theirs is claimed here without a second list."""

from __future__ import annotations

from modelfleet.plan import replica_door, router, weight_cache
from modelfleet.plan.catalog.routers import bootstrap_port, pd_role
from modelfleet.plan.inventory.plan import HostPlan

ENGINE = "(its engine)"


def _owned(plan: HostPlan) -> list[tuple[str, str, str, str]]:
    """(kind, value, owner, the field that renames it) for everything the host's services and front doors
    take."""
    out = []
    for svc in plan.services:
        owner = f"pool {svc.pool}"
        out += [("unit", svc.unit_name, owner, "pool"), ("file", svc.env_file, owner, "pool"),
                ("file", svc.secrets_config_file, owner, "pool"), ("file", svc.auth_file, owner, "pool"),
                *(("port", str(port), f"{owner} (its engine)", "port") for port in svc.ports)]
        bootstrap = bootstrap_port(svc.recipe, svc.engine_name) if pd_role(svc.recipe, svc.engine_name) == \
            "prefill" else None
        if bootstrap:
            out.append(("port", str(bootstrap), f"{owner} (its prefill bootstrap server)", "recipe"))
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
        # The router's venv, its marker and its lock are one per router release, shared by its doors.
        out += [("file", path, owner, "served_name") for key, path in router.paths(rp).items()
                if key not in ("unit", "proxy_unit", "installed", "lock")]
        for port, what in ((rp.port, "its front door"), (rp.backend_port, "its router behind the front door"),
                           (rp.metrics_port, "its router's metrics")):
            out.append(("port", str(port), f"{owner} ({what})", "router_port"))
    return out


def collisions(hosts: dict[str, HostPlan]) -> list[tuple[str, str, str]]:
    """(host, field, reason) for each unit, file or port two owners on one host would share. Two engines' ports,
    and an engine's against a front door's, are said by the services' and the front door's own checks."""
    errors = []
    for name, plan in hosts.items():
        taken: dict[tuple[str, str], tuple[str, str]] = {}
        for kind, value, owner, fld in _owned(plan):
            first = taken.setdefault((kind, value), (owner, fld))
            if first[0] == owner:
                continue
            if ENGINE in (first[0] + owner) and "bootstrap" not in first[0] + owner:
                continue  # an engine's port against another's or a front door's: said by those checks
            fix = f"change `{first[1]}` of {first[0]} or `{fld}` of {owner}"
            # The field to change: a pool's name or an engine's port is the one free to change.
            named = next((f for f in ("pool", "port") if f in (first[1], fld)), fld)
            errors.append((f"host {name}", named, f"{kind} {value} would be taken by both {first[0]} and {owner}, "
                                                f"one overwriting the other: {fix}"))
    return errors
