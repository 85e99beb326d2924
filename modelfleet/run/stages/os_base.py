"""Stage os_base: what the GPU stack builds on. The tools the repository steps use (curl, CA certificates) and,
when gpu_driver is about to build a kernel module (DKMS: the NVIDIA driver, amdgpu-dkms), the running kernel's
headers, all from the distribution's own archive. A host whose driver is already loaded gets no headers: its
kernel may not even be a distribution kernel (seen on a real H200 host: 6.18.44-fc-v973-gpu)."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy

from modelfleet.host import os as osfam
from modelfleet.host.facts.host import OsRelease
from modelfleet.plan.inventory.plan import HostPlan
from modelfleet.run.context import HostRun

NAME = "os_base"  # a part of the gpu_stack stage


def base_packages(plan: HostPlan, os_info: dict | None, builds_module: bool = True) -> dict[str, None]:
    """Package name -> any version (the OS family's names); empty where the stack is not ours to manage."""
    if not plan.stack_ours:
        return {}
    fam = osfam.family(os_info)
    names = list(fam.names("base", os_info))
    if builds_module and (os_info or {}).get("kernel"):
        names.append(fam.names("kernel_headers", os_info).format(kernel=os_info["kernel"]))
    return dict.fromkeys(names)


def _os_info(probe: dict) -> dict | None:
    """Preflight's view of the OS; asked again only when the stage runs on its own."""
    return probe["os"] if probe else host.get_fact(OsRelease)


def wants(plan: HostPlan, probe: dict) -> dict:
    return {"packages": list(base_packages(plan, probe.get("os")))}


@deploy("modelfleet os_base")
def run(ctx: HostRun, builds_module: bool = True):
    plan = ctx.plan
    os_info = _os_info(ctx.probe)
    wanted = base_packages(plan, os_info, builds_module)
    state = ctx.deployed()
    osfam.family(os_info).packages(name="Base packages and kernel headers", wanted=wanted, current=state["packages"])
