"""What admission judges: `nvidia-smi -q -x`, `nvidia-smi nvlink -s` and `nvlink -e` (NVIDIA) or `amd-smi
metric --ecc --pcie --json` (AMD), the Xid / amdgpu fatal lines of the kernel log since boot (journal, else
dmesg: whichever the host lets us read), the kernel release and the boot id. Read as a part of preflight's
HostProbe when admission follows, so it costs no round trip of its own."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from pyinfra.api import FactBase

from modelfleet.base.host_commands import (
    AMD_METRICS,
    MODULE_SIGNER,
    NVIDIA_HEALTH_XML,
    NVIDIA_NVLINK_ERRORS,
    NVIDIA_NVLINK_STATUS,
)
from modelfleet.host.health import (
    KERNEL_LOG_PATTERN,
    gpus_of,
    parse_amd_metric,
    parse_amdgpu_faults,
    parse_nvlink,
    parse_xids,
)
from modelfleet.plan import nvlink_errors

MARK = "@@modelfleet-health"


class GpuHealth(FactBase):
    def command(self) -> str:
        # Both vendors' tools are asked; the one the host lacks prints nothing.
        return (f"echo '{MARK} smi'; {NVIDIA_HEALTH_XML} 2>/dev/null; echo '{MARK} nvlink'; "
                f"{NVIDIA_NVLINK_STATUS} 2>/dev/null; echo '{MARK} nvlink_errors'; "
                f"{NVIDIA_NVLINK_ERRORS} 2>/dev/null; echo '{MARK} amd'; {AMD_METRICS} 2>/dev/null; "
                f"echo '{MARK} kernel'; {{ journalctl -k -b --no-pager -q 2>/dev/null || dmesg 2>/dev/null; }} "
                f"| grep -E '{KERNEL_LOG_PATTERN}' | tail -n 500; "
                f"echo '{MARK} id'; uname -r; cat /proc/sys/kernel/random/boot_id; "
                f"echo '{MARK} signer'; {MODULE_SIGNER} 2>/dev/null; true")

    def process(self, output):
        parts: dict[str, list[str]] = {"smi": [], "nvlink": [], "nvlink_errors": [], "amd": [], "kernel": [], "id": [],
                                       "signer": []}
        part = None
        for line in output:
            if line.startswith(MARK):
                part = line[len(MARK):].strip()
            elif part:
                parts[part].append(line)
        text = "\n".join(parts["smi"]).strip()
        try:
            root = ET.fromstring(text) if text else None
        except ET.ParseError:  # nvidia-smi printed an error instead of XML
            root = None
        gpus = gpus_of(root) if root is not None else None
        driver = (root.findtext("driver_version") or "").strip() or None if root is not None else None
        kernel, boot_id = (parts["id"] + [None, None])[:2]
        return {"gpus": gpus, "driver": driver, "xids": parse_xids(parts["kernel"]), "kernel": kernel,
                "boot_id": boot_id, "nvlink": parse_nvlink(parts["nvlink"]),
                "nvlink_errors": nvlink_errors.parse(parts["nvlink_errors"]),
                "module_signer": (parts["signer"] + [""])[0].strip() or None,
                "amd_gpus": parse_amd_metric("\n".join(parts["amd"])) if parts["amd"] else None,
                "amdgpu_faults": parse_amdgpu_faults(parts["kernel"])}
