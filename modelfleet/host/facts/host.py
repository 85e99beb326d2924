"""Host facts: block devices, free disk, OS, listening ports, container runtime."""

from __future__ import annotations

import json
import re
import shlex

from pyinfra.api import FactBase


class BlockDevices(FactBase):
    """`lsblk -J -b`: every block device (partitions as children) with size in bytes, mountpoint, filesystem,
    partition table, label, UUID, model, transport and serial. lsblk takes filesystem fields from udev, which
    containers and minimal hosts lack; `blkid` (probing the devices) fills those in."""

    MARK = "@@modelfleet-blkid"

    def command(self) -> str:
        return ("lsblk -J -b -o NAME,PATH,SIZE,TYPE,MOUNTPOINT,FSTYPE,PTTYPE,LABEL,UUID,MODEL,TRAN,ROTA,SERIAL; "
                f"echo '{self.MARK}'; blkid -o export 2>/dev/null || true")

    def process(self, output):
        lines = list(output)
        cut = lines.index(self.MARK) if self.MARK in lines else len(lines)
        devices = json.loads("\n".join(lines[:cut])).get("blockdevices", [])
        probed: dict[str, dict] = {}
        current: dict = {}
        for line in lines[cut + 1:]:
            key, _, value = line.partition("=")
            if key == "DEVNAME":
                current = probed.setdefault(value, {})
            elif key in ("TYPE", "LABEL", "UUID", "PTTYPE"):
                current[key] = value
        fields = {"fstype": "TYPE", "label": "LABEL", "uuid": "UUID", "pttype": "PTTYPE"}

        def fill(devs):
            for dev in devs:
                found = probed.get(dev.get("path") or f"/dev/{dev['name']}", {})
                for field, key in fields.items():
                    if not dev.get(field) and found.get(key):
                        dev[field] = found[key]
                fill(dev.get("children") or [])

        fill(devices)
        return devices


class DiskFree(FactBase):
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent)."""

    def command(self, path: str) -> str:
        p = shlex.quote(path)
        return f'p={p}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; df -B1 -P "$p"'

    def process(self, output):
        for line in output[1:]:
            cells = line.split()
            if len(cells) >= 6 and cells[1].isdigit():
                return {"filesystem": cells[0], "size": int(cells[1]), "used": int(cells[2]),
                        "avail": int(cells[3]), "mount": cells[5]}
        return None


class Pythons(FactBase):
    """The interpreters a venv engine names (`venv_python`): each one's version, and whether it can make a venv
    with pip in it (the venv module and ensurepip: Debian and Ubuntu split them into pythonX.Y-venv)."""

    def command(self, names: tuple[str, ...] = ()) -> str:
        probe = "import sys; print('%d.%d.%d' % sys.version_info[:3])"
        return "; ".join(f"echo {shlex.quote(n)} $({shlex.quote(n)} -c {shlex.quote(probe)} 2>/dev/null) "
                         f"$({shlex.quote(n)} -c 'import venv, ensurepip' >/dev/null 2>&1 && echo venv)"
                         for n in names) or "true"

    def process(self, output):
        found = {}
        for line in output:
            name, *rest = line.split()
            found[name] = {"version": rest[0] if rest and rest[0][0].isdigit() else None, "venv": "venv" in rest}
        return found


# The firmware's Secure Boot variable (EFI global variable GUID): 4 bytes of attributes, then 1 when on.
SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
# The key DKMS signs modules with on Ubuntu (shim-signed's update-secureboot-policy makes it).
DKMS_MOK = "/var/lib/shim-signed/mok/MOK.der"


def secure_boot_sh() -> str:
    """SECURE_BOOT=<mokutil's line, or the EFI variable's byte, or `no EFI`>, and MOK_DKMS=<--test-key's line>."""
    return ("if command -v mokutil >/dev/null 2>&1; then echo \"SECURE_BOOT=$(mokutil --sb-state 2>&1 | head -n1)\"; "
            f"[ -f {DKMS_MOK} ] && echo \"MOK_DKMS=$(mokutil --test-key {DKMS_MOK} 2>&1 | head -n1)\"; "
            f"elif [ -f {SECURE_BOOT_VAR} ]; then "
            f"echo \"SECURE_BOOT=efivar $(od -An -t u1 -j4 -N1 {SECURE_BOOT_VAR} | tr -d ' ')\"; "
            "elif [ ! -d /sys/firmware/efi ]; then echo 'SECURE_BOOT=no EFI'; fi; true")


def parse_secure_boot(line: str | None) -> str | None:
    """'enabled' / 'disabled' / 'no-efi' from mokutil --sb-state or the EFI variable; None when unknown."""
    text = (line or "").strip()
    if text in ("efivar 1", "SecureBoot enabled"):
        return "enabled"
    if text in ("efivar 0", "SecureBoot disabled"):
        return "disabled"
    if text == "no EFI" or "not supported" in text:
        return "no-efi"
    return None


def kernel_flavour(release: str | None) -> str | None:
    """'6.8.0-45-generic' -> 'generic', '6.8.0-1015-aws' -> 'aws', '6.1.0-18-amd64' -> 'amd64' (the suffix
    Ubuntu's linux-modules-nvidia-<branch>-server-open-<flavour> packages are named by)."""
    match = re.match(r"^\d+\.\d+\.\d+-\d+-([a-z][a-z0-9-]*)$", release or "")
    return match.group(1) if match else None


class OsRelease(FactBase):
    """/etc/os-release, plus the running kernel (its headers package, its flavour), the machine architecture
    and the firmware's Secure Boot state (whether a DKMS-built module loads without an enrolled key)."""

    def command(self) -> str:
        return ('cat /etc/os-release; echo "KERNEL_RELEASE=$(uname -r)"; echo "MACHINE_ARCH=$(uname -m)"; '
                + secure_boot_sh())

    def process(self, output):
        out = {}
        for line in output:
            key, sep, value = line.partition("=")
            if sep:
                out[key.strip()] = value.strip().strip('"')
        mok = out.get("MOK_DKMS") or ""
        return {"id": out.get("ID"), "version_id": out.get("VERSION_ID"),
                "codename": out.get("VERSION_CODENAME"), "pretty_name": out.get("PRETTY_NAME"),
                "kernel": out.get("KERNEL_RELEASE"), "arch": out.get("MACHINE_ARCH"),
                "kernel_flavour": kernel_flavour(out.get("KERNEL_RELEASE")),
                "secure_boot": parse_secure_boot(out.get("SECURE_BOOT")),
                "dkms_key_enrolled": True if "already enrolled" in mok else False if "not enrolled" in mok else None}


class ListeningPorts(FactBase):
    """TCP listeners from `ss -Htlnp`: address, port and owning process (when ss may tell)."""

    requires_command = "ss"

    def command(self) -> str:
        return "ss -Htlnp"

    def process(self, output):
        ports = []
        for line in output:
            cells = line.split()
            if len(cells) < 4:
                continue
            address, _, port = cells[3].rpartition(":")
            process = ""
            if len(cells) > 5 and '(("' in cells[5]:
                process = cells[5].split('"')[1]
            if port.isdigit():
                ports.append({"address": address.strip("[]"), "port": int(port), "process": process})
        return ports


class ContainerRuntime(FactBase):
    """Docker server version and whether the NVIDIA runtime / toolkit is present."""

    def command(self) -> str:
        # One docker call, not `docker version` + `docker info`: each CLI start costs tens of ms.
        return ("echo docker=$(command -v docker || echo none); "
                "docker info --format 'server={{.ServerVersion}}{{println}}runtimes={{json .Runtimes}}' "
                "2>/dev/null | tr -d ' ' || echo server=none; "
                "echo nvidia_ctk=$(command -v nvidia-ctk || echo none)")

    def process(self, output):
        raw = dict(line.split("=", 1) for line in output if "=" in line)
        none = {"none", ""}
        runtimes = raw.get("runtimes", "none")
        return {"docker": raw.get("docker") not in none, "server_version": None
                if raw.get("server") in none else raw.get("server"),
                "nvidia_runtime": '"nvidia"' in runtimes, "nvidia_ctk": raw.get("nvidia_ctk") not in none}


def parse_mem_total_kib(lines) -> int | None:
    """MemTotal from /proc/meminfo (kB, which the kernel means as KiB)."""
    for line in lines:
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    return None


class MemTotal(FactBase):
    """The host's RAM (KiB), what llama.cpp recipes that keep MoE experts in RAM are sized against."""

    def command(self) -> str:
        return "grep '^MemTotal:' /proc/meminfo"

    def process(self, output):
        return parse_mem_total_kib(output)


class RenderGroup(FactBase):
    """The host's `render` group id: AMD containers get it by number (`--group-add N`, as vLLM's ROCm CI runs
    them), since a name resolves inside the image, whose /etc/group may not have it. None: no such group."""

    def command(self) -> str:
        return "getent group render | cut -d: -f3"

    def process(self, output):
        value = "".join(output).strip()
        return int(value) if value.isdigit() else None
