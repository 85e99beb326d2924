"""One home for each piece of host vocabulary the project speaks: the command string and what reads its answer,
side by side. Facts, check scripts, fleet commands and lab scripts take them from here, so a tool that changes
its output (R610's `KMD version`) is taught in one place.

`*_sh()` functions return shell snippets that print one value, for scripts that judge on the host itself;
`parse_*` functions read the same command's output in Python. Programs longer than a line live as files in
modelfleet/shell/ (linted by shellcheck) and reach a host through `program()`, their values as arguments.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path

SHELL_DIR = Path(__file__).parents[1] / "shell"

# Where the project puts the scripts it runs on hosts (the fetch script, the NCCL check, the router launcher).
TOOLS_BIN = "/opt/modelfleet/bin"


def program(name: str, *args: object, env: Mapping[str, object] | None = None,
            functions: Mapping[str, str] | None = None) -> str:
    """`sh -c '<modelfleet/shell/NAME.sh>' NAME ARGS...`: one command line, so a program still costs one round
    trip. `env` become variables (upper case) and `functions` shell functions (`gpu_count() { ...; }`) set
    before the program: the names and host vocabulary a program speaks keep their one home in Python, and the
    file uses them by name. Comment lines stay in the file."""
    lines = [line for line in (SHELL_DIR / f"{name}.sh").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    prelude = [f"{key}={shlex.quote(str(value))}" for key, value in (env or {}).items()]
    prelude += [f"{fn}() {{ {sh}; }}" for fn, sh in (functions or {}).items()]
    return " ".join(["sh", "-c", shlex.quote("\n".join(prelude + lines)), name, *(shlex.quote(str(a)) for a in args)])


# A checkpoint on a host: <model_root>/<model id>/<commit>/ (revisions_dir holds a model's revisions and the
# `current` link to the one served); in a revision, modelfleet's own files are named .modelfleet-*: the
# manifest of a verified copy, the lock a running fetch holds, a fetch's partial files.
MANIFEST = ".modelfleet-manifest.json"
FETCH_LOCK = ".modelfleet-lock"
PARTIAL = ".modelfleet-partial"
CURRENT = "current"


def model_dir(model_root: str, model_id: str, revision: str) -> str:
    return f"{model_root.rstrip('/')}/{model_id}/{revision}"


def revisions_dir(model_dir: str) -> str:
    """The model's directory: its revisions and the `current` link."""
    return model_dir.rstrip("/").rsplit("/", 1)[0]


# The signer of the nvidia module the running kernel loads (Canonical's key for Ubuntu's signed modules, DKMS's
# MOK for a module built here; nothing for an unsigned one).
MODULE_SIGNER = "modinfo -F signer nvidia"
NVIDIA_VERSIONS = "nvidia-smi --version"
FABRIC_MANAGER_VERSION = "nv-fabricmanager --version"

# `nvidia-smi --version` labels (R580: DRIVER / CUDA Version; R610: KMD / CUDA UMD Version).
_VERSION_KEYS = {"NVIDIA-SMI version": "nvidia_smi", "NVML version": "nvml", "DRIVER version": "driver",
                 "KMD version": "driver", "CUDA Version": "cuda", "CUDA UMD Version": "cuda"}


def parse_nvidia_versions(lines: Iterable[str]) -> dict:
    out = {}
    for line in lines:
        key, _, value = line.partition(":")
        name = _VERSION_KEYS.get(key.strip())
        if name:
            out[name] = value.strip()
    return out


def driver_version_sh() -> str:
    """Prints the loaded driver's version (empty when nvidia-smi cannot answer)."""
    return f"{NVIDIA_VERSIONS} 2>/dev/null | sed -n 's/^\\(DRIVER\\|KMD\\) version *: *//p'"


def parse_fabric_manager_version(lines: Iterable[str]) -> str | None:
    """'Fabric Manager version is : X' (the 610 branch adds a 'Build Info' line after it)."""
    for line in lines:
        m = re.match(r"Fabric Manager version is\s*:\s*(\S+)", line.strip())
        if m:
            return m.group(1)
    return None


def fabric_manager_version_sh() -> str:
    """Prints the installed Fabric Manager's version (empty when it is not installed)."""
    return f"{FABRIC_MANAGER_VERSION} 2>/dev/null | sed -n 's/^Fabric Manager version is *: *//p'"


# One line per GPU ("GPU 0: NVIDIA H200 (UUID: GPU-...)"): the same on the host and in a container given the GPUs.
NVIDIA_GPU_LIST = "nvidia-smi -L"
# One dict per GPU from CSV without a header: modelfleet.host.facts.gpu.NvidiaGpus reads these columns in this order.
NVIDIA_GPU_QUERY = "index,name,uuid,pci.bus_id,memory.total,driver_version,compute_cap"
NVIDIA_GPU_QUERY_COMMAND = f"nvidia-smi --query-gpu={NVIDIA_GPU_QUERY} --format=csv,noheader"
# The link matrix between GPUs and NICs, read by modelfleet.host.facts.gpu.NvidiaTopology.
NVIDIA_TOPOLOGY = "nvidia-smi topo -m"
# An AMD GPU as a container gets it: a render node under /dev/dri.
AMD_RENDER_NODES_SH = "ls /dev/dri | grep -c renderD"


# What admission judges, read by modelfleet.host.health: each GPU's state as XML, the NVLink links' status, and
# AMD's ECC and PCIe metrics as JSON.
NVIDIA_HEALTH_XML = "nvidia-smi -q -x"
NVIDIA_NVLINK_STATUS = "nvidia-smi nvlink -s"
NVIDIA_NVLINK_ERRORS = "nvidia-smi nvlink -e"  # replay/recovery/CRC counters since the driver loaded
AMD_METRICS = "amd-smi metric --ecc --pcie --json"
AMD_GPUS = "amd-smi static --asic --vram --json"


def gpu_memory_sh() -> str:
    """Each GPU's memory in use (MiB), one `index, used` line per GPU, on the serving host."""
    return "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits"


def parse_gpu_memory(text: str) -> dict[int, int]:
    used = {}
    for line in text.splitlines():
        index, sep, mib = line.partition(",")
        if sep and index.strip().isdigit() and mib.strip().isdigit():
            used[int(index)] = int(mib)
    return used


# Each GPU's memory in use and in all (MiB), one `index, used, total` line per GPU: what `modelfleet status` shows.
GPU_MEMORY_STATUS = "nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits"


def parse_gpu_memory_status(line: str) -> dict | None:
    """One GPU_MEMORY_STATUS line as {"index", "memory_used_mib", "memory_total_mib"}; None for any other line."""
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != 3 or not all(c.isdigit() for c in cells):
        return None
    return {"index": int(cells[0]), "memory_used_mib": int(cells[1]), "memory_total_mib": int(cells[2])}


def nvidia_gpu_count_sh() -> str:
    """Prints how many GPUs nvidia-smi lists (fails when it cannot talk to the driver)."""
    return f"{NVIDIA_GPU_LIST} | grep -c '^GPU '"


def amd_gpu_count_sh() -> str:
    return "amd-smi list 2>/dev/null | grep -c '^GPU:'"


def container_gpu_check(vendor: str, image: str) -> str:
    """The GPUs a container of `image` sees must be the host's: same `nvidia-smi -L` lines, given the GPUs through
    CDI as the engines get theirs (AMD: same number of render nodes, given /dev/kfd and /dev/dri). The docker
    command is spelled out whole, so a dry run shows what will run."""
    img = shlex.quote(image)
    if vendor == "amd":
        host_side = AMD_RENDER_NODES_SH
        container_side = f"docker run --rm --device /dev/kfd --device /dev/dri {img} sh -c {shlex.quote(host_side)}"
    else:
        host_side = NVIDIA_GPU_LIST
        container_side = f"docker run --rm --device nvidia.com/gpu=all {img} {NVIDIA_GPU_LIST}"
    return program("container_gpu_check", functions={"host_gpus": host_side, "container_gpus": container_side})


def boot_token_sh() -> str:
    """Prints one line that changes with every boot: the kernel's boot id, and PID 1's start time (a lab host's
    container restart keeps the machine's boot id but starts a new init)."""
    return "echo $(cat /proc/sys/kernel/random/boot_id) $(cut -d' ' -f22 /proc/1/stat)"


def journal_command(unit: str, lines: int, follow: bool = False, iso: bool = False) -> str:
    """The unit's last `lines` journal lines (what an operator reads when an engine did not come up)."""
    return (f"journalctl -u {shlex.quote(unit)} -n {int(lines)} --no-pager" + (" -o short-iso" if iso else "")
            + (" -f" if follow else ""))


def unit_show_command(unit: str, properties: Iterable[str]) -> str:
    """`Key=value` lines for the unit's properties; `unit` is quoted unless it is a shell variable ("$u")."""
    quoted = unit if unit.startswith('"$') else shlex.quote(unit)
    return f"systemctl show {' '.join(f'-p {p}' for p in properties)} -- {quoted}"


def parse_unit_show(lines: Iterable[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


DCGM_MISSING = "@@modelfleet-dcgm no dcgmi"


def dcgm_diag_sh(level: int) -> str:
    """DCGM's diagnostic at `level` as JSON (`dcgmi diag -r N -j`; it needs nv-hostengine running), or a marker
    line when the host has no dcgmi."""
    return (f"command -v dcgmi >/dev/null || {{ echo '{DCGM_MISSING}'; exit 0; }}; "
            f"dcgmi diag -r {int(level)} -j 2>&1; true")


FABRIC_MARK = "@@modelfleet-fabric"
# The modules the fabric view lists: RDMA's, GPUDirect's peer memory, NVIDIA's.
FABRIC_MODULES = ("nvidia_peermem", "ib_uverbs", "ib_core", "mlx5_ib", "rdma_ucm", "nvidia")
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"  # a GID table slot not in use


def fabric_command() -> str:
    """The host's network and RDMA view in marked sections, read by modelfleet.host.facts.fabric.parse_fabric:
    `ip -j` addresses and routes where iproute2 answers, else /proc/net's route tables, fib_trie and if_inet6;
    the sysfs links of netdevs, HCAs, their uverbs nodes and NVIDIA GPUs (their PCI paths); one `grep -H` over
    the sysfs values (netdev address/MTU/state, HCA ports, partition keys, non-empty GIDs with their types and
    netdevs, NUMA nodes); IMEX channels, service and node list; the RDMA modules loaded; /dev/infiniband."""
    return program("fabric", env={"MARK": FABRIC_MARK, "MODULES": "|".join(FABRIC_MODULES), "ZERO_GID": ZERO_GID})


# How long a stopped engine's GPU memory may take to be released before the next start is refused.
GPU_RELEASE_WAIT_S = 20


def gpus_free_script(unit: str, gpus: Iterable[int], stop: bool) -> str:
    """Shell: stop `unit` (when `stop`), then the processes holding memory on `gpus` (NVIDIA indices) after up to
    GPU_RELEASE_WAIT_S, each named (exit 1), or none. (AMD: no recorded `amd-smi process` output to read yet.)"""
    return program("gpus_free", unit, int(stop), GPU_RELEASE_WAIT_S, *gpus)
