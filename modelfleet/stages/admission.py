"""Stage admission: a host joins its pool only when its GPUs are healthy (modelfleet/health.py's checks on
`nvidia-smi -q -x` and the kernel log's Xid events, against the hardware catalog). The verdict goes to
reports/admission/<host>.json with every check, value and threshold, the fingerprint it holds for (driver,
kernel, GPU serials) and until when (`admission_valid_h`); a refused host gets no later stage.

Built for NVIDIA hosts; AMD (amd-smi) is not, and hosts without GPUs for containers (the lab) are skipped."""

from __future__ import annotations

import time

from pyinfra import host
from pyinfra.api import deploy

from modelfleet.context import HostRun
from modelfleet.facts.health import GpuHealth
from modelfleet.gpu_predicates import fabric_manager_needed
from modelfleet.health import verdict
from modelfleet.operations.report import fail_host, save_report


def wants(plan, probe: dict) -> dict:
    return {}


def judge(plan, health: dict, probe: dict) -> dict:
    """The admission report for this host (pure)."""
    hw = plan.hardware
    now = time.time()
    gpus = health.get("gpus")
    if gpus is None:
        result = {"ok": False, "checks": [], "reasons": ["nvidia-smi -q -x answered nothing: no driver loaded, or "
                                                         "it cannot reach the GPUs"]}
    else:
        result = verdict(gpus, health.get("xids") or [], expected_count=plan.gpu_count, min_memory_mib=hw.hbm_mib,
                         min_pcie_gen=hw.pcie_gen, min_pcie_width=hw.pcie_width,
                         fabric_expected=fabric_manager_needed(plan, probe))
    return {"host": plan.name, **result, "admitted_at": now if result["ok"] else None,
            "valid_until": now + plan.admission_valid_h * 3600 if result["ok"] else None,
            "fingerprint": {"driver": health.get("driver"), "kernel": health.get("kernel"),
                            "boot_id": health.get("boot_id"),
                            "serials": sorted(g["serial"] or "" for g in gpus or [])}}


@deploy("modelfleet admission")
def run(ctx: HostRun) -> bool:
    plan = ctx.plan
    if plan.hardware.vendor != "nvidia" or not all(s.gpu_passthrough for s in plan.services):
        host.noop("admission checks NVIDIA GPUs handed to containers (none here, or AMD: not built)")
        return True
    probe = ctx.probe
    report = judge(plan, probe.get("gpu_health") or host.get_fact(GpuHealth), probe)
    save_report("admission", plan.name, report)
    if not report["ok"]:
        fail_host(name="Admission refused this host", reasons=[f"admission: {r}" for r in report["reasons"]])
    else:
        host.noop(f"admitted: {len(report['checks'])} checks pass")
    return report["ok"]
