"""Root's hygiene on a real lab host (sshd, systemd), attacked by a local unprivileged user (nobody):
- the run lock: a FIFO and a symlink planted where the lock used to live (/run/lock, world-writable), a victim
  process of theirs running; the run is not denied, nothing is written through the symlink, the victim lives,
  and nobody can put a name in the lock's own directory;
- the vendor .deb: a symlink planted at the old fixed /tmp path; root installs through its own mktemp directory
  and writes nothing through the link;
- the engine caches' directory: bind-mounted nosuid,nodev, so a setuid-root binary planted there runs as its
  caller and a device node there cannot be opened;
- /run/modelfleet after a boot that started a restart-tier unit (its RuntimeDirectory lines): 0700, and the next
  run takes the lock."""

import time

import pytest

import lab
from lab import apt as lab_apt
from modelfleet.base.commands import run_pyinfra
from modelfleet.host.operations.mounts import FLAGS, MOUNTINFO, mount_options, private_bind
from modelfleet.host.os.debian import repo_package

pytestmark = pytest.mark.lab
AS_NOBODY = "setpriv --reuid=65534 --regid=65534 --clear-groups"
PWNED = "/etc/modelfleet-pwned"


def root(spec, command: str) -> str:
    done = lab.ssh(spec, command)
    assert done.returncode == 0, (command, done.stdout, done.stderr)
    return done.stdout


def test_an_unprivileged_user_neither_denies_nor_hijacks_the_run_lock(lab_hosts):
    spec = lab_hosts[0]
    root(spec, f"rm -f /run/lock/modelfleet.lock /run/lock/modelfleet.lock.holder {PWNED}")
    victim = root(spec, f"{AS_NOBODY} sh -c 'mkfifo /run/lock/modelfleet.lock && "
                        f"ln -s {PWNED} /run/lock/modelfleet.lock.holder && (sleep 600 >/dev/null 2>&1 & echo $!)'")
    try:
        with lab.scenario.applied(only=[spec["name"]]):
            run = run_pyinfra("inventories/lab.py", "deploys/preflight.py", timeout=300)
        text = run.stdout + run.stderr
        assert run.returncode == 0 and "Run lock" not in text, text[-3000:]
        assert lab.ssh(spec, f"test -e {PWNED}").returncode != 0  # nothing written through the symlink
        assert lab.ssh(spec, f"kill -0 {victim.strip()}").returncode == 0  # their process was not killed
        assert root(spec, "stat -c '%U %a %F' /run/modelfleet /run/modelfleet/run.lock "
                          "/run/modelfleet/run.lock.holder").splitlines() == [
            "root 700 directory", "root 600 regular empty file", "root 600 regular file"]
        for plant in ("touch /run/modelfleet/run.lock.holder", f"ln -s {PWNED} /run/modelfleet/x",
                      "mkfifo /run/modelfleet/y"):
            assert lab.ssh(spec, f"{AS_NOBODY} {plant}").returncode != 0, plant
    finally:
        lab.ssh(spec, f"kill {victim.strip()}; rm -f /run/lock/modelfleet.lock /run/lock/modelfleet.lock.holder")


def test_root_installs_a_vendor_deb_without_writing_through_a_planted_tmp_symlink(lab_hosts):
    spec = lab_hosts[1]
    url = f"{lab_apt.BASE}/developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb"
    root(spec, f"rm -f /tmp/modelfleet-cuda-keyring.deb {PWNED}")
    root(spec, f"{AS_NOBODY} ln -s {PWNED} /tmp/modelfleet-cuda-keyring.deb")
    try:
        [command] = repo_package._inner(package="cuda-keyring", url=url, current={})
        done = lab.ssh(spec, command.get_raw_value())
        assert done.returncode == 0, done.stdout + done.stderr
        assert root(spec, "dpkg-query -W -f '${Status}' cuda-keyring") == "install ok installed"
        assert lab.ssh(spec, f"test -e {PWNED}").returncode != 0
        assert root(spec, "readlink /tmp/modelfleet-cuda-keyring.deb").strip() == PWNED
        assert root(spec, "find /tmp -maxdepth 2 -name 'cuda-keyring.deb'") == ""  # its temp directory is gone
    finally:
        lab.ssh(spec, "dpkg --purge cuda-keyring; rm -f /tmp/modelfleet-cuda-keyring.deb")


def test_the_engine_caches_directory_gives_no_setuid_and_no_device(lab_hosts):
    spec = lab_hosts[2]
    caches = f"{spec['model_root']}/.cache-hygiene"
    root(spec, f"mkdir -p {caches}")
    try:
        for command in private_bind._inner(path=caches, mountinfo=root(spec, f"cat {MOUNTINFO}")):
            root(spec, command.get_raw_value())
        # What the next run reads back: the operation then does nothing.
        assert set(FLAGS) <= mount_options(root(spec, f"cat {MOUNTINFO}"), caches)
        assert set(FLAGS) <= set(root(spec, f"findmnt -no OPTIONS --mountpoint {caches}").strip().split(","))
        # What an engine container (root in it) could leave there: a setuid-root program, a node of /dev/zero.
        root(spec, f"cp /usr/bin/id {caches}/id && chmod 4755 {caches}/id && mknod {caches}/zero c 1 5")
        assert root(spec, f"{AS_NOBODY} {caches}/id -u").strip() == "65534"  # not 0: the setuid bit is ignored
        assert lab.ssh(spec, f"head -c1 {caches}/zero").returncode != 0  # nodev: even root cannot open it
        assert f"{caches} {caches} none bind,nosuid,nodev,nofail 0 0" in root(spec, "cat /etc/fstab")
    finally:
        lab.ssh(spec, f"umount {caches}; sed -i '\\#{caches}#d' /etc/fstab; rm -rf {caches}")


def test_the_run_lock_directory_is_private_after_a_boot_that_starts_the_restart_tier(lab_hosts):
    """A restart-tier unit starts at boot, before any run: its RuntimeDirectory lines (as modelfleet renders
    them) leave /run/modelfleet 0700, and the next run takes the run lock."""
    from tests.unit.test_weight_cache import service, weights_unit

    spec = lab_hosts[1]
    lines = [line for line in weights_unit(service()).splitlines() if line.startswith("RuntimeDirectory")]
    unit = "\n".join(["[Service]", *lines, "ExecStart=/bin/sleep infinity", "[Install]",
                      "WantedBy=multi-user.target", ""])
    root(spec, f"printf '%s' '{unit}' > /etc/systemd/system/mf-boot-probe.service && "
               "systemctl enable -q mf-boot-probe && rm -rf /run/modelfleet")
    try:
        before = lab.restarts(spec["name"])
        lab.ssh(spec, "systemctl reboot")
        deadline = time.time() + 180
        while lab.restarts(spec["name"]) == before and time.time() < deadline:
            time.sleep(1)
        lab.wait_ssh(spec, 120)
        while lab.ssh(spec, "systemctl is-active -q mf-boot-probe").returncode != 0 and time.time() < deadline:
            time.sleep(1)
        assert root(spec, "systemctl is-active mf-boot-probe").strip() == "active"  # the unit ran at this boot
        assert root(spec, "stat -c '%U %a' /run/modelfleet").strip() == "root 700"
        with lab.scenario.applied(only=[spec["name"]]):
            run = run_pyinfra("inventories/lab.py", "deploys/preflight.py", timeout=300)
        assert run.returncode == 0 and "Run lock" not in run.stdout + run.stderr, (run.stdout + run.stderr)[-3000:]
    finally:
        lab.ssh(spec, "systemctl disable -q --now mf-boot-probe; rm -f /etc/systemd/system/mf-boot-probe.service")
