"""The stage pipeline: the stages a deploy names (each keeps modelfleet.run.stages.Stage's contract), run in order
for the current host, each with the host's run context, until one says the host goes no further."""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.state import BaseStateCallback

from modelfleet.base import op_order, runscope
from modelfleet.run.context import HostRun, host_run
from modelfleet.run.stages import (
    admission,
    engine_cache,
    exporters,
    gpu_stack,
    images,
    imex,
    model,
    netcheck,
    preflight,
    retire,
    router,
    service,
    storage,
    verify,
)

# What `pyinfra INVENTORY deploys/serve.py` runs (through modelfleet.run.deploys.serve): the stage list's one home.
SERVE = (preflight, gpu_stack, admission, storage, model, engine_cache, images, imex, netcheck, service, router, retire,
         verify, exporters)


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


def context(stages) -> HostRun:
    """The host's run context for these stages (one alone when it is the only one besides preflight)."""
    return host_run(tuple(stages), alone=len([s for s in stages if s is not preflight]) == 1)


def run_stages(*stages, ctx: HostRun | None = None) -> None:
    """
    The stages, in the order given, for the current host, until one returns False (preflight refusing the
    host, the GPU stack waiting for a reboot, admission refusing its GPUs): the host gets nothing more, and
    --dry shows nothing more. What they find on the host is read once for all of them. Operations are ordered
    by modelfleet.base.op_order where this pyinfra release is one it was checked against.
    """
    op_order.install()
    runscope.attached("lost hosts", _LostHosts)
    ctx = ctx or context(stages)
    for stage in stages:
        ctx.stage = stage
        if stage.run(ctx) is False:
            return
