"""Pins, resolved on the control node before any stage touches a host: each service's image digest (registry
HTTP API) and checkpoint commit (hub or mirror). The answers are cached for the run (registry.resolve_digest,
checkpoint.snapshot), so the stages' later look-ups never go out again; a failure becomes one line on the hosts
that needed it, naming what failed and what to do, instead of a traceback from inside a stage."""

from __future__ import annotations

from modelfleet.checkpoint import ModelSourceError
from modelfleet.inventory import HostPlan
from modelfleet.registry import RegistryError, pinned


def problems(plan: HostPlan, images: bool = True, revisions: bool = True) -> list[str]:
    from modelfleet.stages.model import pinned_revision  # the model stage owns what a revision resolves to

    out = []
    for svc in plan.services:
        if images:
            try:
                pinned(svc.image)
            except RegistryError as error:
                out.append(f"image digest: {error}; check the registry (image_registry / network) and re-run")
        if revisions:
            try:
                pinned_revision(plan, svc)
            except ModelSourceError as error:
                out.append(f"checkpoint revision: {error}; check hf_endpoint / model_source and the token, "
                           "then re-run")
    if images and plan.dcgm_exporter and plan.hardware.vendor == "nvidia":
        try:
            pinned(plan.dcgm_exporter_image)
        except RegistryError as error:
            out.append(f"image digest: {error}; check the registry and re-run")
    return out
