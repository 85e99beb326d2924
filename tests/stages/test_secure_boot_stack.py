"""The GPU stack on hosts with UEFI Secure Boot on, through @fake hosts: on Ubuntu `driver_source: auto` takes
Canonical's signed modules for the running kernel (looked up in the archive before anything is installed, held,
no DKMS, no kernel headers); a DKMS driver whose key is not enrolled is refused before anything is installed,
naming the MOK step; an enrolled key, or Secure Boot off, keeps the CUDA repository's driver."""

import pytest

from modelfleet.host.facts.probe import HostProbe
from modelfleet.plan.inventory import resolve
from modelfleet.run.stages import gpu_driver
from tests.stages.test_gpu_driver import (
    DF,
    H200_8,
    KERNELS,
    VERSIONS,
    bare,
    converged_state,
    os_lines,
    stack_only,
)

SIGNED = ["linux-modules-nvidia-580-server-open-6.8.0-87-generic", "linux-modules-nvidia-580-server-open-generic",
          "nvidia-headless-no-dkms-580-server-open", "nvidia-utils-580-server"]
NOT_ENROLLED = ["SECURE_BOOT=SecureBoot enabled", "MOK_DKMS=/var/lib/shim-signed/mok/MOK.der is not enrolled"]


def secure_host(fake, distro="ubuntu2404", sb=NOT_ENROLLED, **data) -> dict:
    host = bare(fake, "nvidia", distro, **data)
    host["fake_responses"]["@@modelfleet-probe"] = fake.probe_reply(
        {"os": os_lines(fake, distro) + sb, "disk": DF, "ports": []})
    return host


def decided(fake, host: dict) -> gpu_driver.DriverPlan:
    data = {k: v for k, v in host.items() if k != "fake_responses"}
    plan = resolve([("n1", data)]).hosts["n1"]
    probe = HostProbe().process(host["fake_responses"]["@@modelfleet-probe"])
    return gpu_driver.decide(plan, probe, {"packages": {}, "paths": {}, "units": {}, "texts": {}})


def test_ubuntu_with_secure_boot_gets_the_signed_modules_looked_up_before_anything_is_installed(fake):
    state = fake.run_fake([("n1", secure_host(fake))], stack_only, dry=True)
    steps = fake.planned(state, "n1")
    text = "\n".join(steps)
    first_install = next(i for i, s in enumerate(steps) if "apt-get" in s and " install " in s)
    assert steps.index("<_in_archive>") < first_install  # nothing is installed before the look-up
    assert "install " + " ".join(SIGNED) in text
    assert "nvidia-driver-580-open" not in text and "nvidia-driver-pinning" not in text
    assert f"linux-headers-{KERNELS['ubuntu2404']}" not in text  # no DKMS: no headers to build against
    assert "apt-mark hold nvidia-headless-no-dkms-580-server-open nvidia-utils-580-server " \
           "linux-modules-nvidia-580-server-open-6.8.0-87-generic linux-modules-nvidia-580-server-open-generic" in text
    assert "systemctl reboot" in text
    # 8x H200: Fabric Manager at the driver's release, from NVIDIA's repository
    assert "cuda-keyring_1.1-1_all.deb" in text
    one_gpu_state = fake.run_fake([("n1", secure_host(fake, gpu_count=1, model="qwen3-8b"))], stack_only, dry=True)
    one_gpu = "\n".join(fake.planned(one_gpu_state, "n1"))
    # the archive's alone
    assert "cuda-keyring_1.1-1_all.deb" not in one_gpu and "install " + " ".join(SIGNED) in one_gpu
    d = decided(fake, secure_host(fake))
    assert d.source == "ubuntu-signed" and "no linux-modules-nvidia-580-server-open-6.8.0-87-generic" in \
        d.signed_refusal and "mokutil --import /var/lib/shim-signed/mok/MOK.der" in d.signed_refusal


@pytest.mark.parametrize("distro,source", [("ubuntu2404", "cuda"), ("debian12", "auto")])
def test_a_dkms_driver_under_secure_boot_is_refused_before_anything_naming_the_mok_step(fake, distro, source):
    host = secure_host(fake, distro, driver_source=source)
    state = fake.run_fake([("n1", host)], stack_only, dry=True)
    steps = "\n".join(fake.planned(state, "n1"))
    assert "<refuse>" in steps and "apt-get" not in steps and "curl" not in steps
    [problem] = decided(fake, host).problems
    assert problem.startswith("secure boot: ") and "mokutil --import /var/lib/shim-signed/mok/MOK.der" in problem
    assert "nvidia-driver-580-open" in problem and "nothing was installed" in problem
    assert ("driver_source: ubuntu-signed" in problem) == (distro == "ubuntu2404")


def test_ubuntu_signed_is_refused_on_another_distribution_naming_the_field(fake):
    [problem] = decided(fake, secure_host(fake, "debian12", driver_source="ubuntu-signed")).problems
    assert problem.startswith("driver_source: ubuntu-signed needs Ubuntu")


@pytest.mark.parametrize("sb", [["SECURE_BOOT=SecureBoot enabled",
                                 "MOK_DKMS=/var/lib/shim-signed/mok/MOK.der is already enrolled"],
                                ["SECURE_BOOT=SecureBoot disabled"], ["SECURE_BOOT=no EFI"]])
def test_an_enrolled_key_or_secure_boot_off_keeps_the_cuda_repository_driver(fake, sb):
    host = secure_host(fake, sb=sb)
    d = decided(fake, host)
    assert d.source == "cuda" and not d.problems and d.builds_module and not d.signed_modules
    steps = "\n".join(fake.planned(fake.run_fake([("n1", host)], stack_only, dry=True), "n1"))
    assert "install nvidia-driver-pinning-580 nvidia-driver-580-open" in steps and "<_in_archive>" not in steps


def test_a_converged_signed_host_gets_no_command_and_keeps_its_holds(fake):
    """The signed packages installed and held, the driver loaded: nothing to send (their holds are read by
    name on every run, so a converged host is not mistaken for one to hold again)."""
    lines, signed = converged_state(), {p: "580.159.04-0ubuntu0.24.04.1" for p in SIGNED}
    for name, version in signed.items():
        lines += [f"@@modelfleet-state package {name}", f"hi  {version}"]
    probe = fake.probe_reply({"os": os_lines(fake, "ubuntu2404") + NOT_ENROLLED, "disk": DF, "ports": [],
                              "nvidia_gpus": H200_8, "nvidia_versions": VERSIONS,
                              "fabric_manager": ["nvswitches=4", "Fabric Manager version is : 580.159.04"]})
    host = {**secure_host(fake), "fake_responses": {"@@modelfleet-probe": probe, "@@modelfleet-state": lines}}
    state = fake.run_fake([("n1", host)], stack_only, dry=True)
    assert fake.planned(state, "n1") == []
