"""One round trip for every read-only probe preflight needs: the parts' own commands, separated by markers."""

from __future__ import annotations

from pyinfra.api import FactBase

from modelfleet.host.facts.fabric import HostFabricFact
from modelfleet.host.facts.gpu import (
    AmdGpus,
    FabricManager,
    NvidiaGpus,
    NvidiaKernelModule,
    NvidiaTopology,
    NvidiaVersions,
)
from modelfleet.host.facts.health import GpuHealth
from modelfleet.host.facts.host import (
    BlockDevices,
    ContainerRuntime,
    DiskFree,
    ListeningPorts,
    MemTotal,
    OsRelease,
    Pythons,
    RenderGroup,
)

MARK = "@@modelfleet-probe"
PARTS = {
    "nvidia_gpus": NvidiaGpus, "nvidia_versions": NvidiaVersions, "nvidia_module": NvidiaKernelModule,
    "topology": NvidiaTopology, "amd_gpus": AmdGpus, "block_devices": BlockDevices, "os": OsRelease,
    "ports": ListeningPorts, "runtime": ContainerRuntime, "disk": DiskFree, "fabric_manager": FabricManager,
    "mem_total_kib": MemTotal, "render_gid": RenderGroup,
    "gpu_health": GpuHealth,  # only when asked: admission's read (nvidia-smi -q -x, Xid lines) rides along
    "fabric": HostFabricFact,  # only when asked: a multi-node pool member's network and RDMA view
    "pythons": Pythons,  # only when a service runs from a venv: the interpreters it names
}


class HostProbe(FactBase):
    """Runs every part's command once, each isolated so one missing tool spoils only its own part."""

    @staticmethod
    def default():
        return {name: None for name in PARTS}

    def command(self, model_root: str = "/srv/models", health: bool = False, fabric: bool = False,
                pythons: tuple[str, ...] = ()) -> str:
        sections = []
        for name, cls in PARTS.items():
            if (cls is GpuHealth and not health) or (cls is HostFabricFact and not fabric) or \
                    (cls is Pythons and not pythons):
                continue
            cmd = cls().command(model_root) if cls is DiskFree else cls().command(pythons) if cls is Pythons \
                else cls().command()
            sections.append(f"echo '{MARK} {name}'; ( {cmd} ) 2>/dev/null; echo \"{MARK} rc=$?\"")
        return "; ".join(sections)

    def process(self, output):
        result = self.default()
        name, lines = None, []
        for line in output:
            if line.startswith(MARK):
                word = line[len(MARK):].strip()
                if word.startswith("rc="):
                    if name and word == "rc=0":
                        try:
                            result[name] = PARTS[name]().process(lines)
                        except ValueError:
                            result[name] = None
                    name, lines = None, []
                else:
                    name, lines = word, []
            elif name:
                lines.append(line)
        return result
