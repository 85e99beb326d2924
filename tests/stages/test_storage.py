"""The storage stage's device rules (pure), on the recorded H200 host's lsblk and NVMe-shaped variants of it."""

import json
from pathlib import Path

from modelfleet.plan.inventory import resolve
from modelfleet.run.stages.storage import holds_data, plan_devices

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-hosts" / "h200x1-ubuntu2404"


def plan(**data):
    return resolve([("gpu-01", {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm",
                                **data})]).hosts["gpu-01"]


def nvme(n, **fields):
    return {"name": f"nvme{n}n1", "path": f"/dev/nvme{n}n1", "size": 7681501126656, "type": "disk",
            "mountpoint": None, "fstype": None, "pttype": None, "label": None, "tran": "nvme",
            "serial": f"S6EYNA0W{n:05d}", **fields}


def test_recorded_h200_root_disk_is_never_a_target():
    devices = json.loads((H200 / "lsblk-json.txt").read_text().split("__rc=")[0])["blockdevices"]
    targets, refusals = plan_devices(plan(nvme_devices=["/dev/vda"]), devices)
    assert refusals == ["storage: /dev/vda (serial none) holds a mount at /; refusing to format it. "
                        "List its serial in format_allow_serials to allow that"]
    targets, refusals = plan_devices(plan(nvme_devices=["auto"]), devices)
    assert not targets and refusals == ["storage: no blank NVMe disk found for nvme_devices: [auto]"]


def test_auto_takes_blank_and_own_nvme_disks_and_skips_the_rest():
    devices = [nvme(0), nvme(1, fstype="xfs", label="mf-models"), nvme(2, pttype="gpt", children=[
        {"name": "nvme2n1p1", "path": "/dev/nvme2n1p1", "type": "part", "fstype": "ext4"}]),
        nvme(3, fstype="linux_raid_member")]
    targets, refusals = plan_devices(plan(nvme_devices=["auto"]), devices)
    assert [t["path"] for t in targets] == ["/dev/nvme0n1", "/dev/nvme1n1"] and not refusals


def test_named_devices_with_data_need_their_serial_in_the_allow_list():
    devices = [nvme(0, pttype="gpt"), nvme(1, fstype="linux_raid_member")]
    _, refusals = plan_devices(plan(nvme_devices=["/dev/nvme0n1", "/dev/nvme1n1"]), devices)
    assert "a gpt partition table" in refusals[0] and "RAID metadata" in refusals[1]
    targets, refusals = plan_devices(plan(nvme_devices=["/dev/nvme0n1", "/dev/nvme1n1"],
                                          format_allow_serials=["S6EYNA0W00000", "S6EYNA0W00001"]), devices)
    assert len(targets) == 2 and not refusals
    _, refusals = plan_devices(plan(nvme_devices=["/dev/nvme9n1"]), devices)
    assert refusals == ["storage: nvme_devices /dev/nvme9n1 not found on the host"]


def test_holds_data_names_what_would_be_lost():
    assert holds_data(nvme(0)) is None
    assert holds_data(nvme(0, fstype="ext4", label="scratch")) == "a ext4 filesystem labelled scratch"
    assert holds_data(nvme(0, mountpoint="/data")) == "a mount at /data"
