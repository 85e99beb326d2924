"""Stage exporters: the optional DCGM exporter per NVIDIA host (host data `dcgm_exporter: true`), a systemd unit
running NVIDIA's container (every GPU by CDI, `--device nvidia.com/gpu=all`, where its README says `--gpus all`;
`--cap-add SYS_ADMIN` as there) with the image pinned
by digest and listening on the host's fabric address :9400, which `modelfleet prometheus --dcgm` scrapes."""

from __future__ import annotations

from pyinfra.api import deploy

from modelfleet.base.registry import pinned
from modelfleet.host.operations.files import content_changes, content_file
from modelfleet.host.operations.owned_unit import owned_running, refused_when_kept, unmasked
from modelfleet.plan import render
from modelfleet.plan.inventory.plan import HostPlan
from modelfleet.plan.prometheus import DCGM_PORT
from modelfleet.run.context import HostRun

NAME = "exporters"
PINS: frozenset[str] = frozenset()

UNIT = "modelfleet-dcgm-exporter.service"
CONTAINER = "modelfleet-dcgm-exporter"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"


def enabled(plan: HostPlan) -> bool:
    return plan.dcgm_exporter and plan.hardware.vendor == "nvidia"


def wants(plan: HostPlan, probe: dict) -> dict:
    return {"paths": [UNIT_PATH], "units": [UNIT]} if enabled(plan) else {}


def dcgm_unit(plan: HostPlan) -> str:
    listen = f"{plan.fabric_address}:{DCGM_PORT}"
    argv = [render.DOCKER, "run", "--rm", "--name", CONTAINER, "--network", "host", "--device", "nvidia.com/gpu=all",
            "--cap-add", "SYS_ADMIN", pinned(plan.dcgm_exporter_image), "--address", listen]
    return render.render_template("exporter.service.j2", name="DCGM exporter", listen=listen, container=CONTAINER,
                                  exec_start=render.exec_start(argv))


@deploy("modelfleet exporters")
def run(ctx: HostRun):
    plan = ctx.plan
    if not enabled(plan):
        return
    state = ctx.deployed()
    current = state["units"].get(UNIT) or {}
    if refused_when_kept(plan.unit_dropins == "keep", {UNIT: current}, name="Exporter unit: files modelfleet did "
                         "not write"):
        return
    content = dcgm_unit(plan)
    edited = content_changes(state["paths"].get(UNIT_PATH), content, "0644")
    extra = unmasked(UNIT, current)
    content_file(name=f"Unit {UNIT}", dest=UNIT_PATH, content=content, current=state["paths"].get(UNIT_PATH))
    owned_running(UNIT, current, extra, reload=edited, restart=edited)
