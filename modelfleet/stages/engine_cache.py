"""Stage engine_cache: a warm engine cache reaches the hosts whose services have the same cache key, before their
engines start (modelfleet/caches.py: the key says a copy is valid there).

A host holds a warm cache for a key when that key's directory has files. It can give it once the directory is
indexed: the fetch script's manifest lists every file with its size and sha256 (`modelfleet_fetch.py index`);
a holder that will give its cache and whose files changed since its last index is indexed first. Hosts whose
directory is empty (a new pool member, a new replica, the next host of a rolling upgrade) copy it through the
checkpoint fan-out's server and receiver, in the same waves (model_fanout_width): every file is checked against
the source's manifest, a file that fails is removed and the host stops with the reason. A host that compiled for
itself keeps its own. Only hosts of this run give (`--limit` leaves the others unreached); a key no host of the
run holds is compiled where its engine first starts. The model stage, which runs first, has made the config
directory and put the fetch script there.
"""

from __future__ import annotations

import json
import shlex
from functools import partial

from pyinfra import host, state
from pyinfra.api import StringCommand, deploy, operation

from modelfleet import render
from modelfleet.caches import EngineCache
from modelfleet.context import HostRun
from modelfleet.inventory import HostPlan
from modelfleet.operations.files import content_file, directory
from modelfleet.transfer import (
    FANOUT_FLOOR_BYTES_S,
    FANOUT_MARGIN_S,
    FANOUT_PORT,
    FETCH,
    checkpoint_fetched,
    fanout_serving,
    fanout_unit,
    fanout_waves,
)
from modelfleet.units import pinned_services

NAME = "engine_cache"
PINS: frozenset[str] = frozenset({"images", "revisions"})


def _caches(plan: HostPlan, ctx: HostRun | None = None) -> dict[str, EngineCache]:
    """key -> the host's cache directory for it (services with one key share it); with the run context, as the
    service stage renders them (the pool's fabric applied)."""
    out = {}
    for svc in pinned_services(plan):
        cache = render.engine_cache(ctx.as_run(svc) if ctx else svc)
        if cache:
            out.setdefault(cache.key, cache)
    return out


def _job_path(plan: HostPlan, cache: EngineCache) -> str:
    return f"{plan.config_dir}/engine-cache-{cache.key}.json"


def wants(plan: HostPlan, probe: dict) -> dict:
    caches = _caches(plan).values()
    return {"trees": [c.dir for c in caches], "units": [f"{fanout_unit(f'cache-{c.key}')}.service" for c in caches],
            "paths": [p for c in caches for p in (c.root, c.dir, _job_path(plan, c))]}


def warm(tree: dict | None) -> bool:
    return bool(tree and tree.get("files"))


def indexed(tree: dict | None) -> bool:
    """Does the directory's manifest list exactly its files, as they are now (size and mtime)?"""
    listed = ((tree or {}).get("manifest") or {}).get("files") or {}
    files = (tree or {}).get("files") or {}
    return set(listed) == set(files) and all(
        listed[rel].get("size") == size and abs(float(listed[rel].get("mtime", -1)) - mtime) < 1e-3
        for rel, (size, mtime) in files.items())


def _members(ctx: HostRun, key: str) -> list[str]:
    """This run's hosts with a service of this key, in inventory order (those failed already left out)."""
    active = {h.name for h in state.inventory.get_active_hosts()}
    return [name for name, plan in ctx.inventory.hosts.items()
            if name in active and key in _caches(plan, ctx) and name not in {h.name for h in state.failed_hosts}]


def _tree_on(ctx: HostRun, name: str, key: str) -> dict | None:
    cache = _caches(ctx.inventory.hosts[name], ctx)[key]
    return ctx.deployed_on(name)["trees"].get(cache.dir)


def _waves(ctx: HostRun, key: str) -> list[dict[str, str]]:
    members = _members(ctx, key)
    holders = {name for name in members if warm(_tree_on(ctx, name, key))}
    if not holders:
        return []
    return fanout_waves(members, holders, ctx.inventory.hosts[members[0]].model_fanout_width)


@operation(is_idempotent=False)
def cache_indexed(directory_: str, label: str, needed: bool):
    """The fetch script's manifest of an engine cache directory, from its files as they are now."""
    if not needed:
        host.noop(f"{directory_}: indexed, or gives no copy in this run")
        return
    yield StringCommand(*map(shlex.quote, ["python3", FETCH, "index", directory_, label]))


@deploy("modelfleet engine_cache")
def run(ctx: HostRun):
    plan = ctx.plan
    mine = ctx.deployed()
    at = mine["paths"].get
    for key, cache in _caches(plan, ctx).items():
        tree = mine["trees"].get(cache.dir)
        waves = ctx.fanout(("engine-cache", key), partial(_waves, ctx, key))
        sources = {source for wave in waves for source in wave.values()}
        name = f"engine-cache/{cache.inputs['engine']}"
        directory(name=f"Engine cache root {cache.root}", path=cache.root, current=at(cache.root))
        directory(name=f"Engine cache {cache.dir}", path=cache.dir, current=at(cache.dir))
        job = _job_path(plan, cache)
        content_file(name=f"Engine cache job {job}", dest=job, current=at(job), mode="0600",
                     content=json.dumps({"repo": name, "commit": key, "endpoint": None, "dest": cache.dir,
                                         "token_file": None, "files": None}, indent=1, sort_keys=True) + "\n")
        unit_state = mine["units"].get(f"{fanout_unit(f'cache-{key}')}.service") or {}
        leftover = unit_state.get("ActiveState") in ("active", "activating", "failed")
        # A holder gives what its manifest lists: indexed first where its files changed since.
        cache_indexed(name=f"Index engine cache {key} (it gives a copy)", directory_=cache.dir, label=name,
                      needed=host.name in sources and warm(tree) and not indexed(tree))
        size = sum(s for s, _ in ((tree or {}).get("files") or {}).values()) if host.name in sources else 0
        served = False
        # Every host lists every wave's operations (a noop where it has no part), as the checkpoint fan-out.
        for number, wave in enumerate(waves or [{}], 1):
            starts = host.name in wave.values() and not served
            fanout_serving(name=f"Serve engine cache {key} to peers (wave {number}/{len(waves) or 1})",
                           group=f"cache-{key}", directory_=cache.dir, address=plan.address, port=FANOUT_PORT,
                           serve=True, needed=starts, leftover=leftover and number == 1,
                           lifetime_s=int(FANOUT_MARGIN_S + size * len(wave) / FANOUT_FLOOR_BYTES_S))
            served = served or starts
            source = wave.get(host.name)
            source_url = f"http://{ctx.inventory.hosts[source].address}:{FANOUT_PORT}/" if source else None
            checkpoint_fetched(name=f"Copy engine cache {key} from a peer (wave {number}/{len(waves) or 1})",
                               job=job, mode="peer", source=source_url, missing=["*"] if source else [],
                               reverify=False, source_host=source)
        fanout_serving(name=f"Stop serving engine cache {key}", group=f"cache-{key}", directory_=cache.dir,
                       address=plan.address, port=FANOUT_PORT, serve=False, needed=served)
