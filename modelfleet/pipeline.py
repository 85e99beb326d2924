"""The stage pipeline, in DESIGN.md order. The GPU-stack stages (os_base, gpu_driver, container_runtime) are not
built yet; they slot in before storage without touching the others."""

from __future__ import annotations

from modelfleet.stages import (
    deployed_of,
    exporters,
    images,
    model,
    netcheck,
    preflight,
    service,
    storage,
    use_stages,
    verify,
)

PIPELINE = (storage, model, images, netcheck, service, verify, exporters)


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
