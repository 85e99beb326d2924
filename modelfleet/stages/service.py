"""Stage service: systemd unit + 0600 env file per service; restart only on change; wait until ready."""

from __future__ import annotations

from dataclasses import replace

from pyinfra.api import deploy

from modelfleet import render
from modelfleet.inventory import HostPlan, ServicePlan
from modelfleet.operations.files import content_changes, content_file, directory
from modelfleet.operations.service import unit_running, wait_ready, worker_up
from modelfleet.stages import deployed_for_stage, host_plan
from modelfleet.stages.images import pinned_image
from modelfleet.stages.model import pinned_revision

UNIT_DIR = "/etc/systemd/system"


def _files(svc: ServicePlan) -> list[tuple[str, str, str, bool]]:
    """(path, content, mode, secret) for everything the service's unit depends on."""
    out = [(f"{UNIT_DIR}/{svc.unit_name}", render.render_unit(svc), "0644", False),
           (svc.env_file, render.render_env(svc), "0600", True)]
    secrets_yaml = render.render_secrets_config(svc)
    if secrets_yaml:
        out.append((svc.secrets_config_file, secrets_yaml, "0600", True))
    return out


def _services(plan: HostPlan) -> list[ServicePlan]:
    return [replace(pinned_revision(plan, svc), image=pinned_image(svc)) for svc in plan.services]


def wants(plan: HostPlan) -> dict:
    """What this stage reads from the host's DeployedState."""
    services = _services(plan)
    paths = [plan.config_dir] + [svc.model_dir for svc in services]
    paths += [path for svc in services for path, *_ in _files(svc)]
    paths += [svc.auth_file for svc in services if render.api_key(svc)]
    return {"paths": paths, "units": [svc.unit_name for svc in services]}


def _edited(svc: ServicePlan, state: dict) -> dict[str, bool]:
    at = state["paths"].get
    return {path: content_changes(at(path), content, mode) for path, content, mode, _ in _files(svc)}


def starts(plan: HostPlan, state: dict, pool: str) -> bool:
    """Will this run (re)start the host's unit of `pool`? (What the netcheck gate must clear first.)"""
    for svc in _services(plan):
        if svc.pool == pool:
            unit = state["units"].get(svc.unit_name) or {}
            return any(_edited(svc, state).values()) or unit.get("ActiveState") != "active"
    return False


def pool_starts(pool: str) -> bool:
    """Will this run (re)start a unit of `pool` on any of its hosts? (Read from each host's state, once.)"""
    from pyinfra import state as run_state

    from modelfleet.stages import deployed_of, resolved

    return any(starts(resolved().hosts[name], deployed_of(run_state.inventory.get_host(name)), pool)
               for name in resolved().pools[pool].hosts)


@deploy("modelfleet service")
def run(deployed: dict | None = None):
    plan = host_plan()
    services = _services(plan)
    state = deployed or deployed_for_stage(__name__)
    at = state["paths"].get

    directory(name=f"Config directory {plan.config_dir} (0700)", path=plan.config_dir,
              current=at(plan.config_dir), mode="0700")
    for svc in services:
        files_, key = _files(svc), render.api_key(svc)
        directory(name=f"Model directory {svc.model_dir}", path=svc.model_dir, current=at(svc.model_dir))
        edited = _edited(svc, state)
        for path, content, mode, secret in files_:
            content_file(name=f"File {path} ({mode})", dest=path, content=content, current=at(path), mode=mode,
                         secret=secret)
        if key:
            content_file(name=f"Client auth header {svc.auth_file} (0600)", dest=svc.auth_file,
                         content=f"Authorization: Bearer {key}\n", current=at(svc.auth_file), mode="0600",
                         secret=True)
        unit = state["units"].get(svc.unit_name) or {}
        unit_running(name=f"Run {svc.unit_name}", unit=svc.unit_name, current=unit,
                     reload=edited[f"{UNIT_DIR}/{svc.unit_name}"], restart=any(edited.values()))
        if (any(edited.values()) or unit.get("ActiveState") != "active") and svc.node_rank:
            worker_up(name=f"Worker {svc.unit_name} (rank {svc.node_rank} of pool {svc.pool}) stays up",
                      unit=svc.unit_name)
        elif any(edited.values()) or unit.get("ActiveState") != "active":
            wait_ready(name=f"Wait until {svc.served_name} answers at {svc.base_url}", unit=svc.unit_name,
                       base_url=svc.base_url, served_name=svc.served_name, timeout_s=svc.recipe.ready_timeout_s,
                       auth_file=svc.auth_file if key else None)
