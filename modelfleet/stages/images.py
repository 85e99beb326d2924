"""Stage images: pull each service's image by the digest its tag resolved to, once per run, on the control node."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import StringCommand, deploy, operation

from modelfleet.context import HostRun
from modelfleet.inventory import HostPlan
from modelfleet.pins import pinned_image

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
    return {"images": [pinned_image(svc) for svc in plan.services]}


@deploy("modelfleet images")
def run(ctx: HostRun):
    plan = ctx.plan
    # Read in the deploy body, not the operation: an operation's body runs twice (prepare and execute).
    present = ctx.deployed()["images"]
    for svc in plan.services:
        image = pinned_image(svc)
        image_present(name=f"Pull {svc.image} (pinned digest)", image=image, current=present.get(image))
