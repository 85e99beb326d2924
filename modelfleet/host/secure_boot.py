"""Where the NVIDIA kernel module comes from, and whether it will load under UEFI Secure Boot.

With Secure Boot on, the kernel loads only modules signed by a key it trusts. A module DKMS builds on the host
is signed with DKMS's own key (a MOK), trusted only once someone enrolls it at the console (mokutil --import,
reboot, confirm in the MOK manager): without that the run installs, reboots and the driver does not load (`Key
was rejected by service`). Canonical builds and signs the open modules for each Ubuntu kernel it ships
(linux-modules-nvidia-<branch>-server-open-<kernel release>, and -<flavour> that follows the flavour's kernels;
userspace without DKMS: nvidia-headless-no-dkms-<branch>-server-open, nvidia-utils-<branch>-server; names from
packages.ubuntu.com, source package linux-restricted-modules and nvidia-graphics-drivers-<branch>-server).
The same packages NVIDIA's GPU Operator uses for its precompiled, signed drivers.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelfleet.host.facts.host import DKMS_MOK

SOURCES = ("auto", "cuda", "ubuntu-signed")


def driver_source(setting: str, os_info: dict) -> str:
    """`auto`: Canonical's signed modules on Ubuntu with Secure Boot on and DKMS's key not enrolled; else the CUDA
    repository's DKMS driver (what modelfleet always installed)."""
    if setting != "auto":
        return setting
    if (os_info.get("id") == "ubuntu" and os_info.get("secure_boot") == "enabled"
            and not os_info.get("dkms_key_enrolled")):
        return "ubuntu-signed"
    return "cuda"


@dataclass(frozen=True)
class SignedDriver:
    """Canonical's packages for branch `branch` on kernel `kernel` (uname -r) of flavour `flavour`."""

    branch: int
    open: bool
    kernel: str
    flavour: str

    @property
    def _server(self) -> str:
        return f"{self.branch}-server" + ("-open" if self.open else "")

    @property
    def modules(self) -> str:
        """The signed module for the running kernel: it must exist before anything is installed."""
        return f"linux-modules-nvidia-{self._server}-{self.kernel}"

    @property
    def modules_flavour(self) -> str:
        return f"linux-modules-nvidia-{self._server}-{self.flavour}"

    @property
    def userspace(self) -> str:
        return f"nvidia-headless-no-dkms-{self._server}"

    @property
    def utils(self) -> str:
        return f"nvidia-utils-{self.branch}-server"


def signed_driver(branch: int, open_modules: bool, os_info: dict) -> tuple[SignedDriver | None, str | None]:
    """(the packages, None) or (None, why this host cannot take them)."""
    if os_info.get("id") != "ubuntu":
        return None, (f"driver_source: ubuntu-signed needs Ubuntu; {os_info.get('pretty_name') or 'this host'} "
                      "runs another distribution (set driver_source: cuda)")
    if not os_info.get("kernel") or not os_info.get("kernel_flavour"):
        return None, (f"driver_source: the running kernel {os_info.get('kernel') or '(unknown)'} is not an Ubuntu "
                      "kernel with a flavour (e.g. 6.8.0-87-generic): no signed NVIDIA modules are named for it")
    return SignedDriver(branch, open_modules, os_info["kernel"], os_info["kernel_flavour"]), None


def mok_step() -> str:
    return f"`mokutil --import {DKMS_MOK}`, reboot, confirm in the MOK manager at the console"


def dkms_problem(os_info: dict, package: str) -> str | None:
    """Why a DKMS-built module would not load here, or None."""
    if os_info.get("secure_boot") != "enabled" or os_info.get("dkms_key_enrolled"):
        return None
    other = (" or set driver_source: ubuntu-signed (Canonical's signed modules)"
             if os_info.get("id") == "ubuntu" and "nvidia" in package else "")
    return (f"secure boot: Secure Boot is on and {package} builds its kernel module with DKMS, whose key "
            f"({DKMS_MOK}) is not enrolled: the kernel would reject the module at boot. Enroll it first "
            f"({mok_step()}){other}; nothing was installed")


def no_signed_package(driver: SignedDriver) -> str:
    return (f"secure boot: Secure Boot is on and the archive has no {driver.modules} (Canonical's signed NVIDIA "
            f"module for the running kernel {driver.kernel}); a DKMS-built module would be rejected until its key "
            f"is enrolled ({mok_step()}; then set driver_source: cuda), or boot a kernel Canonical signs modules "
            "for; nothing was installed")
