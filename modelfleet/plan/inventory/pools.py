"""The pools the hosts' services form: each pool checked as one (members agree, the layout fits its hosts and
GPUs, the model fits), node ranks given in host order, and what is allowed but rarely meant (warnings) or only
said (the recipes' notes)."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import replace

from modelfleet.base import grammar
from modelfleet.plan.catalog.routers import pd_role
from modelfleet.plan.inventory.plan import HostPlan, PoolPlan
from modelfleet.plan.inventory.schema import COMMIT_RE
from modelfleet.plan.inventory.services import unknown_extra_flags
from modelfleet.plan.planner import plan_capacity


def information(pools: dict[str, PoolPlan]) -> list[tuple[str, str, str]]:
    """What a recipe says of itself (its notes), and what its own image's tag does not say (the guide's tag, kept
    as the catalogue ships it): the catalogue's information, not a problem `--strict` refuses."""
    out = []
    for pool in pools.values():
        head = pool.services[0]
        if head.recipe.notes:
            out.append((f"pool {pool.name}", "recipe", f"{head.recipe.id}: {' '.join(head.recipe.notes.split())}"))
        found = _tag_version(head)
        if not head.venv and _catalogue_image(head) and found != head.recipe.engine_version.lstrip("v"):
            said = f"is {head.engine_name} {found}" if found else "names no engine version"
            out.append((f"pool {pool.name}", "image", f"{head.image}, the image recipe {head.recipe.id} ships, "
                        f"{said}; its flags were checked with {head.engine_name} {head.recipe.engine_version}'s "
                        "parser. The run pins this tag's digest when it starts: `modelfleet render --pin "
                        "INVENTORY HOST` shows it, `image: <that reference>` keeps it"))
    return out


def _catalogue_image(svc) -> bool:
    """The service runs its shipped recipe's own image (through `image_registry`, or pinned by digest, alike)."""
    if svc.recipe._site is not None or not svc.recipe.image:
        return False
    ref, shipped = svc.image.split("@")[0], svc.recipe.image.split("@")[0]
    return ref == shipped or ref.endswith(f"/{shipped}")


def _tag_version(head) -> str | None:
    """The engine version (or llama.cpp build) the pool's image tag names, if any."""
    tag = head.image.rsplit("/", 1)[-1].partition(":")[2].split("@")[0]
    version = TAG_BUILD.search(tag) or TAG_VERSION.search(tag)
    return version.group(1) if version else None


PLACEHOLDER_REVISION = re.compile(r"^(0+|f+|x+)$", re.IGNORECASE)


TAG_VERSION = re.compile(r"(?:^|[^0-9])v?([0-9]+\.[0-9]+(?:\.[0-9]+)?)(?:$|[^0-9.])")


# llama.cpp's images name their build: server-cuda13-b11434, full-b11669 (github.com/ggml-org/llama.cpp releases).
TAG_BUILD = re.compile(r"(?:^|[^A-Za-z0-9])(b[0-9]+)(?:$|[^0-9])")


def warnings(hosts: dict[str, HostPlan], pools: dict[str, PoolPlan], data: dict[str, dict]) -> list:
    """What is allowed but is rarely meant: `validate` prints these as `warning:` lines, `--strict` refuses
    them."""
    out: list[tuple[str, str, str]] = []
    for name, plan in hosts.items():
        where = f"host {name}"
        for fld in ("config_dir", "model_root"):
            temp = grammar.temporary(getattr(plan, fld))
            if temp:
                out.append((where, fld, f"{getattr(plan, fld)} is inside {temp}, emptied at boot: checkpoints "
                                        "would download again, env and key files be gone until the next converge"))
        used = sum(s.gpus for s in plan.services)
        if plan.services and plan.hardware.vendor != "none" and used < plan.gpu_count:
            out.append((where, "gpus", f"{plan.gpu_count - used} of its {plan.gpu_count} GPUs serve nothing "
                                       f"(services use {used}): set `gpus`, add a service, or set `gpu_count`"))
        for svc in plan.services:
            out += [(where, "extra_args", f"{p}: the engine would refuse to start") for p in unknown_extra_flags(svc)]
            if svc.recipe.gguf_quant and svc.model.gguf and not COMMIT_RE.match(svc.revision or ""):
                out.append((where, "revision", f"{svc.revision or 'main'} is not a commit: the weights come from "
                                               f"the GGUF repository {svc.hf_repo} (not {svc.model.hf_repo}); pin "
                                               "its commit so a re-upload cannot change what serves (llama.cpp "
                                               "runs no model code: no trust_remote_code needed)"))
            if svc.revision and PLACEHOLDER_REVISION.match(svc.revision):
                out.append((where, "revision", f"{svc.revision} is a placeholder, not a commit: pin the revision "
                                               "you reviewed (the hub's commit id)"))
    for pool in pools.values():
        head = pool.services[0]
        where = f"pool {pool.name}"
        if head.venv:  # the lock says which version installs, as the image's tag does
            if head.venv.version.split("+")[0] != head.recipe.engine_version.lstrip("v"):
                out.append((where, "venv_lock", f"{head.venv.lock_file} installs {head.venv.engine} "
                                                f"{head.venv.version}, but recipe {head.recipe.id}'s flags were "
                                                f"checked with {head.recipe.engine_version}"))
        elif not _catalogue_image(head) and not _tag_version(head):  # the site's choice of image
            out.append((where, "image", f"{head.image} names no engine version: its flags were checked with "
                                        f"{head.engine_name} {head.recipe.engine_version}'s parser; pin an image "
                                        "of that version"))
        elif not _catalogue_image(head) and _tag_version(head) != head.recipe.engine_version.lstrip("v"):
            out.append((where, "image", f"{head.image} is {head.engine_name} {_tag_version(head)}, but recipe "
                                        f"{head.recipe.id}'s flags were checked with {head.recipe.engine_version}"))
        role = pd_role(head.recipe, head.engine_name)
        if role and not head.router:
            out.append((where, "router", f"unset: the {role} part of {head.served_name} is reached only through "
                                         "its router in PD mode (set `router` on its prefill and decode pools)"))
        if len(pool.hosts) > 1:
            on_ssh = [h for h in pool.hosts if "fabric_address" not in data.get(h, {})]
            if on_ssh:
                out.append((where, "fabric_address", f"multi-node pool on the SSH address of {', '.join(on_ssh)}: "
                                                     "set `fabric_address` to each host's address on the pool "
                                                     "network (the NCCL/RDMA interface)"))
    return out


def unequal_gpus(counts: dict[str, int], how: str) -> str:
    """The one line for a pool whose hosts carry different numbers of ranks (NCCL hangs at init then, NCCL
    #2385: 7 + 8 ranks, 3 of 3 runs)."""
    said = ", ".join(f"{name} {n}" for name, n in counts.items())
    return (f"unequal GPUs per host ({how}): {said}: NCCL hangs at init when the hosts of a pool carry different "
            "numbers of ranks; give every member the same number of GPUs, or take the short host out")


def resolve_pools(hosts: dict[str, HostPlan], errors: list) -> dict[str, PoolPlan]:
    pools: dict[str, PoolPlan] = defaultdict(lambda: PoolPlan(name=""))
    for plan in hosts.values():
        for svc in plan.services:
            pool = pools[svc.pool]
            pool.name = svc.pool
            pool.hosts.append(plan.name)
            pool.services.append(svc)
    in_ram: dict[str, list] = defaultdict(list)  # host -> (pool, offload split) of its replicas offloading
    for pool in pools.values():
        where = f"pool {pool.name}"
        head = pool.services[0]
        counts = {s.host: s.gpus for s in pool.services}
        if len(set(counts.values())) > 1:
            errors.append((where, "gpus", unequal_gpus(counts, "declared")))
        for fld in ("model", "engine_name", "recipe", "hardware", "served_name", "port", "revision", "image",
                    "weight_cache"):
            values = sorted({str(getattr(getattr(s, fld), "id", getattr(s, fld))) for s in pool.services})
            if len(values) > 1:
                label = "mixed hardware" if fld == "hardware" else "members disagree"
                errors.append((where, fld.removesuffix("_name"), f"{label}: {', '.join(values)}"))
        seen: dict[str, str] = {}
        for member in pool.hosts:
            fabric = hosts[member].fabric_address or hosts[member].address
            if fabric in seen and seen[fabric] != member:
                errors.append((f"host {member}", "fabric_address", f"{fabric} is also {seen[fabric]}'s, a member of "
                               f"the same pool {pool.name}: each host of a pool needs its own address on the pool "
                               "network (rendezvous and peers would reach one host twice)"))
            seen.setdefault(fabric, member)
        layout = head.recipe.layout
        pool_gpus = sum(s.gpus for s in pool.services)
        if layout.nodes > 1 and not head.engine.multinode and (where, "engine") not in {e[:2] for e in errors}:
            errors.append((where, "engine", f"{head.engine_name} has no multi-node mode: use an engine that has one "
                           f"for {layout.nodes} nodes"))
        if layout.nodes > 1 and layout.dp > 1 and layout.dp % layout.nodes:
            errors.append((where, "recipe", f"dp {layout.dp} does not split evenly over {layout.nodes} nodes"))
        if len(pool.hosts) != layout.nodes and layout.nodes == 1:
            errors.append((where, "hosts", f"recipe {head.recipe.id} is single-node, pool has {len(pool.hosts)} "
                           f"hosts ({', '.join(pool.hosts)}): for replicas, leave `pool` unset (each host is then a "
                           "pool of its own serving the same model; give them one `checkpoint_group` to download "
                           "once) or give each host its own `pool`"))
        elif len(pool.hosts) != layout.nodes:
            errors.append((where, "hosts", f"recipe {head.recipe.id} needs {layout.nodes} node(s), pool has "
                           f"{len(pool.hosts)}"))
        if layout.world_size != pool_gpus:
            errors.append((where, "gpus", f"tp {layout.tp} x pp {layout.pp} x dp {layout.dp} = "
                           f"{layout.world_size} GPUs, but the pool has {pool_gpus} "
                           f"({len(pool.hosts)} host(s) x {head.gpus})"))
        if head.hardware.vendor != "none":
            report = plan_capacity(head.model, head.hardware, gpus=head.gpus, nodes=len(pool.hosts),
                                   recipe=head.recipe, host_ram_gib=hosts[pool.hosts[0]].host_ram_gib,
                                   weight_cache=head.weight_cache)
            if not report.fits:
                errors.append((where, "model", report.reason))
            elif len(pool.hosts) == 1 and report.offload and report.offload.get("experts_in_ram_bytes"):
                in_ram[pool.hosts[0]].append((pool.name, report.offload))
    for name, parts in in_ram.items():  # each replica's experts fit the RAM alone: together too?
        need, ram = sum(o["ram_need_bytes"] for _, o in parts), parts[0][1]["host_ram_bytes"]
        if len(parts) > 1 and ram and need > ram:
            said = ", ".join(f"pool {p} {o['ram_need_bytes'] / 1e9:.0f} GB" for p, o in parts)
            errors.append((f"host {name}", "services", f"its services keep {need / 1e9:.0f} GB of experts in host "
                           f"RAM together ({said}), the host has {ram / 2**30:.0f} GiB: serve fewer of them on "
                           "this host, or set `host_ram_gib` if it has more"))
    # Every multi-node pool's head listens for its ranks on the same fixed rendezvous port (render.MASTER_PORT,
    # DP_RPC_PORT): two such pools headed by one host would take each other's ranks.
    headed: dict[str, str] = {}
    for pool in pools.values():
        if len(pool.hosts) > 1:
            head = pool.hosts[0]
            if head in headed:
                errors.append((f"pool {pool.name}", "hosts", f"its head {head} (its first host) also heads the "
                               f"multi-node pool {headed[head]}: both would rendezvous on the same port of {head}; "
                               f"a host heads one multi-node pool at most: serve this pool from hosts whose first (in "
                               f"inventory order, rank 0) is not {head}"))
            headed.setdefault(head, pool.name)
    return dict(pools)


def with_ranks(hosts: dict[str, HostPlan], pools: dict[str, PoolPlan]) -> dict[str, HostPlan]:
    """Give each service its node rank from the pool's host order (the first host is the head)."""
    out = {}
    for name, plan in hosts.items():
        services = []
        for svc in plan.services:
            pool = pools[svc.pool]
            head = hosts[pool.hosts[0]]
            services.append(replace(svc, node_rank=pool.hosts.index(name), nnodes=len(pool.hosts),
                                     head_address=head.fabric_address or head.address))
        out[name] = replace(plan, services=tuple(services))
    return out
