"""Stage preflight (read-only): does this host match the inventory and can it serve its recipes?"""

from __future__ import annotations

from pyinfra.api import deploy

from modelfleet.host.fabric import report as pool_fabric_report
from modelfleet.host.operations.report import fail_host, save_report
from modelfleet.plan import venvs
from modelfleet.plan.catalog import load_catalog
from modelfleet.plan.gpu_predicates import fabric_manager_needed, locality_notes, replaces_driver
from modelfleet.plan.inventory.plan import HostPlan
from modelfleet.plan.planner import expert_offload, plan_capacity
from modelfleet.run.context import HostRun

NAME = "preflight"
PINS: frozenset[str] = frozenset()


def _version_tuple(text: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in (text or "0").split(".") if p.isdigit())


def evaluate(plan: HostPlan, probe: dict, defer_stack: bool = False) -> dict:
    """
    Compare what the host reports with what the inventory and recipes need. Pure. `defer_stack`: the GPU
    stack stages run next (serve.py, gpu_stack.py), so what they fix (driver, Fabric Manager) is left to
    them and checked after they ran; GPU count and memory too while no wanted driver reports them.
    """
    problems: list[str] = []
    deferred: list[str] = []
    hw = plan.hardware
    gpus = (probe.get("nvidia_gpus") if hw.vendor == "nvidia" else probe.get("amd_gpus")) or []
    versions = probe.get("nvidia_versions") or {}
    pending = defer_stack and replaces_driver(plan, probe)
    if pending:
        next_stack = "ROCm " + plan.stack.rocm_version if hw.vendor == "amd" else "branch " + plan.stack.driver_branch
        deferred.append(f"GPU count, model, memory and driver version: checked after gpu_driver installs {next_stack}")
    module = (probe.get("nvidia_module") or {}).get("version")
    if hw.vendor == "nvidia" and not pending and module and not versions.get("driver"):
        # The kernel runs a module but nvidia-smi cannot talk to it: the libraries on disk are another release
        # (an upgrade, by hand or unattended, moved them under the running engine).
        problems.append(f"driver mismatch: the loaded kernel module is {module} but nvidia-smi fails (the "
                        "driver's libraries were changed without a reboot); reboot the host, then re-run")
    elif hw.vendor != "none" and not pending:
        if len(gpus) != plan.gpu_count:
            problems.append(f"GPU count: inventory says {plan.gpu_count}x {hw.id}, host has {len(gpus)}")
        wrong = sorted({g["name"] for g in gpus if hw.gpu_name and g["name"] != hw.gpu_name})
        if wrong:
            problems.append(f"GPU model: inventory says {hw.gpu_name}, host has {', '.join(wrong)}")
        small = [g for g in gpus if g["memory_total_mib"] < hw.hbm_mib]
        if small:
            problems.append(f"HBM: GPU {small[0]['index']} has {small[0]['memory_total_mib']} MiB, "
                            f"catalog expects {hw.hbm_mib} MiB")
    problems += host_ram_problems(plan, probe.get("mem_total_kib"))
    fabric = fabric_manager_problems(plan, probe)
    if defer_stack and plan.stack.manage and fabric:
        deferred += [f"{p} (gpu_driver installs it at the driver's version)" for p in fabric]
    else:
        problems += fabric
    services = []
    ports = {p["port"]: p for p in probe.get("ports") or []}
    disk = probe.get("disk") or {}
    disk_needed = 0.0
    for svc in plan.services:
        row, disk_bytes = _service_row(plan, svc, versions, ports, pending, probe.get("pythons") or {})
        services.append(row)
        disk_needed += disk_bytes
        problems += [f"{svc.pool}: {r}" for r in row["problems"]]
    if disk and disk_needed and hw.vendor != "none" and disk["avail"] < disk_needed:
        problems.append(f"disk: {disk['avail'] / 1e9:.1f} GB free on {disk['mount']} for {plan.model_root}, "
                        f"plan needs {disk_needed / 1e9:.1f} GB (checkpoint + temporary files + rollback copy)")
    return {
        "host": plan.name, "ok": not problems, "assessed": assess(plan, gpus), "problems": problems,
        "deferred": deferred, "locality": locality_notes(plan, probe.get("topology")),
        "gpus": [{"name": g["name"], "memory_total_mib": g["memory_total_mib"]} for g in gpus],
        "gpu_count": len(gpus), "driver": versions.get("driver"), "cuda": versions.get("cuda"),
        "kernel_module": probe.get("nvidia_module"), "fabric_manager": probe.get("fabric_manager"),
        "os": probe.get("os"),
        "container_runtime": probe.get("runtime"), "disk": disk, "services": services,
    }


def _service_row(plan: HostPlan, svc, versions: dict, ports: dict, pending: bool,
                 pythons: dict) -> tuple[dict, float]:
    """One service held to the host: the planner's fit, the recipe's driver and CUDA, its port free, a venv's
    interpreter; and the disk its checkpoint needs."""
    hw, recipe, reasons = plan.hardware, svc.recipe, []
    python = venvs.python_problem(svc.venv, pythons.get(svc.venv.python)) if svc.venv else None
    if python:
        reasons.append(f"venv_python: {python}")
    cap = plan_capacity(svc.model, hw, gpus=svc.gpus, nodes=svc.nnodes, recipe=recipe,
                        host_ram_gib=plan.host_ram_gib)
    if hw.vendor != "none" and not cap.fits:
        reasons.append(f"planner: {cap.reason}")
    if recipe.min_driver and hw.vendor == "nvidia" and not pending:
        driver = versions.get("driver")
        if _version_tuple(driver) < _version_tuple(recipe.min_driver):
            reasons.append(f"driver {driver or 'absent'} < {recipe.min_driver} required by {recipe.id}")
        if recipe.cuda and _version_tuple(versions.get("cuda")) < _version_tuple(recipe.cuda):
            reasons.append(f"CUDA {versions.get('cuda') or 'absent'} < {recipe.cuda} required by {recipe.id}")
    listener = ports.get(svc.port)
    if listener and listener["process"] not in ("", "docker-proxy") and svc.engine_name not in listener["process"]:
        reasons.append(f"port {svc.port} is in use by {listener['process']}")
    return ({"pool": svc.pool, "model": svc.model.id, "recipe": recipe.id, "fits": cap.fits,
             "capacity": cap.reason, "ok": not reasons, "problems": reasons}, cap.disk_needed_bytes)


def host_ram_problems(plan: HostPlan, mem_total_kib: int | None) -> list[str]:
    """A host whose llama.cpp recipe keeps MoE experts in RAM must have the RAM the plan sized with."""
    if not plan.host_ram_gib or mem_total_kib is None or not any(expert_offload(s.recipe) for s in plan.services):
        return []
    have = mem_total_kib / 2**20
    if have < plan.host_ram_gib:
        return [f"host RAM: /proc/meminfo says {have:.0f} GiB, the plan sized the experts in RAM against "
                f"host_ram_gib {plan.host_ram_gib} GiB: set host_ram_gib to what the host has, or less"]
    return []


def fabric_manager_problems(plan: HostPlan, probe: dict) -> list[str]:
    """NVSwitch systems need Fabric Manager at exactly the loaded driver's version (a mismatch is the usual cause
    of CUDA error 802); gpu_predicates.fabric_manager_needed says where."""
    fm = probe.get("fabric_manager") or {}
    driver = (probe.get("nvidia_versions") or {}).get("driver")
    if not fabric_manager_needed(plan, probe):
        return []
    if not fm.get("version"):
        return [f"Fabric Manager: not installed; {plan.hardware.id} with NVSwitch needs nvidia-fabricmanager "
                f"at the driver's version ({driver or 'no driver loaded'})"]
    if driver and fm["version"] != driver:
        return [f"Fabric Manager {fm['version']} does not match driver {driver} (the usual cause of CUDA error "
                "802): install the Fabric Manager package of exactly the driver's version"]
    return []


def assess(plan: HostPlan, gpus: list[dict]) -> list[dict]:
    """Would each `assess_models` entry fit the GPUs this host actually reported?"""
    if not gpus:
        return []
    measured = plan.hardware.model_copy(update={"hbm_mib": min(g["memory_total_mib"] for g in gpus)})
    cat = load_catalog()
    out = []
    for model_id in plan.assess_models:
        report = plan_capacity(cat.models[model_id], measured, gpus=len(gpus))
        out.append({"model": model_id, "fits": report.fits, "reason": report.reason})
    return out


def wants(plan: HostPlan, probe: dict) -> dict:
    return {}  # it reads the probe itself, with what the stages after it declare of it


@deploy("modelfleet preflight")
def run(ctx: HostRun) -> bool:
    """The probe carries what the stages of the run declare of it (the GPUs' health for admission: no round
    trip of its own); what the GPU stack stage will fix is deferred to it when it follows."""
    plan = ctx.plan
    probe = ctx.read_probe(health=any("gpu_health" in stage.wants(plan, {}).get("probe", ()) for stage in ctx.stages))
    report = evaluate(plan, probe, defer_stack=ctx.runs("gpu_stack"))
    report["fabric"] = {}
    for svc in plan.services:
        if svc.nnodes > 1:
            fabric = pool_fabric_report(ctx.fabric(svc.pool))
            report["fabric"][svc.pool] = fabric
            report["problems"] += [f"{svc.pool}: fabric: {line}" for line in fabric["errors"]]
            if plan.name == ctx.inventory.pools[svc.pool].hosts[0]:
                save_report("fabric", svc.pool, fabric)
    report["ok"] = not report["problems"]
    save_report("preflight", plan.name, report)
    if not report["ok"]:
        fail_host(name="Preflight refused this host", reasons=report["problems"])
    return report["ok"]
