"""What the service stage will write for each service (unit, env and secret files, from the pinned service)
and whether a host's unit of a pool (re)starts in this run: read by the service stage, and through the run
context's `pool_starts` by the netcheck gate and the verify stage, which act only when a pool (re)starts."""

from __future__ import annotations

from modelfleet import render
from modelfleet.inventory import HostPlan, ServicePlan
from modelfleet.operations.files import content_changes
from modelfleet.pins import pinned_service

UNIT_DIR = "/etc/systemd/system"


def unit_files(svc: ServicePlan) -> list[tuple[str, str, str, bool]]:
    """(path, content, mode, secret) for everything the service's unit depends on."""
    out = [(f"{UNIT_DIR}/{svc.unit_name}", render.render_unit(svc), "0644", False),
           (svc.env_file, render.render_env(svc), "0600", True)]
    secrets_yaml = render.render_secrets_config(svc)
    if secrets_yaml:
        out.append((svc.secrets_config_file, secrets_yaml, "0600", True))
    return out


def pinned_services(plan: HostPlan) -> list[ServicePlan]:
    return [pinned_service(plan, svc) for svc in plan.services]


def edited(svc: ServicePlan, state: dict) -> dict[str, bool]:
    at = state["paths"].get
    return {path: content_changes(at(path), content, mode) for path, content, mode, _ in unit_files(svc)}


def starts(plan: HostPlan, state: dict, pool: str) -> bool:
    """Will this run (re)start the host's unit of `pool`? (What the netcheck gate must clear first.)"""
    for svc in pinned_services(plan):
        if svc.pool == pool:
            unit = state["units"].get(svc.unit_name) or {}
            return any(edited(svc, state).values()) or unit.get("ActiveState") != "active"
    return False
