"""The stage pipeline, in order: preflight, the GPU host stack (os_base, gpu_driver,
container_runtime), then the serving stages."""

from __future__ import annotations

import weakref

from pyinfra import host, logger, state
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_state

from modelfleet import op_order
from modelfleet.context import HostRun, host_run
from modelfleet.operations.apt import missing
from modelfleet.operations.report import fail_host, report_path, save_report, write_report
from modelfleet.stages import (
    admission,
    container_runtime,
    engine_cache,
    exporters,
    gpu_driver,
    images,
    imex,
    model,
    netcheck,
    os_base,
    preflight,
    router,
    service,
    storage,
    verify,
)

STACK = (os_base, gpu_driver, container_runtime)
# What `pyinfra INVENTORY deploys/serve.py` runs (deploys/serve.py names the same list).
SERVE = (preflight, *STACK, admission, storage, model, engine_cache, images, imex, netcheck, service, router, verify,
         exporters)


def gpu_stack(ctx: HostRun, serving: bool) -> bool:
    """The host stack; True when the host can go on to serve (no refusal, no reboot pending). A pending
    reboot stops the host when serving stages follow; on its own the stack just reports it."""
    plan = ctx.plan
    if not plan.stack.manage or plan.hardware.vendor == "none":
        return True  # someone else's stack (pre-built hosts, `gpu_stack: false`): no operations, no report
    deployed = ctx.deployed()
    decided = gpu_driver.decide(plan, ctx.probe, deployed)
    if decided.problems:  # before os_base changes anything
        fail_host(name="GPU driver: refused", reasons=decided.problems)
        return False
    before = set(state.ops[host])
    os_base.run(ctx, builds_module=decided.builds_module)
    driver = gpu_driver.run(ctx, decided=decided)
    installed = deployed["packages"]
    runtime = container_runtime.run(ctx, driver_changes=bool(driver.installs(installed)) or driver.reboot,
                                    reboot_pending=driver.pending)
    base = missing(os_base.base_packages(plan, ctx.probe.get("os"), driver.builds_module), installed)
    report = {
        "host": plan.name, "managed": plan.stack.manage, "vendor": driver.vendor,
        "stages": ["preflight", "os_base", "gpu_driver", "container_runtime"],
        "driver_loaded_before": driver.loaded, "driver_branch": plan.stack.driver_branch,
        "packages_installed": sorted({*base, *driver.installs(installed), *missing(runtime.packages, installed)}),
        "fabric_manager": {"packages": driver.exact, "at_version": driver.exact_version or
                           ("the installed driver's" if driver.exact else None)},
        "reboot": {"needed": driver.reboot, "taken": driver.reboot and driver.allowed_reboot,
                   "pending": driver.pending, "reason": driver.reboot_reason},
        "docker_restarted": runtime.restart_docker, "cdi_generated": runtime.cdi,
        # A kernel update waiting for its boot: the DKMS module must be built for that kernel too; not acted on.
        "kernel_update_pending": bool(deployed["paths"].get(gpu_driver.REBOOT_REQUIRED)),
        # Known before the run: does any stack operation send a command? If none does, the report is true
        # now (and a converged host shows no change); otherwise it is written once those operations succeeded.
        "changes": any(state.get_op_data_for_host(host, h).operation_meta.will_change
                       for h in state.ops[host] if h not in before),
    }
    if report["changes"]:
        write_report(name="GPU stack report", path=str(report_path("gpu_stack", plan.name)), report=report)
    else:
        save_report("gpu_stack", plan.name, report)
    if driver.pending and serving:
        fail_host(name="Reboot pending", reasons=[f"reboot pending ({driver.reboot_reason}): the serving stages wait "
                                                  "for the new driver; re-run without `reboot: false`"])
        return False
    return not driver.pending


class _LostHosts(BaseStateCallback):
    """A host whose SSH connection went away under an operation (it restarted, lost power or network) gets one
    line saying so and what it was doing, beside pyinfra's bare `executed N commands`."""

    def operation_host_error(self, state, host, op_hash, retry_attempt, max_retries) -> None:
        client = getattr(host.connector, "client", None)
        transport = client.get_transport() if client is not None else None
        if transport is None or transport.is_active():
            return
        doing = ", ".join(sorted(state.get_op_meta(op_hash).names)) or "an operation"
        host.log_styled(f"modelfleet: {host.name} went away during '{doing}' (its SSH connection closed: the host "
                        "restarted, or lost power or network); re-run once it answers", fg="red",
                        log_func=logger.error)


_watched: weakref.WeakSet = weakref.WeakSet()


def _watch_lost_hosts() -> None:
    run = ctx_state.get()  # the State itself: pyinfra's `state` is a context proxy
    if run not in _watched:
        _watched.add(run)
        run.add_callback_handler(_LostHosts())


def context(stages) -> HostRun:
    """The host's run context for these stages (one alone when it is the only one besides preflight)."""
    rest = [s for s in stages if s not in STACK and s is not preflight]
    return host_run(tuple(s for s in stages if s is not preflight),
                    alone=len(rest) == 1 and not any(s in STACK for s in stages))


def run_stages(*stages, ctx: HostRun | None = None) -> None:
    """
    The stages, in the order given: preflight first when listed (a refused host gets nothing more, and --dry
    shows nothing more), the GPU host stack (os_base, gpu_driver, container_runtime, always the three) next,
    then the others. Each gets the host's run context; what they find on the host is read once for all.
    Operations are ordered by modelfleet.op_order where this pyinfra release is one it was checked against.
    """
    op_order.install()
    stack = tuple(s for s in stages if s in STACK)
    if stack and stack != STACK:
        raise ValueError("the GPU host stack runs as os_base, gpu_driver, container_runtime, in that order")
    rest = tuple(s for s in stages if s not in STACK and s is not preflight)
    ctx = ctx or context(stages)
    _watch_lost_hosts()
    judged = admission in stages and ctx.plan.admission and ctx.plan.hardware.vendor == "nvidia"
    if preflight in stages and not preflight.run(ctx, defer_stack=bool(stack), health=judged):
        return
    if stack and not gpu_stack(ctx, serving=bool(rest)):
        return
    for stage in rest:
        if stage.run(ctx) is False:  # a stage that refused the host (admission): nothing more
            return
