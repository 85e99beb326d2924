"""The GPU stack on the RHEL family through @fake hosts: the same stages, asking the seam, plan dnf and rpm's
commands and .repo files for a Rocky or AlmaLinux host, with no apt anywhere; a pending reboot is needs-restarting's
answer. (Planned, not run: no RHEL host can be reached here.)"""

from __future__ import annotations

import json

import pytest

from modelfleet.host.os import rhel
from tests.helpers.planned_steps import run
from tests.stages.test_gpu_driver import DF, H200_8, VERSIONS, bare

KERNEL = "5.14.0-570.17.1.el9_6.x86_64"
APT = ("apt-get", "apt-mark", "dpkg", "/etc/apt", "sources.list")


@pytest.fixture(autouse=True)
def reports(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    return tmp_path


def os_lines(os_id: str, version: str, arch: str = "x86_64") -> list[str]:
    return [f"ID={os_id}", f'VERSION_ID="{version}"', f"KERNEL_RELEASE={KERNEL}", f"MACHINE_ARCH={arch}"]


def rhel_host(fake, vendor: str, os_id: str = "rocky", version: str = "9.6", **data) -> dict:
    host = bare(fake, vendor, "debian12", **data)
    host["fake_responses"]["@@modelfleet-probe"] = fake.probe_reply(
        {"os": os_lines(os_id, version), "disk": DF, "ports": []})
    return host


def commands(steps: list) -> str:
    return "\n".join(str(c) for _, cmds in steps for c in cmds)


def uploads(steps: list) -> dict[str, str]:
    return {c[0][len("<upload "):-1]: c[1] for _, cmds in steps for c in cmds
            if isinstance(c, list) and c[0].startswith("<upload ")}


def test_a_bare_rocky_9_nvidia_host_gets_dnf_and_repo_files(fake):
    steps, [asked] = run(fake, rhel_host(fake, "nvidia"))
    text, files = commands(steps), uploads(steps)
    assert not [word for word in APT if word in text + "".join(files)]
    assert f"dnf -y -q install ca-certificates curl python3-dnf-plugin-versionlock dnf-utils kernel-devel-{KERNEL}" \
        in text
    assert set(files) == {"/etc/yum.repos.d/cuda-rhel9.repo", "/etc/dnf/modules.d/nvidia-driver.module",
                          "/etc/yum.repos.d/docker-ce.repo", "/etc/yum.repos.d/nvidia-container-toolkit.repo"}
    assert "stream=580-open" in files["/etc/dnf/modules.d/nvidia-driver.module"]
    # each key is fetched and checked against its pin before the .repo file that names it is written
    names = [name for name, _ in steps]
    driver = [names.index(f"modelfleet gpu_driver | {name}") for name in (
        "Signing key /etc/pki/rpm-gpg/cuda.asc", "Vendor source list", "GPU driver packages")]
    assert driver == sorted(driver)
    assert "rhel9/x86_64/D42D0685.pub" in text and "cuda-rpm 610C7B14E068A878070DA4E99CD0A493D42D0685" in text
    assert "dnf -y -q install nvidia-open" in text
    assert "dnf -y -q versionlock add nvidia-open nvidia-fabricmanager-580" in text
    assert "dnf -y -q versionlock add docker-ce docker-ce-cli containerd.io nvidia-container-toolkit" in text
    assert "https://download.docker.com/linux/rhel/gpg" in text
    assert "docker-rpm 060A61C51B558A7F742B77AAC52FEB6B621E9F35" in text
    # no unattended-upgrades file: held packages are version-locked (rhel.upgrades_config)
    assert not [name for name, _ in steps if "Unattended upgrades" in name]
    # DeployedState reads packages with rpm and asks the reboot question with needs-restarting
    assert "reboot=host" in asked["asks"]
    assert any(f.startswith("package_state() { v=$(rpm -q --qf") for f in asked["functions"])
    assert any(f.startswith("reboot_needed() { if command -v needs-restarting") for f in asked["functions"])


def test_rhel_10_takes_no_versionlock_plugin_and_no_module_stream(fake):
    steps, _ = run(fake, rhel_host(fake, "nvidia", "almalinux", "10.0"))
    text, files = commands(steps), uploads(steps)
    assert f"dnf -y -q install ca-certificates curl kernel-devel-{KERNEL}" in text
    assert "/etc/yum.repos.d/cuda-rhel10.repo" in files and not [f for f in files if "modules.d" in f]


def test_a_bare_rocky_amd_host_gets_amds_el_repositories(fake):
    steps, _ = run(fake, rhel_host(fake, "amd"))
    files = uploads(steps)
    assert "https://repo.radeon.com/amdgpu/7.0/el/9.6/main/x86_64/" in files["/etc/yum.repos.d/amdgpu.repo"]
    assert "https://repo.radeon.com/rocm/el9/7.0/main" in files["/etc/yum.repos.d/rocm.repo"]
    assert "dnf -y -q install amdgpu-dkms rocm" in commands(steps)


def converged(reboot: bool) -> list[str]:
    """A Rocky host with the stack's packages in place, as DeployedState's program answers (its own line format),
    needs-restarting's answer as given."""
    installed = {"ca-certificates": "1-1", "curl": "1-1", "python3-dnf-plugin-versionlock": "1-1", "dnf-utils": "1-1",
                 "nvidia-open": "3:580.159.04-1.el9", "nvidia-fabricmanager-580": "580.159.04-1",
                 "docker-ce": "3:28.5.1-1.el9", "docker-ce-cli": "1:28.5.1-1.el9", "containerd.io": "1-1",
                 "docker-buildx-plugin": "1-1", "docker-compose-plugin": "1-1", "nvidia-container-toolkit": "1-1"}
    held = {"nvidia-open", "nvidia-fabricmanager-580", "docker-ce", "docker-ce-cli", "containerd.io",
            "nvidia-container-toolkit"}
    lines = []
    for name, version in installed.items():
        lines += [f"@@modelfleet-state package {name}", f"{'h' if name in held else 'i'}i {version}"]
    for path in ("/etc/yum.repos.d/docker-ce.repo", "/etc/yum.repos.d/nvidia-container-toolkit.repo",
                 "/etc/pki/rpm-gpg/docker.asc", "/etc/pki/rpm-gpg/nvidia-container-toolkit.asc",
                 "/etc/cdi/nvidia.yaml"):
        lines += [f"@@modelfleet-state path {path}", "file 644 root root " + "0" * 64]
    lines += ["@@modelfleet-state unit docker.service", "ActiveState=active", "UnitFileState=enabled",
              "@@modelfleet-state text /etc/docker/daemon.json",
              '= {"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}, "features": {"cdi": true}}',
              "@@modelfleet-state reboot host", *(["needed"] if reboot else [])]
    return lines


@pytest.mark.parametrize("reboot", [True, False])
def test_a_pending_reboot_is_needs_restartings_answer(fake, reports, reboot):
    probe = fake.probe_reply({"os": os_lines("rocky", "9.6"), "disk": DF, "ports": [], "nvidia_gpus": H200_8,
                              "nvidia_versions": VERSIONS,
                              "fabric_manager": ["nvswitches=4", "Fabric Manager version is : 580.159.04"]})
    host = {"hardware": "h200", "gpu_count": 8, "model": "kimi-k2-thinking", "engine": "vllm", "pool": "p",
            "revision": "e" * 40, "fake_responses": {"@@modelfleet-probe": probe,
                                                     "@@modelfleet-state": converged(reboot)}}
    run(fake, host, dry=False)
    report = json.loads(next((reports / "gpu_stack").glob("*.json")).read_text())
    assert report["kernel_update_pending"] is reboot
    assert report["vendor"] == "nvidia" and "nvidia-open" not in report["packages_installed"]
    assert rhel.reboot_asks() == {"reboots": ["host"]}
