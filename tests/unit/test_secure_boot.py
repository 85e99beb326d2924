"""Where the NVIDIA module comes from (modelfleet.host.secure_boot): `auto` picks Canonical's signed modules only on
Ubuntu with Secure Boot on and DKMS's key not enrolled; the package names follow the branch, the open or
proprietary modules, the running kernel and its flavour; a DKMS module is a problem only where it would be
rejected."""

import pytest

from modelfleet.host import secure_boot

UBUNTU_SB = {"id": "ubuntu", "secure_boot": "enabled", "dkms_key_enrolled": False, "kernel": "6.8.0-1015-aws",
             "kernel_flavour": "aws", "pretty_name": "Ubuntu 24.04.3 LTS"}


@pytest.mark.parametrize("os_info,source", [
    (UBUNTU_SB, "ubuntu-signed"),
    ({**UBUNTU_SB, "dkms_key_enrolled": True}, "cuda"),
    ({**UBUNTU_SB, "secure_boot": "disabled"}, "cuda"),
    ({**UBUNTU_SB, "secure_boot": None}, "cuda"),  # unknown: as before, the CUDA repository
    ({**UBUNTU_SB, "id": "debian"}, "cuda"),
])
def test_auto_takes_the_signed_modules_only_where_dkms_would_be_rejected(os_info, source):
    assert secure_boot.driver_source("auto", os_info) == source
    assert secure_boot.driver_source("cuda", os_info) == "cuda"


def test_package_names_follow_branch_modules_kernel_and_flavour():
    driver, problem = secure_boot.signed_driver(580, True, UBUNTU_SB)
    assert problem is None
    assert (driver.modules, driver.modules_flavour, driver.userspace, driver.utils) == (
        "linux-modules-nvidia-580-server-open-6.8.0-1015-aws", "linux-modules-nvidia-580-server-open-aws",
        "nvidia-headless-no-dkms-580-server-open", "nvidia-utils-580-server")
    proprietary, _ = secure_boot.signed_driver(570, False, {**UBUNTU_SB, "kernel": "6.8.0-87-generic-64k",
                                                            "kernel_flavour": "generic-64k"})
    assert proprietary.modules == "linux-modules-nvidia-570-server-6.8.0-87-generic-64k"
    assert proprietary.userspace == "nvidia-headless-no-dkms-570-server"


def test_no_signed_modules_without_ubuntu_or_a_flavoured_kernel():
    assert secure_boot.signed_driver(580, True, {**UBUNTU_SB, "id": "debian"})[1].startswith(
        "driver_source: ubuntu-signed needs Ubuntu")
    driver, problem = secure_boot.signed_driver(580, True, {**UBUNTU_SB, "kernel_flavour": None})
    assert driver is None and "6.8.0-1015-aws" in problem


def test_dkms_is_a_problem_only_under_secure_boot_without_the_key():
    assert secure_boot.dkms_problem({**UBUNTU_SB, "dkms_key_enrolled": True}, "nvidia-driver-580-open") is None
    assert secure_boot.dkms_problem({**UBUNTU_SB, "secure_boot": "no-efi"}, "amdgpu-dkms") is None
    amd = secure_boot.dkms_problem({**UBUNTU_SB, "id": "ubuntu"}, "amdgpu-dkms")
    assert "amdgpu-dkms builds its kernel module with DKMS" in amd and "ubuntu-signed" not in amd
