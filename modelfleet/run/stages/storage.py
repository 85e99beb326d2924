"""Stage storage: NVMe for model_root. The inventory's `nvme_devices` (paths, or ["auto"] for every blank NVMe
disk) become one filesystem (several: an mdadm RAID0 first), XFS by default, mounted at model_root by UUID
through fstab with noatime,nosuid,nodev (engine containers write their caches below it).

Safety: a device holding a partition table, a filesystem, RAID metadata or a mount is never formatted unless
its serial number is in `format_allow_serials`; the host is refused, naming the device, before anything is
touched. A filesystem this stage made (its label) is kept and re-mounted, never re-made. Hosts without
`nvme_devices` are left alone (model_root on the existing filesystem). Nothing is mounted over a model_root
that holds files (they would be hidden under the mount): the host is refused, naming them.
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import StringCommand, deploy, operation

from modelfleet.base.host_commands import program
from modelfleet.host.facts.host import BlockDevices
from modelfleet.host.operations.files import MARKER, directory
from modelfleet.host.operations.mounts import FLAGS, MOUNTINFO, mount_options
from modelfleet.host.operations.report import fail_host
from modelfleet.plan.inventory.plan import HostPlan
from modelfleet.run.context import HostRun

NAME = "storage"
PINS: frozenset[str] = frozenset()

LABEL = "mf-models"  # at most 12 characters for XFS
RAID = "/dev/md/modelfleet"


def wants(plan: HostPlan, probe: dict) -> dict:
    return {"paths": [plan.model_root], "texts": [MOUNTINFO]} if plan.nvme_devices else {}


def _flatten(devices: list[dict]) -> dict[str, dict]:
    out = {}
    for dev in devices:
        out[dev["path"]] = dev
        out.update(_flatten(dev.get("children") or []))
    return out


def holds_data(dev: dict) -> str | None:
    """What is on the device that formatting would destroy, or None when it is blank."""
    if dev.get("children"):
        kinds = ", ".join(sorted({c.get("type") or "?" for c in dev["children"]}))
        return f"{len(dev['children'])} child device(s) ({kinds})"
    if dev.get("pttype"):
        return f"a {dev['pttype']} partition table"
    if dev.get("fstype") == "linux_raid_member":
        return "RAID metadata (linux_raid_member)"
    if dev.get("fstype"):
        return f"a {dev['fstype']} filesystem" + (f" labelled {dev['label']}" if dev.get("label") else "")
    if dev.get("mountpoint"):
        return f"a mount at {dev['mountpoint']}"
    return None


def plan_devices(plan: HostPlan, devices: list[dict]) -> tuple[list[dict], list[str]]:
    """(target devices, refusals). Pure: the rules above, on lsblk's view of the host."""
    flat = _flatten(devices)
    if list(plan.nvme_devices) == ["auto"]:
        targets = [d for d in devices if d.get("type") == "disk" and (d.get("tran") == "nvme" or
                   d["name"].startswith("nvme")) and (not holds_data(d) or _ours(d, plan))]
    else:
        missing = [p for p in plan.nvme_devices if p not in flat]
        if missing:
            return [], [f"storage: nvme_devices {', '.join(missing)} not found on the host"]
        targets = [flat[p] for p in plan.nvme_devices]
    refusals = []
    for dev in targets:
        what = holds_data(dev)
        if what and not _ours(dev, plan) and dev.get("serial") not in plan.format_allow_serials:
            refusals.append(f"storage: {dev['path']} (serial {dev.get('serial') or 'none'}) holds {what}; refusing to "
                            f"format it. List its serial in format_allow_serials to allow that")
    if not targets and not refusals:
        refusals.append("storage: no blank NVMe disk found for nvme_devices: [auto]")
    return targets, refusals


def mount_point_problem(plan: HostPlan, current: dict | None, mounted_at: str | None) -> str | None:
    """Why the filesystem may not be mounted at model_root, or None. `current` is what the state read found
    there before the mount (a directory's entries); a mount already in place is not mounted again."""
    if mounted_at == plan.model_root or not current:
        return None
    if current.get("kind") != "dir":
        return f"storage: model_root {plan.model_root} exists and is not a directory; refusing to mount over it"
    held = [e for e in current.get("entries") or [] if e != MARKER]
    if held:
        shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
        return (f"storage: model_root {plan.model_root} holds files ({shown}); refusing to mount a filesystem "
                "over them (they would be hidden). Move them away or name another model_root")
    return None


def _ours(dev: dict, plan: HostPlan) -> bool:
    return dev.get("fstype") == plan.model_filesystem and dev.get("label") == LABEL


@operation()
def raid0_assembled(members: list[str], present: bool):
    if present or len(members) < 2:
        host.noop("no RAID0 to assemble")
        return
    yield StringCommand("mdadm", "--create", RAID, "--run", "--level=0", f"--raid-devices={len(members)}",
                        *map(shlex.quote, members))
    yield StringCommand("sh", "-c", shlex.quote(f"mdadm --detail --scan | grep -F {RAID} >> /etc/mdadm/mdadm.conf"))


@operation()
def filesystem_made(device: str, filesystem: str, ours: bool, overwrite: bool):
    if ours:
        host.noop(f"{device} already carries the {filesystem} filesystem labelled {LABEL}")
        return
    force = ["-f"] if overwrite and filesystem == "xfs" else (["-F"] if overwrite else [])
    yield StringCommand(f"mkfs.{filesystem}", "-q", *force, "-L", LABEL, shlex.quote(device))


@operation()
def mounted_by_uuid(device: str, mount: str, filesystem: str, mounted_at: str | None, mountinfo: str | None = None):
    """Mounted nosuid,nodev (engine containers write below model_root: their caches); a mount without them, as
    an older modelfleet made it, is remounted so. `mountinfo`: the host's /proc/self/mountinfo."""
    if mounted_at == mount and set(FLAGS) <= (mount_options(mountinfo, mount) or set()):
        host.noop(f"{device} is mounted at {mount} ({','.join(FLAGS)})")
        return
    yield StringCommand(program("mounted_by_uuid", device, mount, filesystem, env={"FLAGS": ",".join(FLAGS)}))


@deploy("modelfleet storage")
def run(ctx: HostRun):
    plan = ctx.plan
    if not plan.nvme_devices:
        return
    state = ctx.deployed()
    # Preflight's probe already listed the block devices; only a stage run alone asks again.
    devices = (ctx.probe).get("block_devices")
    if devices is None:
        devices = host.get_fact(BlockDevices)
    targets, refusals = plan_devices(plan, devices)
    if refusals:
        fail_host(name="Storage: refuse to format devices that hold data", reasons=refusals)
        return
    flat = _flatten(devices)
    raid = flat.get(RAID) or next((d for d in flat.values() if d.get("type") == "raid0"), None)
    device = targets[0]["path"] if len(targets) == 1 else RAID
    target = targets[0] if len(targets) == 1 else (raid or {})
    over = mount_point_problem(plan, state["paths"].get(plan.model_root), target.get("mountpoint"))
    if over:
        fail_host(name="Storage: refuse to mount over a directory that holds files", reasons=[over])
        return
    raid0_assembled(name=f"RAID0 of {len(targets)} NVMe device(s)", members=[t["path"] for t in targets],
                    present=bool(raid))
    filesystem_made(name=f"{plan.model_filesystem} on {device}", device=device, filesystem=plan.model_filesystem,
                    ours=_ours(target, plan), overwrite=any(holds_data(t) for t in targets))
    mounted_by_uuid(name=f"Mount {device} at {plan.model_root} (fstab, UUID, noatime,{','.join(FLAGS)})",
                    device=device, mount=plan.model_root, filesystem=plan.model_filesystem,
                    mounted_at=target.get("mountpoint"), mountinfo=state["texts"].get(MOUNTINFO))
    # The filesystem there is the one this stage made (its label): what it holds is modelfleet's.
    directory(name=f"Model root {plan.model_root}", path=plan.model_root,
              current=state["paths"].get(plan.model_root) if target.get("mountpoint") == plan.model_root else None,
              claimed=True)
