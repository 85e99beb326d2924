"""Bare-metal rebuild on the lab: hosts with GPUs (recorded personas) but no driver, Docker or toolkit get them
from the lab's signed apt repositories through deploys/gpu_stack.py, with real apt, dpkg, systemd and reboots."""

import json
import os

import pytest

import lab
from lab.rebuild import rehearse
from modelfleet import REPO_ROOT
from modelfleet.base.commands import run_pyinfra

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def rebuilt(lab_hosts, tmp_path_factory):
    """Three bare hosts join the session's lab: an H200 (no NVSwitch in a 1-GPU host), an 8x B300 (NVSwitch) and
    an 8x MI355X. The H200 first runs with `--data reboot=false`; the B300 is built, then its Fabric Manager
    skewed."""
    personas = [s["persona"] for s in lab_hosts] + ["h200x1-bare", "b300x8-bare", "mi355x8-bare"]
    specs = lab.up(len(personas), personas=personas, disks=1)
    bare, skewed = specs[-3:], specs[-2]["name"]
    reports = tmp_path_factory.mktemp("reports")
    env = {**os.environ, "MODELFLEET_REPORTS": str(reports / "no-reboot")}
    with lab.scenario.applied(only=[bare[0]["name"]]):
        no_reboot = run_pyinfra("inventories/lab.py", "deploys/gpu_stack.py", extra=["--data", "reboot=false"],
                                cwd=REPO_ROOT, env=env, timeout=600)
    pending = json.loads((reports / "no-reboot" / "gpu_stack" / f"{bare[0]['name']}.json").read_text())
    smi_pending = lab.ssh(bare[0], "nvidia-smi -L")
    rows = {row["host"]: row for row in rehearse(bare, skewed=skewed, reports=reports)}
    others = {s["name"]: lab.restarts(s["name"]) for s in lab_hosts}
    yield {"rows": rows, "bare": bare, "skewed": skewed, "no_reboot": no_reboot, "pending": pending,
           "smi_pending": smi_pending, "others": others}
    lab.remove([s["name"] for s in bare])


def test_no_reboot_records_pending_and_leaves_the_module_unloaded(rebuilt):
    assert rebuilt["no_reboot"].returncode == 0, rebuilt["no_reboot"].stdout[-3000:]
    assert rebuilt["pending"]["reboot"] == {"needed": True, "taken": False, "pending": True,
                                            "reason": "driver branch 580 installed, no driver loaded"}
    assert {"cuda-keyring", "nvidia-driver-pinning-580", "nvidia-driver-580-open", "docker-ce",
            "nvidia-container-toolkit"} <= set(rebuilt["pending"]["packages_installed"])
    assert "nvidia-fabricmanager-580" not in rebuilt["pending"]["packages_installed"]  # 1 GPU: no NVSwitch seen
    assert not rebuilt["pending"]["cdi_generated"]  # nvidia-ctk needs the loaded driver: next run
    assert rebuilt["smi_pending"].returncode == 9 and "couldn't communicate with the NVIDIA driver" in \
        rebuilt["smi_pending"].stdout


def test_bare_host_converges_with_one_reboot_of_that_host_only(rebuilt):
    # The packages came with the --no-reboot run; this run takes the pending reboot and nothing else installs.
    h200 = rebuilt["rows"][rebuilt["bare"][0]["name"]]
    assert h200["first_run_ok"] and h200["reboots_taken"] == 1, h200
    assert h200["reboot_reason"] == "driver 580.159.04 installed, no driver loaded"
    assert h200["packages_installed"] == []
    assert not h200["preflight_before"]["ok"] and h200["preflight_after"]["ok"]
    assert h200["answers_after"]["driver"] == "580.159.04"
    assert set(rebuilt["others"].values()) == {0}, rebuilt["others"]  # the pre-built hosts never rebooted
    daemon = lab.ssh(rebuilt["bare"][0], "cat /etc/docker/daemon.json; test -s /etc/cdi/nvidia.yaml && echo cdi")
    assert json.loads(daemon.stdout.rsplit("}", 1)[0] + "}")["runtimes"]["nvidia"]["path"] == \
        "nvidia-container-runtime"
    assert daemon.stdout.strip().endswith("cdi")


def test_dry_run_lists_exactly_the_operations_the_real_run_changes(rebuilt):
    truth = next(iter(rebuilt["rows"].values()))["dry_run_vs_first_run"]
    assert truth["matches"], truth


def test_second_run_changes_nothing_and_does_not_reboot(rebuilt):
    for row in rebuilt["rows"].values():
        assert row["second_run"] == {"ok": True, "changed_operations_all_hosts": 0, "reboots": 0}, row


def test_nvswitch_host_gets_fabric_manager_at_the_drivers_exact_version_and_skew_is_caught(rebuilt):
    b300 = rebuilt["rows"][rebuilt["skewed"]]
    # Built once, then Fabric Manager moved to 580.95.05 by hand: preflight refuses with the 802 explanation,
    # gpu_stack.py puts it back at the driver's version and restarts it, without a reboot.
    assert b300["skewed_fabric_manager_before"]
    assert "CUDA error 802" in "\n".join(b300["preflight_before"]["problems"])
    assert b300["packages_installed"] == ["nvidia-fabricmanager-580"] and b300["reboots_taken"] == 0
    assert b300["answers_after"]["fabric_manager"] == b300["answers_after"]["driver"] == "580.159.04"
    assert "nvidia-fabricmanager-580" in b300["answers_after"]["held"]
    assert b300["preflight_after"] == {"ok": True, "problems": []}
    assert lab.ssh(rebuilt["bare"][1], "systemctl is-active nvidia-fabricmanager").stdout.strip() == "active"


def test_amd_host_gets_rocm_through_amdgpu_install_with_one_reboot(rebuilt):
    mi355x = rebuilt["rows"][rebuilt["bare"][2]["name"]]
    assert mi355x["reboots_taken"] == 1 and mi355x["reboot_reason"] == "amdgpu-dkms installed (new kernel module)"
    assert {"amdgpu-install", "amdgpu-dkms", "rocm", "docker-ce"} <= set(mi355x["packages_installed"])
    assert not {p for p in mi355x["packages_installed"] if "nvidia" in p or "cuda" in p}
    assert mi355x["answers_after"]["amd_gpus"] == 8
    assert not mi355x["preflight_before"]["ok"] and mi355x["preflight_after"]["ok"]
    groups = lab.ssh(rebuilt["bare"][2], "id -nG root").stdout.split()
    assert {"render", "video"} <= set(groups)


def test_rebuilt_host_serves_with_the_same_command(rebuilt, scenario):
    """serve.py on the rebuilt H200: the stack is converged (no change, no reboot), the serving stages run on the
    Docker and runtime the stack installed, and the endpoint answers."""
    spec = rebuilt["bare"][0]
    scenario(only=[spec["name"]])
    served = run_pyinfra("inventories/lab.py", "deploys/serve.py", cwd=REPO_ROOT, timeout=600)
    assert served.returncode == 0, served.stdout[-4000:] + served.stderr[-2000:]
    assert lab.restarts(spec["name"]) == 1  # still the one reboot of the rebuild
    models = lab.ssh(spec, f"curl -fsS http://{spec['address']}:8000/v1/models")
    assert "tiny-lab" in models.stdout, models.stdout + models.stderr


def test_apt_get_upgrade_leaves_the_gpu_stack_where_modelfleet_put_it(rebuilt):
    """A newer driver release appears upstream (the lab repository publishes one); a routine `apt-get upgrade`
    on the converged host sees it and moves no package of the GPU stack (#17: holds)."""
    spec = rebuilt["bare"][0]
    stack = "nvidia-driver-580-open nvidia-driver-pinning-580 nvidia-container-toolkit docker-ce"
    versions = f"dpkg-query -W -f='${{Package}}=${{Version}}\\n' {stack}"
    before = lab.ssh(spec, versions).stdout
    lab.apt.build(lab.STATE, lab.LAB_DIR, newer={"nvidia-driver-580-open": ["580.200.01-1"]})
    try:
        upgraded = lab.ssh(spec, "apt-get update -q >/dev/null && apt list --upgradable 2>/dev/null; "
                                 "DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -q", timeout_s=300)
        assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
        assert "nvidia-driver-580-open/" in upgraded.stdout and "580.200.01-1" in upgraded.stdout  # seen...
        assert "kept back" in upgraded.stdout or "held" in upgraded.stdout.lower()
        assert lab.ssh(spec, versions).stdout == before  # ...and not taken
        assert "nvidia-driver-580-open=580.159.04-1" in before
    finally:
        lab.apt.build(lab.STATE, lab.LAB_DIR)  # the release withdrawn: later tests see the usual repository
