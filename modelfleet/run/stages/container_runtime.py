"""Stage container_runtime: Docker Engine and the NVIDIA Container Toolkit, and a container that sees the GPUs.

Docker from Docker's repository (docker-ce and its plugins; `docker_source: distro` takes the
distribution's docker.io instead), the NVIDIA Container Toolkit from NVIDIA's repository,
`nvidia-ctk runtime configure --runtime=docker` when daemon.json lacks the nvidia runtime, a CDI spec from
`nvidia-ctk cdi generate`, Docker restarted only when its configuration changed, and a check that a container
run with the GPUs lists the same GPUs as the host (`--device nvidia.com/gpu=all ... nvidia-smi -L`, through CDI as
the engines get theirs; AMD: /dev/kfd and /dev/dri).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pyinfra import host
from pyinfra.api import StringCommand, deploy, operation

from modelfleet.base.host_commands import container_gpu_check
from modelfleet.host import os as osfam
from modelfleet.host.operations.files import content_file
from modelfleet.host.operations.service import unit_running
from modelfleet.plan import trust
from modelfleet.plan.inventory.plan import HostPlan
from modelfleet.run.context import HostRun

NAME = "container_runtime"  # a part of the gpu_stack stage

DAEMON_JSON = "/etc/docker/daemon.json"
CDI_SPEC = "/etc/cdi/nvidia.yaml"
TOOLKIT_PACKAGE = "nvidia-container-toolkit"


def runtime_holds(fam) -> set[str]:
    """What is held: Docker's engine and containerd (from either source), and the toolkit."""
    return {*fam.names("docker_holds"), fam.names("distro_docker"), TOOLKIT_PACKAGE}


@dataclass
class RuntimePlan:
    manage: bool
    vendor: str = "none"
    repositories: list[osfam.Repository] = field(default_factory=list)  # Docker's and the toolkit's
    packages: dict[str, None] = field(default_factory=dict)
    configure_nvidia: bool = False
    cdi: bool = False
    restart_docker: bool = False


def nvidia_runtime_configured(daemon_json: str | None) -> bool:
    """The nvidia runtime is registered and CDI is on (engines get their GPUs as CDI devices; Docker 25-27
    need `features.cdi`, 28 has it by default and keeps the setting)."""
    try:
        config = json.loads(daemon_json or "{}")
    except ValueError:
        return False
    return "nvidia" in (config.get("runtimes") or {}) and (config.get("features") or {}).get("cdi") is True


def decide(plan: HostPlan, probe: dict, state: dict, driver_changes: bool = False,
           reboot_pending: bool = False) -> RuntimePlan:
    """Pure: repositories, packages and the runtime configuration this host still needs."""
    stack, vendor = plan.stack, plan.hardware.vendor
    if not plan.stack_ours:
        return RuntimePlan(manage=False)
    out = RuntimePlan(manage=True, vendor=vendor)
    os_info = probe.get("os") or {}
    fam = osfam.family(os_info)
    # A family whose archive has no Docker (the RHEL family ships podman) takes Docker's repository.
    if stack.docker_source == "docker" or not fam.names("distro_docker"):
        out.repositories.append(fam.repository("docker", stack.docker_repo_url, os_info))
        out.packages.update(dict.fromkeys(fam.names("docker")))
    else:
        out.packages[fam.names("distro_docker")] = None
    if vendor == "nvidia":
        out.repositories.append(fam.repository(TOOLKIT_PACKAGE, stack.container_toolkit_repo_url, os_info,
                                               key_url=stack.container_toolkit_key_url))
        out.packages[TOOLKIT_PACKAGE] = None
        out.configure_nvidia = not nvidia_runtime_configured(state["texts"].get(DAEMON_JSON))
        # The spec names the driver's libraries by version: regenerate it when the driver changes. nvidia-ctk
        # asks the loaded driver, so with a reboot pending it waits for the next run.
        out.cdi = (driver_changes or not state["paths"].get(CDI_SPEC)) and not reboot_pending
    # A Docker that is not running yet starts with the new configuration: no restart.
    running = (state.get("units", {}).get("docker.service") or {}).get("ActiveState") == "active"
    out.restart_docker = out.configure_nvidia and running
    return out


@operation()
def nvidia_runtime(configure: bool, cdi: bool):
    """`nvidia-ctk runtime configure --runtime=docker --cdi.enabled` (it edits daemon.json) and the CDI spec."""
    if not configure and not cdi:
        host.noop("nvidia runtime configured, CDI spec present")
        return
    if configure:
        yield StringCommand("nvidia-ctk", "runtime", "configure", "--runtime=docker", "--cdi.enabled",
                            f"--config={DAEMON_JSON}")
    if cdi:
        yield StringCommand("install", "-d", "-m", "0755", "/etc/cdi", "&&",
                            "nvidia-ctk", "cdi", "generate", f"--output={CDI_SPEC}")


@operation(is_idempotent=False)
def container_sees_gpus(needed: bool, reason: str, vendor: str, image: str):
    if not needed:
        host.noop(reason)
        return
    yield StringCommand(container_gpu_check(vendor, image))


def wants(plan: HostPlan, probe: dict) -> dict:
    d = decide(plan, probe, {"texts": {}, "paths": {}})
    return {"paths": [p for r in d.repositories for p in (*(f for f, _ in r.sources), r.key)]
            + ([CDI_SPEC] if d.vendor == "nvidia" else []),
            "packages": list(d.packages), "units": ["docker.service"] if d.manage else [],
            "texts": [DAEMON_JSON] if d.vendor == "nvidia" else []}


@deploy("modelfleet container_runtime")
def run(ctx: HostRun, driver_changes: bool = False, reboot_pending: bool = False):
    plan = ctx.plan
    state = ctx.deployed()
    d = decide(plan, ctx.probe, state, driver_changes, reboot_pending)
    fam = osfam.family(ctx.probe.get("os"))
    paths = state["paths"]
    for repo in d.repositories:
        fam.key_fetched(name=f"Signing key {repo.key}", url=repo.key_url, dest=repo.key, current=paths.get(repo.key),
                        repo=repo.repo, fingerprints=trust.expected(plan.stack.repo_key_fingerprints, repo.repo))
        for path, content in repo.sources:
            content_file(name=f"Source list {path}", dest=path, content=content, current=paths.get(path))
    fam.packages(name="Docker and the container toolkit", wanted=d.packages, current=state["packages"])
    # Held: an upgrade of Docker restarts dockerd (and every engine); one of the toolkit changes how GPUs reach
    # them. Both change only through modelfleet.
    fam.held(name="Hold Docker and the container toolkit", names=[p for p in d.packages if p in runtime_holds(fam)],
             current=state["packages"])
    nvidia_runtime(name="NVIDIA runtime for Docker and CDI spec", configure=d.configure_nvidia, cdi=d.cdi)
    if d.manage:
        unit_running(name="Run docker.service", unit="docker.service",
                     current=state["units"].get("docker.service") or {}, reload=False, restart=d.restart_docker)
    changed = bool(fam.missing(d.packages, state["packages"]) or d.configure_nvidia or d.cdi or driver_changes)
    passthrough = plan.services[0].gpu_passthrough if plan.services else True
    skip = ("GPU stack not managed here" if not d.manage else
            "inventory says gpu_passthrough: false (no GPUs to hand to containers)" if not passthrough else
            "reboot pending: the driver is not loaded yet" if reboot_pending else
            None if changed else "runtime unchanged")
    container_sees_gpus(name="A container sees the host's GPUs", vendor=d.vendor, image=plan.stack.gpu_check_image,
                        needed=skip is None, reason=skip or "")
    return d
