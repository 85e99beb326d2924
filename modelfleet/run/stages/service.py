"""Stage service: systemd unit + 0600 env file per service; restart only on change; wait until ready."""

from __future__ import annotations

import posixpath

from pyinfra import host
from pyinfra.api import deploy

from modelfleet.base.host_commands import gpus_free_script
from modelfleet.host import fabric_run
from modelfleet.host.operations.files import content_file, directory
from modelfleet.host.operations.mounts import MOUNTINFO, private_bind
from modelfleet.host.operations.owned_unit import owned_running, refused_when_kept, unmasked
from modelfleet.host.operations.report import fail_host, note_once
from modelfleet.host.operations.service import (
    flaps_forgotten,
    gpus_freed,
    restarts_counted,
    unit_retired,
    wait_ready,
    worker_up,
)
from modelfleet.host.units import (
    FLAP_LIMIT,
    UNIT_DIR,
    edited,
    engine_edited,
    flap_file,
    pinned_services,
    start_reads,
    unit_files,
    weights_paths,
)
from modelfleet.plan import caches, render
from modelfleet.plan.inventory.plan import HostPlan
from modelfleet.run import timeline
from modelfleet.run.context import HostRun

NAME = "service"
PINS: frozenset[str] = frozenset({"images", "revisions"})


def wants(plan: HostPlan, probe: dict) -> dict:
    """What this stage reads from the host's DeployedState."""
    services, unit_reads = pinned_services(plan), start_reads(plan)
    paths = [plan.config_dir] + [svc.model_dir for svc in services] + unit_reads["paths"]
    paths += [render.store_dir(svc) for svc in services if svc.engine.registration]
    paths += [svc.auth_file for svc in services if render.api_key(svc)]
    paths += [path for svc in services for path in _cache_paths(render.engine_cache(svc))]
    # A replica's unit under its pool's name: only whether its file is there (it is retired if so).
    paths += [f"{UNIT_DIR}/{svc.legacy_unit_name}" for svc in services if svc.legacy_unit_name]
    texts = [MOUNTINFO] if any(map(render.engine_cache, services)) else []
    return {"paths": paths, "units": unit_reads["units"], "texts": texts}


def _cache_paths(cache) -> list[str]:
    return [cache.root, cache.dir, cache.key_file] if cache else []



def _engine_cache(svc, state: dict, bound: set[str]) -> None:
    """The service's engine cache directory and key file, its caches' directory bound nosuid,nodev once per
    host (`bound`). A key change is a unit change: the engine restarts on it."""
    cache = render.engine_cache(svc)
    if not cache:
        return
    at = state["paths"].get
    directory(name=f"Engine cache root {cache.root}", path=cache.root, current=at(cache.root))
    # A venv engine runs as its own user (not a container's root): its cache directory is that user's.
    directory(name=f"Engine cache {cache.dir}", path=cache.dir, current=at(cache.dir), user=cache.owner,
              group=cache.owner)
    caches_dir = posixpath.dirname(cache.root)  # the container writes code there: nosuid,nodev
    if caches_dir not in bound:
        bound.add(caches_dir)
        private_bind(name=f"Engine caches {caches_dir} (nosuid,nodev)", path=caches_dir,
                     mountinfo=state["texts"].get(MOUNTINFO))
    content_file(name=f"Engine cache key {cache.key_file}", dest=cache.key_file, content=cache.key_json,
                 current=at(cache.key_file), mode="0644")


def _prune_caches(services: list, keep: int, at) -> None:
    """Engine cache keys no service of the host uses, beyond the `keep` newest, in each cache root."""
    in_use: dict[str, set[str]] = {}
    for cache in filter(None, map(render.engine_cache, services)):
        in_use.setdefault(cache.root, set()).add(cache.key)
    for root, keys in in_use.items():
        caches.caches_pruned(name=f"Prune engine cache keys in {root} beyond {keep}", root=root,
                             stale=caches.stale_keys((at(root) or {}).get("entries"), keys), keep=keep)


def _rank_lost(ctx: HostRun, svc) -> bool:
    """A rank of the service's pool died and systemd restarted it: it cannot rejoin, so every rank restarts;
    each host counts the pool restarts its rank caused in a row, and a rank that caused FLAP_LIMIT of them is
    held out (named, its host failed) instead of restarting the pool on every converge."""
    if svc.nnodes < 2:
        return False
    lost, flaps = ctx.ranks_restarted(svc.pool), ctx.rank_flaps(svc.pool)
    held = {name for name in lost if flaps.get(name, 0) >= FLAP_LIMIT}
    mine, path = flaps.get(ctx.plan.name, 0), flap_file(ctx.plan, svc.pool)
    if ctx.plan.name in held:
        fail_host(name=f"Pool {svc.pool}: rank held out", reasons=[
            f"pool {svc.pool}: rank on {ctx.plan.name} held out: it died again after {mine} pool restarts in a "
            f"row (limit {FLAP_LIMIT}); the pool is not restarted for it (journalctl -u {svc.unit_name}); once "
            f"fixed, remove {path} on {ctx.plan.name} and re-run"])
    elif held:
        note_once(name=f"Pool {svc.pool}: a rank held out", message=f"modelfleet: pool {svc.pool}: rank on "
                  f"{', '.join(sorted(held))} held out after {FLAP_LIMIT} pool restarts in a row: not restarting "
                  "the pool for it")
    if ctx.plan.name in lost and ctx.plan.name not in held:
        content_file(name=f"Pool restarts in a row its rank caused ({path})", dest=path, content=f"{mine + 1}\n",
                     current=ctx.deployed()["paths"].get(path), mode="0644")
    elif mine and ctx.plan.name not in lost:  # it stayed up since the last converge: the count starts again
        flaps_forgotten(name=f"Its rank stayed up: {path} removed", path=path)
    lost = {name: n for name, n in lost.items() if name not in held}
    if lost:
        where = ", ".join(f"{name} ({n} time{'s' * (n > 1)})" for name, n in sorted(lost.items()))
        note_once(name=f"Pool {svc.pool}: a rank died", message=f"modelfleet: pool {svc.pool}: systemd restarted "
                  f"its rank on {where} after it died; a restarted rank cannot rejoin the ranks still running: "
                  "restarting the pool on every host")
    return bool(lost)


def _restarts_counted(started: list) -> None:
    """Each rank of a pool across hosts started in this run counts systemd's restarts from here: its head's ready
    wait is an earlier operation, run on every host first, so the pool is up."""
    for svc in started:
        if svc.nnodes > 1:
            restarts_counted(name=f"Count {svc.unit_name}'s restarts from here (pool {svc.pool} is up)",
                             unit=svc.unit_name)


@deploy("modelfleet service")
def run(ctx: HostRun):
    plan = ctx.plan
    refused = fabric_run.refusals(ctx, plan.services)
    if refused:  # a pool across hosts whose fabric is wrong: no unit of it starts
        fail_host(name="Pool fabric", reasons=refused)
        return
    services = [ctx.as_run(svc) for svc in pinned_services(plan)]
    state = ctx.deployed()
    at = state["paths"].get
    units = {unit: state["units"].get(unit) or {} for unit in start_reads(plan)["units"]}
    if refused_when_kept(plan.unit_dropins == "keep", units):  # the site's own: refused by name, nothing touched
        return

    directory(name=f"Config directory {plan.config_dir} (0700)", path=plan.config_dir,
              current=at(plan.config_dir), mode="0700")
    bound: set[str] = set()
    started = []
    for svc in services:
        files_, key = unit_files(svc), render.api_key(svc)
        directory(name=f"Model directory {svc.model_dir}", path=svc.model_dir, current=at(svc.model_dir))
        if svc.engine.registration:  # the engine's own store, on the model root beside the revision
            directory(name=f"Model store {render.store_dir(svc)}", path=render.store_dir(svc),
                      current=at(render.store_dir(svc)))
        _engine_cache(svc, state, bound)  # before the unit that mounts it
        old = svc.legacy_unit_name
        if old and at(f"{UNIT_DIR}/{old}"):  # the same replica under its pool's name: stopped, then replaced
            note_once(name=f"Unit {old}: replaced", message=f"modelfleet: {old} serves as {svc.unit_name} (replicas "
                      "of a model share one unit name): stopping and removing it")
            unit_retired(name=f"Retire {old}", unit=old, path=f"{UNIT_DIR}/{old}")
        changed = edited(svc, state)
        unit = units[svc.unit_name]
        extra = unmasked(svc.unit_name, unit)
        weights = weights_paths(svc)
        cache_unit = posixpath.basename(weights[0]) if weights else ""
        cache_extra = unmasked(cache_unit, units[cache_unit]) if weights else None
        for path, content, mode, secret in files_:
            content_file(name=f"File {path} ({mode})", dest=path, content=content, current=at(path), mode=mode,
                         secret=secret)
        if key:
            content_file(name=f"Client auth header {svc.auth_file} (0600)", dest=svc.auth_file,
                         content=f"Authorization: Bearer {key}\n", current=at(svc.auth_file), mode="0600",
                         secret=True)
        if weights:  # first, and waited for (its ExecStartPost): the engine then maps the weights it loaded
            owned_running(cache_unit, units[cache_unit], cache_extra, reload=changed[weights[0]],
                          restart=changed[weights[0]])
        restart = _rank_lost(ctx, svc) | engine_edited(svc, state)  # both: the rank's count is kept either way
        if svc.hardware.vendor == "nvidia" and svc.gpu_indices and svc.gpu_passthrough and (
                restart or extra.restart or unit.get("ActiveState") != "active"):
            gpus_freed(name=f"{svc.unit_name}: its GPUs {','.join(map(str, svc.gpu_indices))} free before it "
                       "starts", unit=svc.unit_name, script=gpus_free_script(
                           svc.unit_name, svc.gpu_indices,
                           stop=unit.get("ActiveState") in ("active", "activating", "reloading")))
        starts = owned_running(svc.unit_name, unit, extra, reload=changed[f"{UNIT_DIR}/{svc.unit_name}"],
                               restart=restart)
        timeline.watch(host.name, svc.pool)
        if starts and svc.node_rank:
            worker_up(name=f"Worker {svc.unit_name} (rank {svc.node_rank} of pool {svc.pool}) stays up",
                      unit=svc.unit_name)
        elif starts:
            wait_ready(name=f"Wait until {svc.served_name} answers at {svc.base_url}", unit=svc.unit_name,
                       base_url=svc.base_url, served_name=render.listed_name(svc),
                       timeout_s=svc.recipe.ready_timeout_s, auth_file=svc.auth_file if key else None,
                       health_path=svc.engine.health_path, on_ready=timeline.reached(svc.pool, "ready"))
        if starts:
            started.append(svc)
            timeline.boot_recorded(name=f"Boot timeline of {svc.container_name}", pool=svc.pool,
                                   engine=svc.engine_name, container=svc.container_name)
    _restarts_counted(started)
    _prune_caches(services, plan.model_keep_revisions, at)
