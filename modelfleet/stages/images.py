"""Stage images: pull each service's image by the digest its tag resolved to, once per run, on the control node."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import StringCommand, deploy, operation

from modelfleet.facts.engine import DockerImage
from modelfleet.inventory import ServicePlan
from modelfleet.registry import pinned
from modelfleet.stages import host_plan


def pinned_image(svc: ServicePlan) -> str:
    """`repo:tag@sha256:...` for the service: what the images stage pulls and the unit runs."""
    return pinned(svc.image)


@operation()
def image_present(image: str):
    """`docker pull` the pinned reference unless an image with that digest is already local."""
    if host.get_fact(DockerImage, image=image):
        host.noop(f"image {image} is present")
        return
    yield StringCommand("docker", "pull", "--quiet", image)


@deploy("modelfleet images")
def run():
    for svc in host_plan().services:
        image_present(name=f"Pull {svc.image} (pinned digest)", image=pinned_image(svc))
