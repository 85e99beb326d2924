"""Secure Boot personas: bare H200 hosts that present as Ubuntu 24.04 on a generic kernel with UEFI Secure Boot
on and DKMS's key not enrolled (mokutil, modinfo, /etc/os-release and `uname -r` stand-ins, lab/personas/secure-boot),
their distribution archive the lab's `ubuntu noble restricted` (lab/apt/packages.yaml), which has Canonical's
signed NVIDIA modules for kernel 6.8.0-87-generic only. One persona runs that kernel; the other a newer one the
archive has no signed modules for."""

from __future__ import annotations

from pathlib import Path

from lab import apt

PERSONA_DIR = Path(__file__).parent / "personas" / "secure-boot"
# persona -> the kernel release it runs
KERNELS = {"h200x1-secureboot-bare": "6.8.0-87-generic", "h200x1-secureboot-newkernel-bare": "6.8.0-90-generic"}
UBUNTU_LIST = f"deb [signed-by=/usr/share/keyrings/modelfleet-lab-archive.gpg] {apt.BASE}/ubuntu noble restricted\n"


def mounts(spec: dict, state: Path) -> list[str]:
    """The persona's stand-ins, as `-v` arguments (none for another persona)."""
    kernel = KERNELS.get(spec["persona"])
    if not kernel:
        return []
    release = Path(spec["home"]) / "kernel-release"
    release.write_text(kernel + "\n")
    (state / "ubuntu-lab.list").write_text(UBUNTU_LIST)
    return [f"{PERSONA_DIR / 'os-release'}:/etc/os-release:ro", f"{release}:/opt/modelfleet-lab/kernel-release:ro",
            f"{PERSONA_DIR / 'uname'}:/usr/local/bin/uname:ro", f"{PERSONA_DIR / 'mokutil'}:/usr/local/bin/mokutil:ro",
            f"{PERSONA_DIR / 'modinfo'}:/usr/local/bin/modinfo:ro",
            f"{state / 'ubuntu-lab.list'}:/etc/apt/sources.list.d/ubuntu-lab.list:ro"]
