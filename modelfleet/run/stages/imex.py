"""Stage imex: IMEX on NVLink-domain boards (GB200/GB300) for the members of a pool across hosts, before the gate.

NVIDIA's IMEX guide: the `nvidia-imex` service reads its node list (/etc/nvidia-imex/nodes_config.cfg, one IP
address per line, the same list on every node of the domain) when it starts, so a changed list restarts it; IMEX
channels are not created by default and do not survive a reboot, and CUDA calls that need one fail with a
permission error. So: the list from the pool's fabric addresses in pool order, the service enabled and running,
`NVreg_CreateImexChannel0=1` for the NVIDIA module (the driver creates channel0 whenever it loads), and channel0
created now with mknod from the driver's major for `nvidia-caps-imex-channels` in /proc/devices (the module loaded
now read its options before this run). The engine's and the gate's containers get the channel from the fabric's
devices.

Which hosts: those whose pool's fabric says `imex` (modelfleet.host.fabric: a pool across hosts on an NVLink-domain
board); any other host gets no operation at all.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import StringCommand, deploy, operation

from modelfleet.base.host_commands import program
from modelfleet.host.fabric import IMEX_CHANNEL
from modelfleet.host.fabric_run import pool_fabric
from modelfleet.host.operations.files import content_changes, content_file, directory
from modelfleet.host.operations.report import fail_host
from modelfleet.host.operations.service import unit_running
from modelfleet.plan.inventory.plan import HostFabric, HostPlan
from modelfleet.run.context import HostRun

NAME = "imex"
PINS: frozenset[str] = frozenset()

IMEX_DIR = "/etc/nvidia-imex"
NODES_CONFIG = f"{IMEX_DIR}/nodes_config.cfg"
MODPROBE_CONF = "/etc/modprobe.d/nvidia-imex-channel.conf"
UNIT = "nvidia-imex.service"
CHANNEL = IMEX_CHANNEL
CHANNEL_DIR = CHANNEL.rsplit("/", 1)[0]
CHANNEL_DEVICE = "nvidia-caps-imex-channels"  # the driver's name for it in /proc/devices


def wants(plan: HostPlan, probe: dict) -> dict:
    if plan.hardware.vendor != "nvidia" or not any(svc.nnodes > 1 for svc in plan.services):
        return {}
    return {"paths": [IMEX_DIR, NODES_CONFIG, MODPROBE_CONF], "units": [UNIT]}


def channel_present(ctx: HostRun) -> bool:
    """Is channel0 there? Read with preflight's probe (its fabric part lists the IMEX channels)."""
    probe = ctx.probe_on(ctx.plan.name) if hasattr(ctx, "probe_on") else ctx.probe
    imex = (probe.get("fabric") or {}).get("imex") or {}
    return CHANNEL.rsplit("/", 1)[1] in (imex.get("channels") or [])


def nodes_config(fabric: HostFabric) -> str:
    return "".join(f"{address}\n" for address in fabric.imex_nodes)


def modprobe_conf() -> str:
    return ("# Managed by modelfleet: the NVIDIA driver creates IMEX channel0 whenever it loads (NVLink-domain\n"
            "# pools across hosts need it, and a channel made by hand does not survive a reboot).\n"
            "options nvidia NVreg_CreateImexChannel0=1\n")


def channel_script() -> str:
    """mknod channel0 with the major the loaded driver registered (it can differ between nodes)."""
    return program("imex_channel", CHANNEL_DEVICE, CHANNEL)


@operation()
def channel_created(present: bool):
    """IMEX's default channel, /dev/nvidia-caps-imex-channels/channel0, there now."""
    if present:
        host.noop(f"{CHANNEL} is there")
        return
    yield StringCommand(channel_script())


def imex_fabric(ctx: HostRun) -> HostFabric | None:
    """This host's fabric where one of its pools is an NVLink domain across hosts (the first such pool: a
    host belongs to one NVLink domain)."""
    for svc in ctx.plan.services:
        fabric = pool_fabric(ctx, svc.pool)
        mine = fabric.hosts.get(ctx.plan.name) if fabric else None
        if mine is not None and mine.imex:
            return mine
    return None


@deploy("modelfleet imex")
def run(ctx: HostRun):
    fabric = imex_fabric(ctx)
    if fabric is None:
        return None
    if not fabric.imex_nodes:
        fail_host(name="IMEX", reasons=[f"host {ctx.plan.name}: imex_nodes: the NVLink domain's node list is empty "
                                        "(no fabric address derived for its members)"])
        return False
    state = ctx.deployed()
    at = state["paths"].get
    content = nodes_config(fabric)
    directory(name=f"IMEX directory {IMEX_DIR}", path=IMEX_DIR, current=at(IMEX_DIR))
    content_file(name=f"IMEX node list {NODES_CONFIG} (the domain's fabric addresses)", dest=NODES_CONFIG,
                 content=content, current=at(NODES_CONFIG))
    content_file(name=f"IMEX channel0 at every driver load ({MODPROBE_CONF})", dest=MODPROBE_CONF,
                 content=modprobe_conf(), current=at(MODPROBE_CONF))
    channel_created(name=f"IMEX channel {CHANNEL}", present=channel_present(ctx))
    unit_running(name=f"Run {UNIT}", unit=UNIT, current=state["units"].get(UNIT) or {}, reload=False,
                 restart=content_changes(at(NODES_CONFIG), content, "0644"))
