"""What a host's GPUs and driver are, and what the stack will do to them: pure predicates over the inventory's
plan and preflight's probe, shared by preflight (what to defer), the driver stage and the stack report."""

from __future__ import annotations

from modelfleet.plan.inventory.plan import HostPlan


def loaded_driver(probe: dict) -> str | None:
    """The driver the kernel runs: /proc/driver/nvidia/version, else what nvidia-smi reports (it fails when
    no module is loaded or the module and libraries differ)."""
    module = probe.get("nvidia_module") or {}
    return module.get("version") or (probe.get("nvidia_versions") or {}).get("driver")


def branch_of(version: str | None) -> int:
    head = (version or "").split(".")[0]
    return int(head) if head.isdigit() else 0


def replaces_driver(plan: HostPlan, probe: dict) -> bool:
    """Will this stage install or replace the driver? Then what the driver reports now is not final."""
    if not plan.stack_ours:
        return False
    if plan.hardware.vendor == "amd":
        return not probe.get("amd_gpus")
    loaded, wanted = loaded_driver(probe), plan.stack.driver_version
    return branch_of(loaded) != int(plan.stack.driver_branch) or bool(wanted and loaded != wanted)


def fabric_manager_needed(plan: HostPlan, probe: dict) -> bool:
    """NVSwitch seen by the driver, or the catalog says the board has it and the host has the whole board
    (a VM given one GPU of it sees no switch)."""
    hw, fm = plan.hardware, probe.get("fabric_manager") or {}
    return hw.vendor == "nvidia" and (fm.get("nvswitches", 0) > 0 or
                                      (hw.fabric_manager and plan.gpu_count >= hw.gpus_per_node))


def locality_notes(plan: HostPlan, topology: dict | None) -> list[str]:
    """A service whose GPUs span NUMA nodes although one node has enough of them: its traffic crosses the
    socket interconnect. Said with the indices that would keep it on one node (`gpu_indices` in the inventory);
    the placement itself stays the inventory's (lowest free indices in service order, or as given)."""
    numa = (topology or {}).get("numa") or {}
    if len(set(numa.values())) < 2:
        return []
    by_node: dict[int, list[int]] = {}
    for name, node in numa.items():
        by_node.setdefault(node, []).append(int(name[3:]))
    taken = {i for svc in plan.services for i in svc.gpu_indices}
    notes = []
    for svc in plan.services:
        nodes = {numa.get(f"GPU{i}") for i in svc.gpu_indices}
        if len(svc.gpu_indices) < 2 or len(nodes) < 2:
            continue
        for node, indices in sorted(by_node.items()):
            free = sorted(i for i in indices if i not in taken or i in svc.gpu_indices)
            if len(free) >= len(svc.gpu_indices):
                notes.append(f"{svc.pool}: GPUs {','.join(map(str, svc.gpu_indices))} span NUMA nodes "
                             f"{','.join(str(n) for n in sorted(nodes, key=str))}; gpu_indices "
                             f"{free[:len(svc.gpu_indices)]} would keep it on node {node}")
                break
    return notes
