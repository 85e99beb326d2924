"""Stage images: pull each service's image by the digest its tag resolved to, once per run, on the control node;
or, for a venv engine (runtime venv), build its venv from its lock."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import StringCommand, deploy, operation

from modelfleet.host.operations.venv import engine_user, venv_built, venvs_pruned
from modelfleet.plan import venvs
from modelfleet.plan.inventory.plan import HostPlan
from modelfleet.plan.pins import pinned_image
from modelfleet.run.context import HostRun

NAME = "images"
PINS: frozenset[str] = frozenset({"images"})


@operation()
def image_present(image: str, current: dict | None):
    """`docker pull` the pinned reference unless an image with that digest is already local (`current`)."""
    if current:
        host.noop(f"image {image} is present")
        return
    yield StringCommand("docker", "pull", "--quiet", image)


def wants(plan: HostPlan, probe: dict) -> dict:
    """What this stage reads from the host's DeployedState."""
    built = [svc.venv for svc in plan.services if svc.venv]
    images = {"images": [pinned_image(svc) for svc in plan.services if not svc.venv]}
    return {**images, "paths": [venvs.VENV_ROOT, *(v.marker for v in built)], "texts": [venvs.USER_LINE]} \
        if built else images


@deploy("modelfleet images")
def run(ctx: HostRun):
    plan = ctx.plan
    # Read in the deploy body, not the operation: an operation's body runs twice (prepare and execute).
    state = ctx.deployed()
    present = state["images"]
    for svc in plan.services:
        if svc.venv:
            continue
        image = pinned_image(svc)
        image_present(name=f"Pull {svc.image} (pinned digest)", image=image, current=present.get(image))
    built = [svc.venv for svc in plan.services if svc.venv]
    if not built:
        return
    at = state["paths"].get
    engine_user(name=f"User {venvs.ENGINE_USER} (venv engines)", present=venvs.user_present(
        state["texts"].get(venvs.USER_LINE)))
    for venv in dict.fromkeys(built):
        venv_built(name=f"Venv {venv.path} ({venv.engine} {venv.version}, lock {venv.lock_digest[:12]})",
                   venv=venv, built=bool(at(venv.marker)))
    venvs_pruned(name=f"Prune {venvs.VENV_ROOT}", entries=(at(venvs.VENV_ROOT) or {}).get("entries"),
                 in_use={v.name for v in built})
