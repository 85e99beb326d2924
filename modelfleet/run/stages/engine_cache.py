"""Stage engine_cache: a warm engine cache reaches the hosts whose services have the same cache key, before their
engines start (modelfleet/plan/caches.py: the key says a copy is valid there).

A host holds a warm cache for a key when that key's directory has files. It can give it once the directory is
indexed: the fetch script's manifest lists every file with its size and sha256 (`modelfleet_fetch.py index`);
a holder that will give its cache and whose files changed since its last index is indexed first, and the
control node takes the index from that command's output (or, unchanged, from the tree it read over SSH). Only
regular files are indexed: a symlink, device or setuid file in the key directory is refused, named, and that
host gives nothing. Hosts whose directory is empty (a new pool member, a new replica, the next host of a
rolling upgrade) copy it through the checkpoint fan-out's server and receiver, in the same waves
(model_fanout_width): every file is checked against the size and sha256 the control node put in the receiver's
job, a file that fails is removed and named, and the host stops with the reason. A receiver whose source failed
earlier in the run copies from another holder, or goes on without a copy (its engine compiles). A host that
compiled for itself keeps its own. Only hosts of this run give (`--limit` leaves the others unreached); a key no
host of the run holds is compiled where its engine first starts; `engine_cache_sharing: false` on a pool keeps
every host's cache its own. The model stage, which runs first, has made the config directory and put the fetch
script there.
"""

from __future__ import annotations

import contextlib
import json
import shlex
from functools import partial

from pyinfra import host, logger, state
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation

from modelfleet.base import runscope
from modelfleet.host.operations.files import content_file, directory
from modelfleet.host.operations.report import refuse
from modelfleet.host.operations.venv import engine_user
from modelfleet.host.transfer import (
    FANOUT_FLOOR_BYTES_S,
    FANOUT_MARGIN_S,
    FANOUT_PORT,
    FETCH,
    checked_index,
    fanout_address,
    fanout_serving,
    fanout_unit,
    fanout_waves,
    held_files,
    peer_copied,
    wave_sources,
)
from modelfleet.host.units import pinned_services, start_reads
from modelfleet.plan import render, venvs
from modelfleet.plan.caches import SET_ASIDE, EngineCache
from modelfleet.plan.inventory.plan import HostPlan
from modelfleet.run.context import HostRun

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
    """Its caches' trees, units and files; and what deciding whether a pool (re)starts reads (its ranks' caches
    are made to agree only then)."""
    caches, unit_reads = _caches(plan).values(), start_reads(plan)
    return {"trees": [c.dir for c in caches],
            "units": [f"{fanout_unit(f'cache-{c.key}')}.service" for c in caches] + unit_reads["units"],
            "paths": [p for c in caches for p in (c.root, c.dir, _job_path(plan, c))] + unit_reads["paths"],
            "texts": [venvs.USER_LINE] if any(c.owner != "root" for c in caches) else []}


def warm(tree: dict | None) -> bool:
    return bool(tree and tree.get("files"))


def indexed(tree: dict | None) -> bool:
    """Does the directory's manifest list exactly its files, as they are now (size and mtime), with nothing
    beside them that no cache may hold (a symlink, a device, a setuid file: indexing refuses and names it)?"""
    listed = ((tree or {}).get("manifest") or {}).get("files") or {}
    files = (tree or {}).get("files") or {}
    return not (tree or {}).get("odd") and set(listed) == set(files) and all(
        listed[rel].get("size") == size and abs(float(listed[rel].get("mtime", -1)) - mtime) < 1e-3
        for rel, (size, mtime) in files.items())


def _members(ctx: HostRun, key: str) -> list[str]:
    """This run's hosts with a service of this key, in inventory order (those failed already left out), where
    their pool shares caches."""
    sharing = runscope.slot("engine-cache sharing", lambda: _sharing(ctx))
    active = {h.name for h in state.inventory.get_active_hosts()} - {h.name for h in state.failed_hosts}
    return [name for name in sharing.get(key, ()) if name in active]


def _sharing(ctx: HostRun) -> dict[str, list[str]]:
    """key -> the hosts with a service of that key whose pools share caches, in inventory order: one pass over
    the inventory per run (every host asks, so a pass per host grew with the square of the fleet)."""
    out: dict[str, list[str]] = {}
    for name, plan in ctx.inventory.hosts.items():
        for key in _caches(plan, ctx):
            if _shares(plan, key, ctx):
                out.setdefault(key, []).append(name)
    return out


def _shares(plan: HostPlan, key: str, ctx: HostRun) -> bool:
    """Do the services of this key on this host allow their caches to be shared (engine_cache_sharing)?"""
    return all(svc.engine_cache_sharing for svc in pinned_services(plan)
               if (cache := render.engine_cache(ctx.as_run(svc))) and cache.key == key)


def _tree_on(ctx: HostRun, name: str, key: str) -> dict | None:
    cache = _caches(ctx.inventory.hosts[name], ctx)[key]
    return ctx.deployed_on(name)["trees"].get(cache.dir)


def _waves(ctx: HostRun, key: str) -> list[dict[str, str]]:
    members = _members(ctx, key)
    holders = {name for name in members if warm(_tree_on(ctx, name, key))}
    if not holders:
        return []
    return fanout_waves(members, holders, ctx.inventory.hosts[members[0]].model_fanout_width)


def _index_read(state, host, directory_: str, label: str, group: str) -> bool:
    """FunctionCommand body: index the holder's cache and take the index from the command's output (the
    control node holds every file's size and sha256 before any peer asks for one)."""
    command = StringCommand(*map(shlex.quote, ["python3", FETCH, "index", directory_, label]))
    ok, output = host.run_shell_command(command, print_output=state.print_output, print_input=state.print_input)
    if not ok:
        return refuse(state, host, output.stderr_lines or [f"indexing {directory_} failed"])
    try:
        held_files((group, host.name)).update(checked_index(json.loads(output.stdout)["manifest"], directory_))
    except (ValueError, KeyError) as error:
        return refuse(state, host, [f"engine cache {directory_}: {error}"])
    return True


@operation(is_idempotent=False)
def cache_indexed(directory_: str, label: str, needed: bool, group: str = ""):
    """The fetch script's manifest of an engine cache directory, from its files as they are now."""
    if not needed:
        host.noop(f"{directory_}: indexed, or gives no copy in this run")
        return
    yield FunctionCommand(_index_read, (directory_, label, group), {})




def _warm_now(directory_: str) -> StringCommand:
    """Shell: does the key directory hold any cache file now (after the fan-out)? Prints 1 or nothing."""
    script = (f"find {shlex.quote(directory_)} -type f ! -name '.modelfleet-*' -print -quit 2>/dev/null | "
              "grep -c . || true")
    return StringCommand("sh", "-c", shlex.quote(script))


def set_aside_command(directory_: str) -> StringCommand:
    """Shell: everything of the key directory moved into <dir>.modelfleet-set-aside (the last one replaced; the
    key file, beside the directory, stays); links are moved, never followed."""
    aside = directory_ + SET_ASIDE
    script = (f"d={shlex.quote(directory_)}; a={shlex.quote(aside)}; rm -rf -- \"$a\" && mkdir -m 0755 -- \"$a\" && "
              "find \"$d\" -mindepth 1 -maxdepth 1 -exec mv -t \"$a\" -- {} +")
    return StringCommand("sh", "-c", shlex.quote(script))


def pool_verdict(pool: str, warm_on: dict[str, bool]) -> tuple[str, list[str], str]:
    """(what the pool's ranks get: `identical` / `none`, the hosts whose cache is set aside, the line that says
    so). Ranks of one pool that see different engine caches hang at start (one skips FlashInfer's autotuning,
    the others run its collectives: vLLM #57423): every rank warm, or none."""
    warm = sorted(name for name, hot in warm_on.items() if hot)
    cold = sorted(name for name, hot in warm_on.items() if not hot)
    if not cold:
        return "identical", [], f"pool {pool}: engine caches: every rank holds its cache ({', '.join(warm)})"
    if not warm:
        return "none", [], f"pool {pool}: engine caches: none on any rank, every rank compiles"
    return "none", warm, (f"pool {pool}: engine caches differ between ranks (warm on {', '.join(warm)}; empty on "
                          f"{', '.join(cold)}): set aside on {', '.join(warm)} (kept as <key>{SET_ASIDE}), every "
                          "rank compiles (ranks that see different caches hang at start)")


def _read_warm(state, host, pool: str, directory_: str, seen: dict) -> bool:
    ok, output = host.run_shell_command(_warm_now(directory_), print_output=False, print_input=False)
    seen[host.name] = ok and output.stdout.strip() not in ("", "0")
    return True


def _agree(state, host, pool: str, members: list[str], directory_: str, seen: dict) -> bool:
    outcome, aside, line = pool_verdict(pool, {name: seen[name] for name in members if name in seen})
    if host.name in aside:
        ok, output = host.run_shell_command(set_aside_command(directory_), print_output=False, print_input=False)
        if not ok:
            return refuse(state, host, [f"{line}; moving {directory_} aside failed: "
                                        + " | ".join(output.stderr_lines[-3:])])
    if aside:
        host.log_styled(f"modelfleet: {line}", fg="yellow", log_func=logger.warning)
    elif host.name == members[0]:
        host.log_styled(f"modelfleet: {line}")
    return True


@operation(is_idempotent=False)
def pool_caches_agree(pool: str, members: list[str], directory_: str, seen: dict, needed: bool):
    """A pool across hosts about to start: every rank's cache is read after the fan-out (one operation on every
    member), then judged together (the next): every rank warm, or none (pool_verdict)."""
    if not needed:
        host.noop(f"pool {pool}: no rank starts, its caches stay as they are")
        return
    yield FunctionCommand(_read_warm, (pool, directory_, seen), {})


@operation(is_idempotent=False)
def pool_caches_judged(pool: str, members: list[str], directory_: str, seen: dict, needed: bool):
    if not needed:
        host.noop(f"pool {pool}: no rank starts")
        return
    yield FunctionCommand(_agree, (pool, members, directory_, seen), {})


def _pool_caches(ctx: HostRun) -> None:
    """Each pool across hosts of this host: its ranks' caches agree before it starts."""
    for svc in pinned_services(ctx.plan):
        cache = render.engine_cache(ctx.as_run(svc))
        if cache is None or svc.nnodes < 2:
            continue
        members, needed = list(ctx.inventory.pools[svc.pool].hosts), ctx.pool_starts(svc.pool)
        seen = ctx.pool_checks(f"engine-cache {svc.pool}")
        pool_caches_agree(name=f"Engine cache of pool {svc.pool}'s rank after the fan-out", pool=svc.pool,
                          members=members, directory_=cache.dir, seen=seen, needed=needed)
        pool_caches_judged(name=f"Engine caches of pool {svc.pool}: every rank or none", pool=svc.pool,
                           members=members, directory_=cache.dir, seen=seen, needed=needed)


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
        group = f"cache-{key}"
        directory(name=f"Engine cache root {cache.root}", path=cache.root, current=at(cache.root))
        if cache.owner != "root":  # a venv engine's: its user owns it, made here if this is the host's first
            engine_user(name=f"User {cache.owner} (venv engines)",
                        present=venvs.user_present(mine["texts"].get(venvs.USER_LINE)))
        directory(name=f"Engine cache {cache.dir}", path=cache.dir, current=at(cache.dir), user=cache.owner,
                  group=cache.owner)
        job = _job_path(plan, cache)
        job_fields = {"repo": name, "commit": key, "endpoint": None, "dest": cache.dir, "token_file": None,
                      "kind": "cache", "host": plan.name, "stall_s": plan.model_stall_s}
        content_file(name=f"Engine cache job {job}", dest=job, current=at(job), mode="0600",
                     content=json.dumps({**job_fields, "files": None}, indent=1, sort_keys=True) + "\n")
        unit_state = mine["units"].get(f"{fanout_unit(group)}.service") or {}
        leftover = unit_state.get("ActiveState") in ("active", "activating", "failed")
        # A holder gives what its manifest lists: indexed first where its files changed since; the control
        # node holds the index (the tree's, read over SSH, or the index command's output).
        gives = host.name in sources and warm(tree)
        if gives and indexed(tree):
            with contextlib.suppress(ValueError):  # a malformed index is made again below
                held_files((group, host.name)).update(checked_index(tree["manifest"]["files"], cache.dir))
        needs_index = gives and not held_files((group, host.name))
        cache_indexed(name=f"Index engine cache {key} (it gives a copy)", directory_=cache.dir, label=name,
                      needed=needs_index, group=group)
        size = sum(s for s, _ in ((tree or {}).get("files") or {}).values()) if host.name in sources else 0
        urls = {m: f"http://{fanout_address(ctx.inventory.hosts[m])}:{FANOUT_PORT}/" for m in _members(ctx, key)}
        served = False
        # Every host lists every wave's operations (a noop where it has no part), as the checkpoint fan-out.
        for number, wave in enumerate(waves or [{}], 1):
            serves = host.name in wave.values()
            fanout_serving(name=f"Serve engine cache {key} to peers (wave {number}/{len(waves) or 1})",
                           group=group, directory_=cache.dir, address=fanout_address(plan), port=FANOUT_PORT,
                           serve=True, needed=serves, leftover=leftover and number == 1, config_dir=plan.config_dir,
                           files_key=(group, host.name), idle_s=2 * plan.model_stall_s,
                           lifetime_s=int(FANOUT_MARGIN_S + size * len(wave) / FANOUT_FLOOR_BYTES_S))
            served = served or serves
            peer_copied(name=f"Copy engine cache {key} from a peer (wave {number}/{len(waves) or 1})",
                        job_path=job, job=job_fields, group=group, source=wave.get(host.name),
                        alternatives=wave_sources(waves, number), urls=urls, needed=True)
        fanout_serving(name=f"Stop serving engine cache {key}", group=group, directory_=cache.dir,
                       address=fanout_address(plan), port=FANOUT_PORT, serve=False, needed=served,
                       config_dir=plan.config_dir)
    _pool_caches(ctx)
