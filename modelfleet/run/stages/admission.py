"""Stage admission: a host joins its pool only when its GPUs are healthy (modelfleet/host/health.py's checks on
`nvidia-smi -q -x` and the kernel log's Xid events, against the hardware catalog). The verdict goes to
reports/admission/<host>.json with every check, value and threshold, the fingerprint it holds for (driver,
kernel, GPU serials) and until when (`admission_valid_h`); a refused host gets no later stage, and fails
its pool: no unit of a pool (re)starts unless every member is admitted (like the NCCL gate).

AMD hosts are judged on `amd-smi metric --ecc --pcie --json` and amdgpu's fatal kernel messages (health.py's
amd_verdict). `admission: false` leaves a host unjudged (the lab's personas without a recording to judge)."""

from __future__ import annotations

import time

from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation

from modelfleet.base.host_commands import DCGM_MISSING, dcgm_diag_sh
from modelfleet.host.facts.health import GpuHealth
from modelfleet.host.health import admission_state, amd_verdict, dcgm_check, verdict
from modelfleet.host.operations.report import fail_host, refuse, save_report
from modelfleet.plan import nvlink_errors
from modelfleet.plan.gpu_predicates import fabric_manager_needed, replaces_driver
from modelfleet.run.context import HostRun

NAME = "admission"
PINS: frozenset[str] = frozenset()

# How long DCGM's diagnostic may run per level (NVIDIA's guide: level 1 seconds, 2 about 2 minutes, 3 about
# 30 minutes, 4 1-2 hours on a large board).
DCGM_TIMEOUT_S = {1: 300, 2: 900, 3: 3600, 4: 3 * 3600}


def wants(plan, probe: dict) -> dict:
    """Preflight's probe reads the GPUs' health where the verdict can come from it (NVIDIA; AMD asks itself)."""
    return {"probe": ["gpu_health"]} if plan.admission and plan.hardware.vendor == "nvidia" else {}


def judge(plan, health: dict, probe: dict, dcgm: dict | None = None) -> dict:
    """The admission report for this host (pure); `dcgm`: the dcgm_diag check, where the host runs DCGM's
    diagnostic (health.dcgm_check)."""
    hw = plan.hardware
    now = time.time()
    gpus = health.get("amd_gpus" if hw.vendor == "amd" else "gpus")
    tool = "amd-smi metric" if hw.vendor == "amd" else "nvidia-smi -q -x"
    if gpus is None:
        result = {"ok": False, "checks": [], "reasons": [f"{tool} answered nothing: no driver loaded, or it "
                                                         "cannot reach the GPUs"]}
    elif hw.vendor == "amd":
        memory = {g["index"]: g["memory_total_mib"] for g in probe.get("amd_gpus") or []}
        result = amd_verdict(gpus, health.get("amdgpu_faults") or [], expected_count=plan.gpu_count,
                             memory_mib=memory, min_memory_mib=hw.hbm_mib, min_pcie_gen=hw.pcie_gen,
                             min_pcie_width=hw.pcie_width)
    else:
        # NVLink state counts where the board's GPUs talk over it: one GPU alone has no peer to link to.
        nvlink = health.get("nvlink") if hw.interconnect.startswith("nvlink") and plan.gpu_count > 1 else None
        result = verdict(gpus, health.get("xids") or [], expected_count=plan.gpu_count, min_memory_mib=hw.hbm_mib,
                         min_pcie_gen=hw.pcie_gen, min_pcie_width=hw.pcie_width,
                         fabric_expected=fabric_manager_needed(plan, probe), nvlink=nvlink,
                         nvlink_errors=health.get("nvlink_errors") if nvlink is not None else None)
    if dcgm is not None:
        checks = result["checks"] + [dcgm]
        result = {"ok": all(c["ok"] for c in checks) and bool(result["checks"]), "checks": checks,
                  "reasons": result["reasons"] + ([] if dcgm["ok"] else [dcgm["reason"]])}
    counters = nvlink_errors.nonzero(health.get("nvlink_errors") or {}) if hw.vendor == "nvidia" else []
    return {"host": plan.name, **result, "nvlink_errors": counters, "admitted_at": now if result["ok"] else None,
            "valid_until": now + plan.admission_valid_h * 3600 if result["ok"] else None,
            "fingerprint": {"driver": health.get("driver"), "kernel": health.get("kernel"),
                            "boot_id": health.get("boot_id"), "module_signer": health.get("module_signer"),
                            "serials": sorted(g.get("serial") or "" for g in gpus or [])}}


def pool_refusals(members: list[str], verdicts: dict[str, dict], this_host: str) -> list[str]:
    """Why the pool may not (re)start: each other member refused in this run, or (not judged in this run, e.g.
    left out by --limit) without a valid pass on record."""
    out = []
    for name in members:
        if name == this_host:
            continue
        verdict = verdicts.get(name)
        if verdict is None:
            last = admission_state(name)
            if not (last and last["valid"]):
                out.append(f"{name} was not admitted in this run and has no valid pass on record")
        elif not verdict["ok"]:
            out.append(f"{name} was refused: {'; '.join(verdict['reasons'])}")
    return out


def _pool_admitted(state, host, pool: str, members: list[str], verdicts: dict) -> bool:
    """FunctionCommand body, while executing: every member's verdict is in by now."""
    reasons = pool_refusals(members, verdicts, host.name)
    return refuse(state, host, [f"admission of pool {pool}: {r}" for r in reasons]) if reasons else True


@operation(is_idempotent=False)
def pool_admitted(pool: str, members: list[str], verdicts: dict):
    """A pool starts only when all its hosts are admitted, like the NCCL gate: a refused host fails its pool."""
    if len(members) < 2:
        host.noop(f"pool {pool} is this host alone")
        return
    yield FunctionCommand(_pool_admitted, (pool, members, verdicts), {})


def _dcgm_level(plan) -> int:
    """DCGM's diagnostic runs on NVIDIA hosts only (AMD has no DCGM)."""
    return plan.admission_dcgm_level if plan.hardware.vendor == "nvidia" else 0


def _record(ctx: HostRun, report: dict) -> None:
    ctx.admission[ctx.plan.name] = {"ok": report["ok"], "reasons": report["reasons"]}
    save_report("admission", ctx.plan.name, report)


def _judged_now(state, host, ctx: HostRun) -> bool:
    """FunctionCommand body, while executing: the GPUs read now (after this run changed the driver and rebooted),
    with DCGM's diagnostic where the host asks for one."""
    _, output = host.run_shell_command(StringCommand(GpuHealth().command()), print_output=False,
                                        print_input=False)
    level, dcgm = _dcgm_level(ctx.plan), None
    if level:
        _, diag = host.run_shell_command(StringCommand(dcgm_diag_sh(level)), print_output=False, print_input=False,
                                         _timeout=DCGM_TIMEOUT_S[level])
        lines = diag.stdout_lines
        dcgm = dcgm_check(level, "\n".join(lines), missing=DCGM_MISSING in lines)
    report = judge(ctx.plan, GpuHealth().process(output.stdout_lines), ctx.probe, dcgm)
    _record(ctx, report)
    return report["ok"] or refuse(state, host, [f"admission: {r}" for r in report["reasons"]])


@operation(is_idempotent=False)
def admitted_at_execution(ctx: HostRun):
    """Judged while executing, not from preflight's read: the driver changes in this run (what preflight read is
    not what will serve), or DCGM's diagnostic runs (minutes: not a fact to gather while planning)."""
    yield FunctionCommand(_judged_now, (ctx,), {})


@deploy("modelfleet admission")
def run(ctx: HostRun) -> bool:
    plan = ctx.plan
    if plan.hardware.vendor not in ("nvidia", "amd") or not plan.admission:
        ctx.admission[plan.name] = {"ok": True, "reasons": [], "skipped": True}
        host.noop("admission judges NVIDIA and AMD GPUs" if plan.admission else "admission: false for this host")
        return True
    probe = ctx.probe
    new_driver, dcgm_level = replaces_driver(plan, probe), _dcgm_level(plan)
    if new_driver or dcgm_level:
        when = "after the driver change" if new_driver else f"with DCGM diagnostic level {dcgm_level}"
        admitted_at_execution(name=f"Admission (GPUs read {when})", ctx=ctx)
    else:
        report = judge(plan, probe.get("gpu_health") or host.get_fact(GpuHealth), probe)
        _record(ctx, report)
        if not report["ok"]:
            fail_host(name="Admission refused this host", reasons=[f"admission: {r}" for r in report["reasons"]])
            return False
        host.noop(f"admitted: {len(report['checks'])} checks pass")
    for pool in dict.fromkeys(svc.pool for svc in plan.services):
        pool_admitted(name=f"Admission of pool {pool}", pool=pool, members=list(ctx.inventory.pools[pool].hosts),
                      verdicts=ctx.admission)
    return True
