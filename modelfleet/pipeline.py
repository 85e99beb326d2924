"""The stage pipeline, in DESIGN.md order. Later stages (os_base, gpu_driver, container_runtime, storage)
slot into PIPELINE without touching the others."""

from __future__ import annotations

from modelfleet.stages import deployed_of, images, model, netcheck, preflight, service, use_stages, verify

PIPELINE = (model, images, netcheck, service, verify)


def serve(stages=PIPELINE) -> None:
    """
    Preflight, then the stages: a refused host gets none of them (and --dry shows none). What the stages
    find on the host is read once for all of them.
    """
    if not preflight.run():
        return
    use_stages(stages)
    deployed = deployed_of()
    for stage in stages:
        stage.run(deployed=deployed)
