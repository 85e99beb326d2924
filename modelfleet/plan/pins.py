"""Pins, resolved on the control node before any stage touches a host: each service's image digest (registry
HTTP API) and checkpoint commit (hub or mirror). The answers are cached for the run (registry.resolve_digest,
checkpoint.snapshot), so the stages' later look-ups never go out again; a failure becomes one line on the hosts
that needed it, naming what failed and what to do, instead of a traceback from inside a stage."""

from __future__ import annotations

import fnmatch

from modelfleet.base.registry import RegistryError, pinned
from modelfleet.plan.checkpoint import ModelSourceError, Snapshot, snapshot
from modelfleet.plan.inventory.plan import HostPlan, ServicePlan
from modelfleet.plan.inventory.schema import COMMIT_RE


def pinned_image(svc: ServicePlan) -> str:
    """`repo:tag@sha256:...` for the service: what the images stage pulls and the unit runs ("" for a venv
    engine: its lock's hashes pin it)."""
    return pinned(svc.image) if svc.image else ""


def pinned_revision(plan: HostPlan, svc: ServicePlan, **pinned) -> ServicePlan:
    """The service at the commit its revision resolves to (what this stage fetches and the unit mounts), with
    the file the engine loads when the recipe names it by pattern (a GGUF's first shard). `pinned`: other
    pinned fields, set in the same rebuild of the service."""
    needs_files = bool(svc.model_file and any(c in svc.model_file for c in "*?["))
    if svc.revision and COMMIT_RE.match(svc.revision) and not needs_files:
        return svc.at_commit(svc.revision, **pinned)  # already immutable: no need to ask the hub
    snap = checkpoint_of(plan, svc)
    if not needs_files:
        return svc.at_commit(snap.commit, **pinned)
    found = sorted(fnmatch.filter(snap.files, svc.model_file))
    if not found:
        raise ModelSourceError(f"{snap.repo}@{snap.commit[:12]} has no file matching {svc.model_file} "
                               f"(recipe {svc.recipe.id})")
    return svc.at_commit(snap.commit, model_file=found[0], **pinned)


def checkpoint_of(plan: HostPlan, svc: ServicePlan) -> Snapshot:
    """The service's checkpoint: only the files it needs (a GGUF repository holds every quantization)."""
    snap = snapshot(svc.hf_repo, svc.revision, plan.hf_endpoint, plan.hf_token_env, plan.model_source)
    return snap.only(svc.checkpoint_patterns)


def pinned_service(plan: HostPlan, svc: ServicePlan) -> ServicePlan:
    """The service as its unit runs it: image by digest, checkpoint at its commit."""
    return pinned_revision(plan, svc, image=pinned_image(svc))


def problems(plan: HostPlan, images: bool = True, revisions: bool = True, listings: bool = False) -> list[str]:
    """Each pin this host needs that cannot be resolved, as one line saying what to do. `listings`: the
    checkpoint's file list too (what the model stage fetches), asked even where the revision is a commit."""
    out = []
    for svc in plan.services:
        if images:
            try:
                pinned_image(svc)
            except RegistryError as error:
                out.append(f"image digest: {error}; check the registry (image_registry / network) and re-run")
        if revisions or listings:
            try:
                pinned_revision(plan, svc)
                if listings:
                    checkpoint_of(plan, svc)
            except ModelSourceError as error:
                out.append(f"checkpoint revision: {error}; check hf_endpoint / model_source and the token, "
                           "then re-run")
    if images and plan.dcgm_exporter and plan.hardware.vendor == "nvidia":
        try:
            pinned(plan.dcgm_exporter_image)
        except RegistryError as error:
            out.append(f"image digest: {error}; check the registry and re-run")
    return out
