"""The entry points as functions of the installed package, so a site needs no checkout to run them:

    pyinfra inventories/prod.py modelfleet.run.deploys.serve          # what deploys/serve.py does
    pyinfra inventories/prod.py modelfleet.run.deploys.preflight --dry

or, from a site's own deploy file, `from modelfleet.run.deploys import serve; serve()`. Each runs the stages (each
a pyinfra @deploy) for the current host; the checkout's deploys/*.py each call theirs and nothing else, so a
deploy's stages are written here only.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from pyinfra import host
from pyinfra.context import ctx_state

from modelfleet.host.facts.state import DeployedState
from modelfleet.host.operations.report import fail_host, note_once
from modelfleet.host.units import UNIT_DIR
from modelfleet.plan import pins
from modelfleet.run import pipeline, runlock
from modelfleet.run.retire import CHECKPOINTS_ENV, guarded, say_plan, to_retire, units_retired
from modelfleet.run.stages import admission as admission_stage
from modelfleet.run.stages import gpu_stack as gpu_stack_stage
from modelfleet.run.stages import images
from modelfleet.run.stages import model as model_stage
from modelfleet.run.stages import netcheck as netcheck_stage
from modelfleet.run.stages import preflight as preflight_stage
from modelfleet.run.stages import storage as storage_stage
from modelfleet.run.stages import verify as verify_stage


def _entry_point(function: Callable[[], None]) -> Callable[[], None]:
    """Marks a function of this module as an entry point: DEPLOYS (at the end) names it."""
    function.is_entry_point = True
    return function


def deploy(name: str) -> str:
    """The pyinfra deploy argument for one of DEPLOYS (works from an installed package and a checkout alike)."""
    if name not in DEPLOYS:
        raise ValueError(f"no deploy {name!r} (deploys: {', '.join(DEPLOYS)})")
    return f"{__name__}.{name}"


def run_stages(*stages) -> None:
    """
    The host's run lock (modelfleet.run.runlock: a host another run holds is refused, with the holder named),
    then the pins these stages need (modelfleet.plan.pins: one line per failure), then the stages in the order
    given (modelfleet.run.pipeline). A host refused by the lock or the pins gets no stage at all.
    """
    taken, message = runlock.acquire(ctx_state.get(), host)
    if not taken:
        fail_host(name="Run lock", reasons=[message])
        return
    if message:
        note_once(name="Run lock", message=message)
    ctx, needed = pipeline.context(stages), {pin for stage in stages for pin in stage.PINS}
    unpinned = pins.problems(ctx.plan, images="images" in needed, revisions="revisions" in needed,
                             listings="listings" in needed)
    if unpinned:
        fail_host(name="Pins", reasons=unpinned)
        return
    pipeline.run_stages(*stages, ctx=ctx)


@_entry_point
def serve() -> None:
    """Every stage, in pipeline.SERVE's order (what deploys/serve.py runs)."""
    run_stages(*pipeline.SERVE)


@_entry_point
def gpu_stack() -> None:
    """Preflight and the host stack: a bare node to GPU-visible containers, nothing that serves."""
    run_stages(preflight_stage, gpu_stack_stage)


@_entry_point
def prefetch() -> None:
    """What an upgrade needs, fetched while the old revision and image keep serving: the new revision beside
    the old one, the new image pulled. No unit is touched."""
    run_stages(storage_stage, model_stage, images)


@_entry_point
def admission() -> None:
    """Preflight, then the GPU admission checks (reports/admission/<host>.json); nothing is changed."""
    run_stages(preflight_stage, admission_stage)


@_entry_point
def preflight() -> None:
    """Facts and the plan's checks only; refuses a host that cannot serve (nothing is changed)."""
    run_stages(preflight_stage)


@_entry_point
def storage() -> None:
    run_stages(storage_stage)


@_entry_point
def model() -> None:
    run_stages(model_stage)


@_entry_point
def netcheck() -> None:
    run_stages(netcheck_stage)


@_entry_point
def verify() -> None:
    run_stages(verify_stage)


@_entry_point
def retire() -> None:
    """A host that left the inventory (`modelfleet retire INVENTORY HOST...` runs this over pyinfra's own host
    arguments): every unit modelfleet wrote there stopped and removed, nothing else (modelfleet.run.retire). The
    command's guard comes first: a host reached at an address the inventory still serves, or not at the one
    checked before connecting, is refused before anything is asked of it."""
    refused = guarded()
    if refused:
        say_plan([], refused)
        fail_host(name="Retire guard", reasons=[refused])
        return
    taken, message = runlock.acquire(ctx_state.get(), host)
    if not taken:
        fail_host(name="Run lock", reasons=[message])
        return
    retired = to_retire(host.get_fact(DeployedState, owned=(UNIT_DIR,))["owned"].get(UNIT_DIR) or {})
    say_plan(retired)
    units_retired(name="Retire " + (", ".join(r.unit for r in retired) or "units") + " (host not in the inventory)",
                  retired=retired, remove_checkpoints=os.environ.get(CHECKPOINTS_ENV) == "1")


# The entry points by name, each defined once above with @_entry_point (a checkout's deploys/<name>.py calls it).
DEPLOYS = tuple(name for name, value in list(globals().items()) if getattr(value, "is_entry_point", False))
