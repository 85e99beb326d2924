"""A pool's fabric as the stages use it in a run (imex, netcheck, service): from the run context, for pools
across hosts only, and the problems that stop such a pool before anything of it starts; and a service as its
containers run on its host (as_run)."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from modelfleet.host.fabric import PoolFabric
from modelfleet.plan.inventory.plan import Resolved, ServicePlan
from modelfleet.plan.inventory.pools import unequal_gpus


class HostRun(Protocol):
    """What these functions ask of the run context (modelfleet.run.context.HostRun, which sits above this module)."""

    inventory: Resolved

    def fabric(self, pool: str) -> PoolFabric: ...

    def probe_on(self, name: str) -> dict: ...


def pool_fabric(ctx: HostRun, pool: str) -> PoolFabric | None:
    """The pool's fabric, derived from every member's facts once per run (None for a pool of one host, whose
    containers need nothing of it)."""
    if len(ctx.inventory.pools[pool].hosts) < 2 or not hasattr(ctx, "fabric"):
        return None
    return ctx.fabric(pool)


def as_run(ctx: HostRun, svc: ServicePlan) -> ServicePlan:
    """The service as its containers run on its host: with the member's fabric (pools across hosts) and, on
    AMD, the host's render group by number (from the host's probe)."""
    fabric = pool_fabric(ctx, svc.pool)
    if fabric:
        svc = replace(svc, fabric=fabric.hosts.get(svc.host))
    if svc.hardware.vendor == "amd":
        svc = replace(svc, render_gid=ctx.probe_on(svc.host).get("render_gid"))
    return svc


def refusals(ctx: HostRun, services) -> list[str]:
    """One line per problem that stops a pool across hosts before anything of it starts."""
    lines = []
    for svc in services:
        fabric = pool_fabric(ctx, svc.pool)
        for where, field, message in fabric.errors if fabric else []:
            lines.append(f"pool {svc.pool}: {where}: {field}: {message}")
        if fabric and not fabric.errors and svc.host not in fabric.hosts:
            lines.append(f"pool {svc.pool}: host {svc.host}: fabric: no fabric derived for this member")
        lines += [f"pool {svc.pool}: gpus: {line}" for line in visible_gpu_problems(ctx, svc)]
    return lines


def visible_gpu_problems(ctx: HostRun, svc: ServicePlan) -> list[str]:
    """A pool across hosts whose members' drivers show fewer GPUs than the pool gives each (a GPU fell off the
    bus): its ranks per host would differ. Members whose probe lists no GPU (a driver being installed) are
    preflight's to judge."""
    members = ctx.inventory.pools[svc.pool].hosts
    if len(members) < 2 or svc.hardware.vendor not in ("nvidia", "amd"):
        return []
    counts = {name: len(ctx.probe_on(name).get(f"{svc.hardware.vendor}_gpus") or []) for name in members}
    if all(n >= svc.gpus or n == 0 for n in counts.values()):
        return []
    return [unequal_gpus(counts, f"seen by the drivers; the pool needs {svc.gpus} each")]
