"""The entry points as functions of the installed package, so a site needs no checkout to run them:

    pyinfra inventories/prod.py modelfleet.deploys.serve          # what deploys/serve.py does
    pyinfra inventories/prod.py modelfleet.deploys.preflight --dry

or, from a site's own deploy file, `from modelfleet.deploys import serve; serve()`. Each runs the stages (each
a pyinfra @deploy) for the current host; the checkout's deploys/*.py call these and nothing else.
"""

from __future__ import annotations

import functools

from pyinfra import host
from pyinfra.context import ctx_state

from modelfleet import pins, pipeline, runlock
from modelfleet.operations.report import fail_host, note_once
from modelfleet.stages import deployed_of, host_plan, use_stages
from modelfleet.stages import images as images_stage
from modelfleet.stages import model as model_stage
from modelfleet.stages import netcheck as netcheck_stage
from modelfleet.stages import preflight as preflight_stage
from modelfleet.stages import storage as storage_stage
from modelfleet.stages import verify as verify_stage


def entry_point(images: bool = False, revisions: bool = False):
    """What every entry does first: the host's run lock (modelfleet.runlock; a host another run holds is
    refused with the holder named), then the pins the entry needs (modelfleet.pins). A host refused by either
    gets no stage at all."""

    def wrap(entry):
        @functools.wraps(entry)
        def guarded() -> None:
            taken, message = runlock.acquire(ctx_state.get(), host)
            if not taken:
                fail_host(name="Run lock", reasons=[message])
                return
            if message:
                note_once(name="Run lock", message=message)
            unpinned = pins.problems(host_plan(), images, revisions) if images or revisions else []
            if unpinned:
                fail_host(name="Pins", reasons=unpinned)
                return
            entry()

        return guarded

    return wrap


@entry_point(images=True, revisions=True)
def serve() -> None:
    """Every stage: preflight, the GPU host stack, storage, model, images, netcheck, service, verify, exporters."""
    pipeline.serve()


@entry_point()
def gpu_stack() -> None:
    """Preflight and the host stack (os_base, gpu_driver, container_runtime): a bare node to GPU containers."""
    pipeline.stack_only()


@entry_point(images=True, revisions=True)
def prefetch() -> None:
    """What an upgrade needs, fetched while the old revision and image keep serving: storage, model (the new
    revision beside the old one) and images (the new image pulled). No unit is touched."""
    order = (storage_stage, model_stage, images_stage)
    use_stages(order)
    deployed = deployed_of()
    for stage in order:
        stage.run(deployed=deployed)


@entry_point()
def preflight() -> None:
    """Facts and the plan's checks only; refuses a host that cannot serve (nothing is changed)."""
    preflight_stage.run()


@entry_point()
def storage() -> None:
    storage_stage.run()


@entry_point(revisions=True)
def model() -> None:
    model_stage.run()


@entry_point(images=True, revisions=True)
def netcheck() -> None:
    netcheck_stage.run()


@entry_point()
def verify() -> None:
    verify_stage.run()
