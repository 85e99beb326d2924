"""GPU host stack stages through @fake hosts: what a dry run of a bare host lists on each distribution and
vendor, what a converged host gets (nothing), and the refusals (newer driver, unknown OS)."""

import hashlib
import json

import pytest

from modelfleet.host.os import debian  # noqa: E402
from modelfleet.run.pipeline import run_stages  # noqa: E402
from modelfleet.run.stages import gpu_driver, gpu_stack, preflight  # noqa: E402


def stack_only():
    """deploys/gpu_stack.py's pipeline (the run lock and pins belong to the real connectors' entry points)."""
    run_stages(preflight, gpu_stack)

KERNELS = {"ubuntu2204": "5.15.0-140-generic", "ubuntu2404": "6.8.0-87-generic", "debian12": "6.1.0-40-amd64"}
OS_RELEASE = {
    "ubuntu2204": ['PRETTY_NAME="Ubuntu 22.04.5 LTS"', "ID=ubuntu", 'VERSION_ID="22.04"', "VERSION_CODENAME=jammy"],
    "ubuntu2404": None,  # the recorded H200 host's
    "debian12": ['PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"', "ID=debian", 'VERSION_ID="12"',
                 "VERSION_CODENAME=bookworm"],
}
DF = ["Filesystem 1-blocks Used Available Capacity Mounted on",
      "/dev/md0 30000000000000 1000000000 29000000000000 1% /srv"]
HOSTS = {"nvidia": {"hardware": "h200", "gpu_count": 8, "model": "kimi-k2-thinking", "engine": "vllm"},
         "amd": {"hardware": "mi355x", "gpu_count": 8, "model": "kimi-k3", "engine": "vllm"}}
H200_8 = [f"{i}, NVIDIA H200, GPU-{i}, 00000000:{i:02X}:00.0, 143771 MiB, 580.159.04, 9.0" for i in range(8)]
VERSIONS = ["NVIDIA-SMI version  : 580.159.04", "DRIVER version      : 580.159.04", "CUDA Version        : 13.0"]


@pytest.fixture(autouse=True)
def reports(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    return tmp_path


def os_lines(fake, distro: str, arch: str = "x86_64") -> list[str]:
    release = OS_RELEASE[distro] or fake.recorded(fake.H200 / "os-release.txt")
    return release + [f"KERNEL_RELEASE={KERNELS[distro]}", f"MACHINE_ARCH={arch}"]


def bare(fake, vendor: str, distro: str, **data) -> dict:
    probe = fake.probe_reply({"os": os_lines(fake, distro), "disk": DF, "ports": []})
    return {**HOSTS[vendor], "pool": "p", "revision": "e" * 40, **data,
            "fake_responses": {"@@modelfleet-probe": probe}}


@pytest.mark.parametrize("distro", ["ubuntu2204", "ubuntu2404", "debian12"])
def test_dry_run_of_a_bare_nvidia_host_lists_repository_packages_reboot_and_runtime(fake, distro):
    state = fake.run_fake([("n1", bare(fake, "nvidia", distro))], stack_only, dry=True)
    steps = "\n".join(fake.planned(state, "n1"))
    repo = f"https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/"
    assert f'd=$(mktemp -d) && {{ curl -fsSL --retry 3 -o "$d"/cuda-keyring.deb {repo}cuda-keyring_1.1-1_all.deb' \
        in steps
    assert f"linux-headers-{KERNELS[distro]}" in steps
    assert "install nvidia-driver-pinning-580 nvidia-driver-580-open" in steps
    # 8x H200 is an NVSwitch board: Fabric Manager at the version of the driver this run installs, held.
    assert "nvidia-fabricmanager-580=\"$v-*\"" in steps
    # held, driver included (the pinning package pins the branch, not the release), and so is the runtime
    assert "apt-mark hold nvidia-driver-580-open nvidia-fabricmanager-580" in steps
    assert "apt-mark hold docker-ce docker-ce-cli containerd.io nvidia-container-toolkit" in steps
    assert "<upload /etc/apt/apt.conf.d/51modelfleet-unattended-upgrades>" in fake.planned(state, "n1")
    assert "systemctl enable nvidia-persistenced.service" in steps
    assert "<capture>" in steps and "systemctl reboot" in steps and "<wait>" in steps
    docker = "https://download.docker.com/linux/" + distro.rstrip("0123456789")
    assert f"{docker}/gpg" in steps
    assert "install docker-ce docker-ce-cli containerd.io docker-buildx-plugin docker-compose-plugin " \
           "nvidia-container-toolkit" in steps
    assert "nvidia-ctk runtime configure --runtime=docker --cdi.enabled --config=/etc/docker/daemon.json" in steps
    assert "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml" in steps
    # daemon.json is configured before Docker's first start: a start, no restart
    assert "systemctl start docker.service" in steps and "systemctl restart docker.service" not in steps
    assert ("docker run --rm --device nvidia.com/gpu=all nvcr.io/nvidia/cuda:13.0.2-base-ubuntu24.04 nvidia-smi -L"
            in steps)
    # the steps come in dependency order: repository, driver, reboot, runtime, container check
    order = [steps.index(s) for s in ("cuda-keyring_1.1-1_all.deb", "nvidia-driver-580-open", "systemctl reboot",
                                      "nvidia-container-toolkit", "nvidia.com/gpu=all")]
    assert order == sorted(order)
    assert {f"<upload /etc/apt/sources.list.d/{name}.list>" for name in
            (f"cuda-{distro}-x86_64", "docker", "nvidia-container-toolkit")} <= set(fake.planned(state, "n1"))


@pytest.mark.parametrize("distro", ["ubuntu2204", "ubuntu2404", "debian12"])
def test_dry_run_of_a_bare_amd_host_lists_amdgpu_install_rocm_groups_and_reboot(fake, distro):
    state = fake.run_fake([("a1", bare(fake, "amd", distro))], stack_only, dry=True)
    steps = "\n".join(fake.planned(state, "a1"))
    codename = {"ubuntu2204": "jammy", "ubuntu2404": "noble", "debian12": "jammy"}[distro]
    assert (f"https://repo.radeon.com/amdgpu-install/7.0/ubuntu/{codename}/amdgpu-install_7.0.70000-1_all.deb"
            in steps)
    assert "install amdgpu-dkms rocm" in steps
    assert {"<upload /etc/apt/sources.list.d/amdgpu.list>", "<upload /etc/apt/sources.list.d/rocm.list>"} <= \
        set(fake.planned(state, "a1"))
    assert "usermod -a -G render,video root" in steps
    assert "systemctl reboot" in steps
    assert "nvidia" not in steps.replace("nvidia-smi", "")  # no NVIDIA repository, toolkit or runtime
    assert "install docker-ce" in steps
    assert "--device /dev/kfd --device /dev/dri" in steps


def test_no_reboot_records_pending_and_aarch64_uses_sbsa(fake, reports):
    host = bare(fake, "nvidia", "ubuntu2404", reboot=False)
    host["fake_responses"]["@@modelfleet-probe"] = fake.probe_reply({"os": os_lines(fake, "ubuntu2404", "aarch64"),
                                                                "disk": DF, "ports": []})
    state = fake.run_fake([("n1", host)], stack_only, dry=True)
    steps = "\n".join(fake.planned(state, "n1"))
    assert "/ubuntu2404/sbsa/cuda-keyring_1.1-1_all.deb" in steps
    assert "systemctl reboot" not in steps and "nvidia-container-toolkit" in steps
    assert "nvidia.com/gpu=all" not in steps  # the driver is not loaded until the reboot


SOURCES = {
    "/etc/apt/sources.list.d/cuda-ubuntu2404-x86_64.list": "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring"
    ".gpg] https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/ /\n",
    "/etc/apt/sources.list.d/docker.list": "deb [arch=amd64 signed-by=/etc/apt/keyrings/docker.asc] "
    "https://download.docker.com/linux/ubuntu noble stable\n",
    "/etc/apt/sources.list.d/nvidia-container-toolkit.list": "deb [signed-by=/etc/apt/keyrings/nvidia-container-"
    "toolkit.asc] https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n",
}


def converged_state(fm_version="580.159.04") -> list[str]:
    installed = {"ca-certificates": "1", "curl": "1", f"linux-headers-{KERNELS['ubuntu2404']}": "1",
                 "cuda-keyring": "1.1-1", "nvidia-driver-580-open": "580.159.04-1",
                 "nvidia-fabricmanager-580": f"{fm_version}-1", "docker-ce": "5:28.5.1-1", "docker-ce-cli": "1",
                 "containerd.io": "1", "docker-buildx-plugin": "1", "docker-compose-plugin": "1",
                 "nvidia-container-toolkit": "1.18.1-1"}
    held = {"nvidia-fabricmanager-580", "nvidia-driver-580-open", "docker-ce", "docker-ce-cli", "containerd.io",
            "nvidia-container-toolkit"}
    lines = []
    for name, version in installed.items():
        lines += [f"@@modelfleet-state package {name}", f"{'h' if name in held else 'i'}i  {version}"]
    lines += ["@@modelfleet-state path /run/reboot-required", "file 644 root root " + "1" * 64,
              "@@modelfleet-state path /etc/apt/keyrings/docker.asc", "file 644 root root " + "0" * 64,
              "@@modelfleet-state path /etc/apt/keyrings/nvidia-container-toolkit.asc",
              "file 644 root root " + "0" * 64,
              "@@modelfleet-state path /etc/cdi/nvidia.yaml", "file 644 root root " + "0" * 64,
              f"@@modelfleet-state path {debian.UPGRADES_CONF}",
              "file 644 root root " + hashlib.sha256(debian.upgrades_conf().encode()).hexdigest(),
              *[x for path, text in SOURCES.items() for x in (
                  f"@@modelfleet-state path {path}",
                  f"file 644 root root {hashlib.sha256(text.encode()).hexdigest()}")],
              "@@modelfleet-state text /etc/docker/daemon.json",
              "= {", '=     "runtimes": {"nvidia": {}},', '=     "features": {"cdi": true}', "= }"]
    for unit in ("nvidia-persistenced.service", "nvidia-fabricmanager.service", "docker.service"):
        lines += [f"@@modelfleet-state unit {unit}", "ActiveState=active", "UnitFileState=enabled"]
    return lines


def loaded_probe(fake, fm_version="580.159.04"):
    return fake.probe_reply({"os": os_lines(fake, "ubuntu2404"), "disk": DF, "ports": [], "nvidia_gpus": H200_8,
                        "nvidia_versions": VERSIONS,
                        "fabric_manager": ["nvswitches=4", f"Fabric Manager version is : {fm_version}"]})


def test_host_with_the_wanted_driver_loaded_skips_the_driver_and_reboot(fake, reports, monkeypatch):
    host = {**HOSTS["nvidia"], "pool": "p", "revision": "e" * 40, "driver_pinning": False,
            "fake_responses": {"@@modelfleet-probe": loaded_probe(fake), "@@modelfleet-state": converged_state()}}
    state = fake.run_fake([("n1", host)], stack_only, dry=True)
    # Nothing is sent to the host, and the report (true before the run) says so once the run executed:
    # a dry run writes no report.
    assert fake.planned(state, "n1") == []
    assert not (reports / "gpu_stack").exists() and not (reports / "preflight").exists()
    fake.finish(state)
    report = json.loads((reports / "gpu_stack" / "_fake_n1.json").read_text())
    assert report["changes"] is False and report["packages_installed"] == [] and not report["reboot"]["needed"]
    assert report["kernel_update_pending"] is True  # reported, not a reason to reboot a serving node


def test_fabric_manager_skew_is_fixed_at_the_loaded_drivers_version_without_reboot(fake):
    host = {**HOSTS["nvidia"], "pool": "p", "revision": "e" * 40,
            "fake_responses": {"@@modelfleet-probe": loaded_probe(fake, "580.95.05"),
                               "@@modelfleet-state": converged_state("580.95.05")}}
    state = fake.run_fake([("n1", host)], stack_only, dry=True)
    steps = "\n".join(fake.planned(state, "n1"))
    assert "--allow-downgrades --allow-change-held-packages 'nvidia-fabricmanager-580=580.159.04-*'" in steps
    assert "systemctl restart nvidia-fabricmanager.service" in steps
    assert "systemctl reboot" not in steps
    assert "nv-fabricmanager --version" in steps  # the post-change check compares it with the driver


def test_newer_loaded_driver_is_refused_unless_downgrade_is_allowed(fake, reports):
    newer = fake.probe_reply({"os": os_lines(fake, "ubuntu2404"), "disk": DF, "ports": [], "nvidia_gpus": H200_8,
                         "nvidia_versions": ["DRIVER version      : 590.44.01", "CUDA Version        : 13.1"]})
    host = {**HOSTS["nvidia"], "pool": "p", "revision": "e" * 40, "fake_responses": {"@@modelfleet-probe": newer}}
    state = fake.run_fake([("n1", host)], stack_only, dry=True)
    steps = "\n".join(fake.planned(state, "n1"))
    assert "<refuse>" in steps and "apt-get" not in steps
    host["driver_allow_downgrade"] = True
    state = fake.run_fake([("n1", host)], stack_only, dry=True)
    steps = "\n".join(fake.planned(state, "n1"))
    assert "install nvidia-driver-pinning-580 nvidia-driver-580-open" in steps and "systemctl reboot" in steps


def test_preflight_alone_refuses_fabric_manager_skew_that_the_stack_would_fix(fake, reports):
    from modelfleet.host.facts.probe import HostProbe
    from modelfleet.plan.inventory import resolve
    plan = resolve([("n1", {**HOSTS["nvidia"], "pool": "p", "revision": "e" * 40})]).hosts["n1"]
    probe = HostProbe().process(loaded_probe(fake, "580.95.05"))
    alone = preflight.evaluate(plan, probe)
    assert not alone["ok"] and "CUDA error 802" in "\n".join(alone["problems"])
    staged = preflight.evaluate(plan, probe, defer_stack=True)
    assert staged["ok"] and "CUDA error 802" in "\n".join(staged["deferred"])
    assert json.dumps(staged)  # the report stays JSON


def test_unsupported_os_is_refused_naming_the_field(fake):
    host = bare(fake, "nvidia", "debian12")
    # Rocky Linux 8: its family (rhel) is known, the release is not one the stack installs on
    host["fake_responses"]["@@modelfleet-probe"] = fake.probe_reply({"os": ["ID=rocky", 'VERSION_ID="8.10"',
                                                                       "MACHINE_ARCH=x86_64"], "disk": DF})
    state = fake.run_fake([("n1", host)], stack_only, dry=True)
    assert "<refuse>" in fake.planned(state, "n1")


def test_distribution_docker_takes_no_docker_repository(fake):
    state = fake.run_fake([("n1", bare(fake, "nvidia", "debian12", docker_source="distro"))], stack_only, dry=True)
    steps = "\n".join(fake.planned(state, "n1"))
    assert "download.docker.com" not in steps and "docker-ce" not in steps
    assert "install docker.io nvidia-container-toolkit" in steps


def test_a_new_driver_version_installs_that_release_with_fabric_manager_and_reboots(fake):
    """driver_version moves a converged 580.159.04 host to another release of the branch: the driver at that
    version (a held package, maybe older), Fabric Manager at the same version, one reboot, the check wants it."""
    host = {**HOSTS["nvidia"], "pool": "p", "revision": "e" * 40, "driver_version": "580.95.05",
            "fake_responses": {"@@modelfleet-probe": loaded_probe(fake), "@@modelfleet-state": converged_state()}}
    state = fake.run_fake([("n1", host)], stack_only, dry=True)
    steps = "\n".join(fake.planned(state, "n1"))
    assert "--allow-downgrades --allow-change-held-packages nvidia-driver-pinning-580 " \
        "'nvidia-driver-580-open=580.95.05-*'" in steps
    assert "--allow-downgrades --allow-change-held-packages 'nvidia-fabricmanager-580=580.95.05-*'" in steps
    assert steps.count("systemctl reboot") == 1
    from modelfleet.plan.inventory import resolve
    plan = resolve([("n1", {k: v for k, v in host.items() if k != "fake_responses"})]).hosts["n1"]
    assert "gpu_stack_check 8 580.95.05 fabric" in gpu_driver.stack_check_script(plan, fabric=True)  # after the reboot
    host["driver_version"] = "580.159.04"  # the loaded release: nothing to do
    state = fake.run_fake([("n1", host)], stack_only, dry=True)
    assert not [s for s in fake.planned(state, "n1") if "apt-get" in s or "reboot" in s]


def test_admission_after_a_driver_change_reads_the_gpus_after_the_stack_not_before(fake):
    """A bare host: preflight's read saw no driver, so admission judges at execution, after the reboot."""
    from modelfleet.run.stages import admission

    host = bare(fake, "nvidia", "ubuntu2404")
    state = fake.run_fake([("n1", host)], lambda: run_stages(preflight, gpu_stack,
                                                        admission), dry=True)
    steps = fake.planned(state, "n1")
    assert "<_judged_now>" in steps and "<refuse>" not in steps
    assert steps.index("<_judged_now>") > next(i for i, s in enumerate(steps) if "systemctl reboot" in s)
