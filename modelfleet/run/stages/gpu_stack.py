"""Stage gpu_stack: a bare node to GPU-visible containers, in three parts that run in this order: os_base (the
tools and kernel headers the stack builds on), gpu_driver (driver, Fabric Manager, the reboot it may need) and
container_runtime (Docker, the NVIDIA toolkit, CDI). The stage decides the driver first, so a host it refuses
gets nothing from os_base either, and writes one report of all three: reports/gpu_stack/<host>.json."""

from __future__ import annotations

from pyinfra import host, state

from modelfleet.host import os as osfam
from modelfleet.host.operations.report import fail_host, report_path, save_report, write_report
from modelfleet.plan.inventory.plan import HostPlan
from modelfleet.run.context import HostRun
from modelfleet.run.stages import container_runtime, gpu_driver, os_base

NAME = "gpu_stack"
PINS: frozenset[str] = frozenset()
PARTS = (os_base, gpu_driver, container_runtime)


def managed(plan: HostPlan) -> bool:
    """Someone else's stack (pre-built hosts, `gpu_stack: false`) or no GPUs: no operations, no report."""
    return plan.stack_ours


def wants(plan: HostPlan, probe: dict) -> dict:
    out: dict[str, list[str]] = {}
    for part in PARTS if managed(plan) else ():
        for kind, items in part.wants(plan, probe).items():
            out.setdefault(kind, []).extend(items)
    return out


def run(ctx: HostRun) -> bool:
    """True when the host can go on (no refusal, no reboot pending). A pending reboot stops the host when
    serving stages follow (they fail it, saying why); on its own the stack just reports it. Not a @deploy of its
    own: its parts are, so their operations keep their names (`modelfleet gpu_driver | ...`)."""
    plan = ctx.plan
    if not managed(plan):
        return True
    deployed = ctx.deployed()
    decided = gpu_driver.decide(plan, ctx.probe, deployed)
    if decided.problems:  # before os_base changes anything
        fail_host(name="GPU driver: refused", reasons=decided.problems)
        return False
    before = set(state.ops[host])
    fam = osfam.family(ctx.probe.get("os"))
    # Secure Boot: Canonical's signed module for this kernel is in the archive, or nothing is installed at all.
    fam.in_archive(name="Signed NVIDIA module for the running kernel", package=decided.signed_modules,
               refusal=decided.signed_refusal, current=deployed["packages"])
    os_base.run(ctx, builds_module=decided.builds_module)
    driver = gpu_driver.run(ctx, decided=decided)
    installed = deployed["packages"]
    runtime = container_runtime.run(ctx, driver_changes=bool(driver.installs(installed)) or driver.reboot,
                                    reboot_pending=driver.pending)
    base = fam.missing(os_base.base_packages(plan, ctx.probe.get("os"), driver.builds_module), installed)
    report = {
        "host": plan.name, "managed": plan.stack.manage, "vendor": driver.vendor,
        "stages": ["preflight", *(part.NAME for part in PARTS)],
        "driver_loaded_before": driver.loaded, "driver_branch": plan.stack.driver_branch,
        "driver_source": driver.source, "secure_boot": (ctx.probe.get("os") or {}).get("secure_boot"),
        "packages_installed": sorted({*base, *driver.installs(installed), *fam.missing(runtime.packages, installed)}),
        "fabric_manager": {"packages": driver.exact, "at_version": driver.exact_version or
                           ("the installed driver's" if driver.exact else None)},
        "reboot": {"needed": driver.reboot, "taken": driver.reboot and driver.allowed_reboot,
                   "pending": driver.pending, "reason": driver.reboot_reason},
        "docker_restarted": runtime.restart_docker, "cdi_generated": runtime.cdi,
        # A kernel update waiting for its boot: the DKMS module must be built for that kernel too; not acted on.
        "kernel_update_pending": fam.reboot_needed(deployed),
        # Known before the run: does any stack operation send a command? If none does, the report is true
        # now (and a converged host shows no change); otherwise it is written once those operations succeeded.
        "changes": any(state.get_op_data_for_host(host, h).operation_meta.will_change
                       for h in state.ops[host] if h not in before),
    }
    if report["changes"]:
        write_report(name="GPU stack report", path=str(report_path(NAME, plan.name)), report=report)
    else:
        save_report(NAME, plan.name, report)
    if driver.pending and ctx.followed():
        fail_host(name="Reboot pending", reasons=[f"reboot pending ({driver.reboot_reason}): the serving stages wait "
                                                  "for the new driver; re-run without `reboot: false`"])
    return not driver.pending
