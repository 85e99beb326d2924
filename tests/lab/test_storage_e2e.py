"""The storage stage on lab hosts whose `nvme_devices` are loop devices (lab up --disks 1): a blank device
becomes XFS at model_root by UUID with noatime,nosuid,nodev (a setuid binary or a device node planted there gives
nobody root or the disk) and stays untouched on a re-run; a device that holds a
filesystem is refused before anything is written to it."""

import hashlib
import re
import subprocess
from pathlib import Path

import pytest

from lab import scenario, ssh
from modelfleet.base.commands import run_pyinfra

pytestmark = pytest.mark.lab
ROOT = "/srv/models-nvme"
AS_NOBODY = "setpriv --reuid=65534 --regid=65534 --clear-groups"


def storage(limit: str):
    scenario.write(nvme=True, model_root=ROOT)
    return run_pyinfra("inventories/lab.py", "deploys/storage.py", extra=["--limit", limit], timeout=300)


def image_of(spec) -> Path:
    return Path(spec["home"]) / "disk-0.img"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_blank_device_becomes_xfs_at_model_root_and_a_rerun_changes_nothing(lab_hosts):
    spec = lab_hosts[0]
    disk = spec["disks"][0]
    first = storage(spec["name"])
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert ssh(spec, f"findmnt -n -o SOURCE,FSTYPE,OPTIONS {ROOT}").stdout.split()[:2] == [disk, "xfs"]
    options = ssh(spec, f"findmnt -n -o OPTIONS {ROOT}").stdout.strip()
    assert {"noatime", "nosuid", "nodev"} <= set(options.split(",")), (
        options, ssh(spec, "cat /etc/fstab").stdout, first.stdout[-3000:])
    uuid = ssh(spec, f"blkid -s UUID -o value {disk}").stdout.strip()
    assert re.search(rf"^UUID={uuid} {ROOT} xfs noatime,nosuid,nodev,nofail 0 2$", ssh(spec, "cat /etc/fstab").stdout,
                     re.M)
    # What an engine container (it writes its caches below model_root) plants there gives nobody root or a disk.
    planted = ssh(spec, f"cp /usr/bin/id {ROOT}/suid-id && chmod 4755 {ROOT}/suid-id && "
                        f"set -- $(stat -c '%t %T' {disk}) && mknod -m 0644 {ROOT}/disk b $((0x$1)) $((0x$2)) && "
                        f"{AS_NOBODY} {ROOT}/suid-id -u; {AS_NOBODY} sh -c 'head -c1 {ROOT}/disk' >/dev/null; "
                        f"rm -f {ROOT}/suid-id {ROOT}/disk")
    assert planted.stdout.splitlines()[0] == "65534", planted.stdout + planted.stderr  # not 0: the bit is ignored
    assert "Permission denied" in planted.stderr
    ssh(spec, f"echo kept > {ROOT}/marker")
    second = storage(spec["name"])
    total = re.search(r"Grand total\s+(\d+)\s+(\S+)", second.stdout + second.stderr)
    assert second.returncode == 0 and total and total.group(2) == "-", second.stdout[-2000:]
    assert ssh(spec, f"cat {ROOT}/marker").stdout.strip() == "kept"


def test_device_with_a_filesystem_is_refused_and_not_written(lab_hosts):
    spec = lab_hosts[2]
    disk, image = spec["disks"][0], image_of(spec)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "userdata", str(image)], check=True)
    ssh(spec, f"blockdev --rereadpt {disk} 2>/dev/null; true")
    before = sha256(image)
    run = storage(spec["name"])
    out = run.stdout + run.stderr
    assert run.returncode != 0
    assert f"storage: {disk} (serial none) holds a ext4 filesystem labelled userdata; refusing to format it" in out
    assert sha256(image) == before  # not a byte written
    assert ssh(spec, f"findmnt -n {ROOT}").stdout.strip() == ""
