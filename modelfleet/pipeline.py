"""The stage pipeline, in DESIGN.md order. Later stages (os_base, gpu_driver, container_runtime, storage,
model, netcheck) slot into PIPELINE without touching the others."""

from __future__ import annotations

from modelfleet.stages import host_plan, images, preflight, read_deployed, service, verify

PIPELINE = (images, service, verify)


def serve(stages=PIPELINE) -> None:
    """
    Preflight, then the stages: a refused host gets none of them (and --dry shows none). What the stages
    find on the host is read once for all of them.
    """
    if not preflight.run():
        return
    plan = host_plan()
    deployed = read_deployed([stage.wants(plan) for stage in stages])
    for stage in stages:
        stage.run(deployed=deployed)
