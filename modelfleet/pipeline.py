"""The stage pipeline, in DESIGN.md order. Later stages (os_base, gpu_driver, container_runtime, storage,
model, netcheck, verify) slot into PIPELINE without touching the others."""

from __future__ import annotations

from modelfleet.stages import images, preflight, service

PIPELINE = (images, service)


def serve(stages=PIPELINE) -> None:
    """Preflight, then the stages: a refused host gets none of them (and --dry shows none)."""
    if not preflight.run():
        return
    for stage in stages:
        stage.run()
