"""GPU facts: NVIDIA (nvidia-smi) and AMD (amd-smi)."""

from __future__ import annotations

import json
import re

from pyinfra.api import FactBase

from modelfleet.base.host_commands import (
    AMD_GPUS,
    FABRIC_MANAGER_VERSION,
    NVIDIA_GPU_QUERY_COMMAND,
    NVIDIA_TOPOLOGY,
    NVIDIA_VERSIONS,
    parse_fabric_manager_version,
    parse_nvidia_versions,
)


def _mib(text: str) -> int:
    return int(text.replace("MiB", "").strip())


class NvidiaGpus(FactBase):
    """One dict per GPU from `nvidia-smi --query-gpu` (CSV, no header)."""

    requires_command = "nvidia-smi"

    def command(self) -> str:
        return NVIDIA_GPU_QUERY_COMMAND

    def process(self, output):
        gpus = []
        for line in output:
            cells = [c.strip() for c in line.split(",")]
            if len(cells) != 7 or not cells[0].isdigit():
                continue
            gpus.append({"index": int(cells[0]), "name": cells[1], "uuid": cells[2], "pci_bus_id": cells[3],
                         "memory_total_mib": _mib(cells[4]), "driver_version": cells[5],
                         "compute_cap": cells[6]})
        return gpus


class NvidiaVersions(FactBase):
    """Driver and CUDA versions (modelfleet.base.host_commands reads R580's and R610's labels)."""

    requires_command = "nvidia-smi"

    def command(self) -> str:
        return NVIDIA_VERSIONS

    def process(self, output):
        return parse_nvidia_versions(output)


class NvidiaKernelModule(FactBase):
    """The loaded kernel module from /proc/driver/nvidia/version: version and open/proprietary flavour."""

    def command(self) -> str:
        return "cat /proc/driver/nvidia/version"

    def process(self, output):
        for line in output:
            m = re.match(r"NVRM version: NVIDIA UNIX (Open )?Kernel Module for (\S+)\s+(\S+)", line)
            if m:
                return {"version": m.group(3), "open": bool(m.group(1)), "arch": m.group(2)}
        return None


class FabricManager(FactBase):
    """NVSwitch devices the driver sees, and the installed Fabric Manager's version."""

    def command(self) -> str:
        return ("echo nvswitches=$(ls /proc/driver/nvidia-nvswitch/devices 2>/dev/null | wc -l); "
                f"{FABRIC_MANAGER_VERSION} 2>/dev/null || true")

    def process(self, output):
        switches = [line.split("=", 1)[1] for line in output if line.startswith("nvswitches=")]
        return {"nvswitches": int(switches[0] or 0) if switches else 0,
                "version": parse_fabric_manager_version(output)}


class NvidiaTopology(FactBase):
    """`nvidia-smi topo -m`: GPU and NIC names, the link matrix, the NVLink bond width between GPUs, and each
    GPU's NUMA node."""

    requires_command = "nvidia-smi"

    def command(self) -> str:
        return NVIDIA_TOPOLOGY

    def process(self, output):
        lines = [re.sub(r"\x1b?\[[0-9;]*m", "", line) for line in output]
        header = next((line for line in lines if re.match(r"^\s+GPU0", line)), None)
        if header is None:
            return None
        columns = [c.strip() for c in header.strip().split("\t") if c.strip()]
        devices = [c for c in columns if re.fullmatch(r"(GPU|NIC)\d+", c)]
        matrix, numa = {}, {}
        for line in lines:
            row = line.split("\t")
            name = row[0].strip()
            if name not in devices:
                continue
            cells = [c.strip() for c in row[1:1 + len(devices)]]
            matrix[name] = dict(zip(devices, cells, strict=False))
            # after the device columns: CPU Affinity, NUMA Affinity (a GPU's node; N/A on one-node hosts)
            node = row[2 + len(devices)].strip() if len(row) > 2 + len(devices) else ""
            if name.startswith("GPU") and node.isdigit():
                numa[name] = int(node)
        gpus = [d for d in devices if d.startswith("GPU")]
        bonds = [int(m.group(1)) for a in gpus for b in gpus if a != b
                 for m in [re.fullmatch(r"NV(\d+)", matrix.get(a, {}).get(b, ""))] if m]
        all_nvlink = len(gpus) > 1 and len(bonds) == len(gpus) * (len(gpus) - 1)
        return {"gpus": gpus, "nics": [d for d in devices if d.startswith("NIC")], "matrix": matrix,
                "nvlink_min_bond": min(bonds) if all_nvlink else None, "all_nvlink": all_nvlink, "numa": numa}


class AmdGpus(FactBase):
    """`amd-smi static --asic --vram --json`. No recorded output yet: parsed from amd-smi's documented JSON."""

    requires_command = "amd-smi"

    def command(self) -> str:
        return AMD_GPUS

    def process(self, output):
        data = json.loads("\n".join(output))
        if isinstance(data, dict):  # newer amd-smi wraps the list: {"gpu_data": [...]}
            data = data.get("gpu_data", [])
        gpus = []
        for item in data:
            size = item.get("vram", {}).get("size", {})
            value = size.get("value", 0) if isinstance(size, dict) else size
            unit = size.get("unit", "MB") if isinstance(size, dict) else "MB"
            mib = int(value) * (1024 if unit.upper() in ("GB", "GIB") else 1)
            gpus.append({"index": int(item.get("gpu", len(gpus))),
                         "name": item.get("asic", {}).get("market_name", ""), "memory_total_mib": mib})
        return gpus
