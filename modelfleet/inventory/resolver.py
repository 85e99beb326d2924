"""The resolver: raw host data (catalog defaults < group_data < host data) -> HostPlan / PoolPlan, with every
problem collected (host or pool, field, message) so `modelfleet validate` reports them all at once; and the
loading of inventory files, for modelfleet's own commands and for `refuse_invalid` inside pyinfra's run."""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from modelfleet import engine_flags, grammar, host_commands, image_runtime, keys, masking, trust
from modelfleet.catalog import (
    Catalog,
    Engine,
    Hardware,
    Recipe,
    load_catalog,
)
from modelfleet.catalog.routers import pd_role
from modelfleet.exposure import off_loopback_problem
from modelfleet.inventory import routed, router_only
from modelfleet.inventory.plan import (
    GPU_CHECK_IMAGES,
    STACK_KEYS,
    HostPlan,
    PoolPlan,
    Resolved,
    RouterChoice,
    ServicePlan,
    StackPlan,
    _is_loopback,
    _slug,
)
from modelfleet.inventory.schema import COMMIT_RE, HUB_ENDPOINT, SERVICE_KEYS, HostData, ServiceData
from modelfleet.planner import plan_capacity


def _service_entries(data: dict[str, Any], host: HostData) -> list[Any]:
    """The host's services. Service keys given at host or group level are the defaults of every `services`
    entry (an entry's own value wins), as pyinfra's precedence does everywhere else."""
    defaults = {k: data[k] for k in SERVICE_KEYS if k in data}
    if host.services is None:
        return [defaults]
    return [{**defaults, **entry} if isinstance(entry, dict) else entry for entry in host.services]


def _pick_recipe(cat: Catalog, svc: ServiceData, hardware: str, where: str, errors: list) -> Recipe | None:
    if svc.recipe:
        recipe = cat.recipes.get(svc.recipe)
        if recipe is None:
            errors.append((where, "recipe", f"unknown recipe {svc.recipe!r}"))
        elif (recipe.model, recipe.engine) != (svc.model, svc.engine) or hardware not in recipe.hardware:
            errors.append((where, "recipe", f"recipe {recipe.id} is for {recipe.model}/{recipe.engine} on "
                           f"{', '.join(recipe.hardware)}, not {svc.model}/{svc.engine} on {hardware}"))
            return None
        return recipe
    # One part of a prefill/decode layout is only ever named: its pool is half of a pair.
    found = [r for r in cat.recipes_for(svc.model, svc.engine, hardware) if not pd_role(r, svc.engine)]
    if not found:
        errors.append((where, "recipe", f"no recipe for model {svc.model} with engine {svc.engine} on "
                       f"{hardware}"))
        return None
    if len(found) > 1:
        errors.append((where, "recipe", f"several recipes match ({', '.join(r.id for r in found)}): "
                       "name one with `recipe`"))
        return None
    return found[0]


def _resolve_service(name: str, host: HostData, hw: Hardware | None, raw: dict[str, Any], cat: Catalog,
                     errors: list, skipped: list | None = None) -> ServicePlan | None:
    where = f"host {name}"
    try:
        svc = ServiceData(**raw)
    except ValidationError as exc:
        for err in exc.errors():
            message = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                near = difflib.get_close_matches(str(err["loc"][-1]), SERVICE_KEYS, n=1, cutoff=0.6)
                message = "unknown key" + (f" (did you mean {near[0]!r}?)" if near else "")
            errors.append((where, ".".join(str(p) for p in err["loc"]), message))
        return None
    ok = True
    for fld, table in (("model", cat.models), ("engine", cat.engines)):
        value = getattr(svc, fld)
        if value is None:
            errors.append((where, fld, "missing"))
            ok = False
        elif value not in table:
            errors.append((where, fld, f"unknown {fld} {value!r} (known: {', '.join(sorted(table))})"))
            ok = False
    if not ok or hw is None:
        return None
    model, engine = cat.models[svc.model], cat.engines[svc.engine]
    recipe = _pick_recipe(cat, svc, hw.id, where, errors)
    if recipe is None:
        return None
    port = svc.port if svc.port is not None else engine.default_port
    if not 1 <= port <= 65535:
        errors.append((where, "port", f"{port} is outside 1-65535"))
    if recipe.rocm and hw.vendor != "amd":
        errors.append((where, "recipe", f"{recipe.id} runs a ROCm image but {hw.id} is a {hw.vendor} host"))
    if recipe.cuda and hw.vendor != "nvidia":
        errors.append((where, "recipe", f"{recipe.id} runs a CUDA image but {hw.id} is a {hw.vendor} host"))
    # A GGUF recipe's engine (llama.cpp) reads weights and runs none of the checkpoint's own code.
    gguf = bool(recipe.gguf_quant and model.gguf)
    trust = not gguf and (model.trust_remote_code if svc.trust_remote_code is None else svc.trust_remote_code)
    if trust and not (svc.revision and COMMIT_RE.match(svc.revision)):
        errors.append((where, "revision", f"{model.id} needs trust_remote_code: pin `revision` to a 40-hex "
                       f"commit (got {svc.revision!r}) so the code that runs is the code you reviewed"))
    if svc.router and "bind_address" in svc.model_fields_set:
        errors.append((where, "bind_address", f"set, but the replica is served through the front door on "
                       f"{svc.router}: it listens where only the router reaches it (unset bind_address)"))
    exposed = None if _is_loopback(svc.bind_address) else off_loopback_problem(svc.engine, svc.bind_address,
                                                                               svc.api_key_env)
    if exposed:
        errors.append((where, "bind_address", exposed))
    if svc.api_key_env and skipped is not None:
        skipped.append((where, "api_key_env", f"{svc.api_key_env} not looked up (--offline)"))
    elif svc.api_key_env and keys.from_env(svc.api_key_env) is None:
        errors.append((where, "api_key_env", f"{svc.api_key_env} is not set in the control node's environment"))
    elif svc.api_key_env and not keys.stripped(svc.api_key_env):
        errors.append((where, "api_key_env", f"{svc.api_key_env} is set but empty: the endpoint would serve "
                                             "without a key"))
    if not trust and "--trust-remote-code" in recipe.args:
        errors.append((where, "trust_remote_code", f"false, but recipe {recipe.id} passes --trust-remote-code: "
                                                   "the model needs it (pin `revision` to a commit instead)"))
    errors += [(where, "extra_args", message) for message in _extra_args_problems(svc.extra_args, engine, recipe,
                                                                                   svc.engine)]
    errors += [(where if key in svc.env else f"recipe {recipe.id}", f"env.{key}", problem)
               for key in {**recipe.env, **svc.env} if (problem := masking.env_name_problem(key))]
    for param, spec in recipe.parameters.items():
        if param not in svc.recipe_params:
            errors.append((where, f"recipe_params.{param}", f"recipe {recipe.id} needs it ({spec.flag}); "
                                                            f"get it from {spec.where}"))
    for param in set(svc.recipe_params) - set(recipe.parameters):
        errors.append((where, f"recipe_params.{param}", f"recipe {recipe.id} has no such parameter "
                                                        f"(it takes: {', '.join(recipe.parameters) or 'none'})"))
    if hw.vendor == "nvidia" and recipe.min_driver and int(host.driver_branch) < int(recipe.min_driver.split(".")[0]):
        errors.append((where, "driver_branch", f"{host.driver_branch} is older than recipe {recipe.id} needs "
                                               f"({recipe.min_driver})"))
    # The image's CUDA against the driver, and a service's own image against the recipe's CUDA/ROCm.
    runtime = [("image", image_runtime.tag_problem(svc.image, recipe.cuda, recipe.rocm) if svc.image else None),
               ("driver_branch", image_runtime.driver_problem(recipe.cuda, host.driver_branch)
                if hw.vendor == "nvidia" else None)]
    errors += [(where, fld, f"recipe {recipe.id}: {msg}") for fld, msg in runtime if msg]
    gpus = svc.gpus if svc.gpus is not None else recipe.layout.gpus_per_node
    image = _from_registry(host, svc.image or recipe.image)
    revision_dir = svc.revision or "main"
    return ServicePlan(
        host=name, pool=svc.pool or _slug(name), unit_stem="" if svc.pool else _slug(svc.served_name or model.id),
        model=model, engine_name=svc.engine, engine=engine,
        recipe=recipe, hardware=hw, gpus=gpus, served_name=svc.served_name or model.id, port=port,
        bind_address=svc.bind_address, api_key_env=svc.api_key_env, revision=svc.revision,
        trust_remote_code=trust, image=image, extra_args=tuple(svc.extra_args),
        env={**recipe.env, **_network_env(host), **svc.env},
        model_dir=host_commands.model_dir(host.model_root, model.id, revision_dir),
        gpu_passthrough=host.gpu_passthrough, config_dir=host.config_dir.rstrip("/"),
        checkpoint_group=svc.checkpoint_group or svc.pool or _slug(name),
        engine_cache_sharing=svc.engine_cache_sharing,
        netcheck_min_busbw_gbps=svc.netcheck_min_busbw_gbps, netcheck_timeout_s=svc.netcheck_timeout_s,
        recipe_params=dict(svc.recipe_params), model_file=recipe.model_file,
        gpu_indices=tuple(svc.gpu_indices or ()),
        router=RouterChoice(host=svc.router, port=svc.router_port, bind_address=svc.router_bind_address,
                            policy=svc.router_policy, tls_cert=svc.router_tls_cert,
                            client_keys_env=tuple(svc.router_client_keys_env or ()),
                            tls_key=svc.router_tls_key) if svc.router else None,
    )


def _extra_args_problems(extra: list[str], engine: Engine, recipe: Recipe, engine_name: str = "") -> list[str]:
    """Flags modelfleet or the recipe already set, by any spelling the engine's parser accepts (a prefix, an
    alias, `--flag=value`): a second copy would override the address, key, port or the parallel layout behind
    the validator's back (change the recipe instead)."""
    flags = engine_flags.table(engine_name or recipe.engine, engine.flag_parser)
    if flags is None:
        return []
    return engine_flags.problems(extra, flags, engine_flags.extra_protected(engine, flags, recipe),
                                 check_unknown=False)


def _unknown_extra_flags(svc: ServicePlan) -> list[str]:
    """extra_args the recorded parser of the recipe's engine version does not know (a warning: another image
    may have them)."""
    flags = engine_flags.table(svc.engine_name, svc.engine.flag_parser)
    if flags is None or flags.version != svc.recipe.engine_version.lstrip("v"):
        return []
    return [p for p in engine_flags.problems(svc.extra_args, flags, {}, check_unknown=True)]


# Ports an engine may not take: SSH, the exporters', and the pool's rendezvous and fan-out ports.
RESERVED_PORTS = {22: "SSH", 9100: "node exporter", 9400: "DCGM exporter", 13345: "vLLM data-parallel RPC",
                  18431: "checkpoint fan-out", 29500: "multi-node rendezvous"}


def _assign_gpus(services: list[ServicePlan], gpu_count: int, where: str, errors: list) -> list[ServicePlan]:
    """Each service its own GPUs: the indices the inventory gives (`gpu_indices`), else the lowest free ones,
    in service order (contiguous ranges: on NVSwitch boards every range is as good as another; on PCIe
    boards, give `gpu_indices` from `nvidia-smi topo -m` to keep a service under one switch)."""
    taken: dict[int, str] = {}
    for svc in services:
        for index in svc.gpu_indices:
            if index >= gpu_count:
                errors.append((where, "gpu_indices", f"service {svc.pool}: GPU {index} does not exist "
                                                     f"(the host has {gpu_count}: 0-{gpu_count - 1})"))
            elif index in taken:
                errors.append((where, "gpu_indices", f"GPU {index} is given to both {taken[index]} and {svc.pool}"))
            taken[index] = svc.pool
        if svc.gpu_indices and len(svc.gpu_indices) != svc.gpus:
            errors.append((where, "gpu_indices", f"service {svc.pool} wants {svc.gpus} GPUs but lists "
                                                 f"{len(svc.gpu_indices)}"))
    free = [i for i in range(gpu_count) if i not in taken]
    out = []
    for svc in services:
        if not svc.gpu_indices:
            mine, free = tuple(free[:svc.gpus]), free[svc.gpus:]
            svc = replace(svc, gpu_indices=mine)
        out.append(svc)
    return out


def _from_registry(host: HostData, image: str) -> str:
    """The image through the site mirror / lab registry, when the inventory names one."""
    if host.image_registry and not image.startswith(f"{host.image_registry.rstrip('/')}/"):
        return f"{host.image_registry.rstrip('/')}/{image}"
    return image


def _network_env(host: HostData) -> dict[str, str]:
    """NCCL/Gloo interface settings, for the gate's container and the engine's alike."""
    names = {"NCCL_SOCKET_IFNAME": host.nccl_socket_ifname, "GLOO_SOCKET_IFNAME": host.gloo_socket_ifname,
             "NCCL_IB_HCA": host.nccl_ib_hca}
    return {key: value for key, value in names.items() if value}


@functools.cache
def _pyinfra_keys() -> frozenset[str]:
    """pyinfra's own host data: its global arguments and every connector's settings (read once per process:
    scanning the installed packages' entry points costs ~9 ms, and every host of every resolve asked)."""
    from pyinfra.api.arguments import all_global_arguments
    from pyinfra.api.connectors import get_all_connectors

    keys = {name for name, _ in all_global_arguments()}
    for connector in get_all_connectors().values():
        keys |= set(getattr(connector, "data_meta", {}))
    return frozenset(keys)


def _unknown_keys(data: dict[str, Any], where: str) -> list[tuple[str, str, str]]:
    known = set(HostData.model_fields) | _pyinfra_keys() | set(SERVICE_KEYS)
    out = []
    for key in sorted(k for k in data if k not in known):
        near = difflib.get_close_matches(key, sorted(known - _pyinfra_keys()), n=1, cutoff=0.6)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        out.append((where, key, f"unknown key{hint}"))
    return out


def _single_node_engines(entries: list, cat: Catalog) -> list[tuple[str, str, str]]:
    """A pool named on several hosts whose engine has no multi-node mode (llama.cpp): said as that, before any
    recipe is looked for."""
    members: dict[str, tuple[str, list[str]]] = {}
    for name, data in entries:
        if not isinstance(data, dict) or not isinstance(data.get("services", []), list):
            continue
        defaults = {k: data[k] for k in ("pool", "engine") if k in data}
        for entry in data.get("services") or [defaults]:
            if isinstance(entry, dict):
                merged = {**defaults, **entry}
                if isinstance(merged.get("pool"), str) and merged.get("engine") in cat.engines:
                    members.setdefault(merged["pool"], (merged["engine"], []))[1].append(name)
    return [(f"pool {pool}", "engine", f"{engine} has no multi-node mode: pool {pool} names {len(hosts)} hosts "
                                       f"({', '.join(hosts)}); for replicas give each host its own pool (or leave "
                                       "`pool` unset)")
            for pool, (engine, hosts) in members.items() if len(hosts) > 1 and not cat.engines[engine].multinode]


def _directory_clash(host: HostData, where: str) -> list[tuple[str, str, str]]:
    """config_dir (0700, secrets) and model_root (checkpoints, revisions pruned) are separate trees: one inside
    the other would prune or expose the other's files."""
    config, models = host.config_dir.rstrip("/"), host.model_root.rstrip("/")
    if config == models:
        return [(where, "config_dir", f"{config} is also model_root: give secrets and checkpoints their own "
                                      "directories")]
    if config.startswith(models + "/") or models.startswith(config + "/"):
        inner, outer = (config, models) if len(config) > len(models) else (models, config)
        return [(where, "config_dir", f"{inner} is inside {outer} (config_dir and model_root nest): modelfleet "
                                      "prunes checkpoint revisions in model_root and keeps 0600 secrets in "
                                      "config_dir; give each its own directory")]
    return []


def resolve(entries: list[tuple[str, dict[str, Any]]], catalog: Catalog | None = None, offline: bool = False,
            sources: dict[str, dict[str, str]] | None = None) -> Resolved:
    """Resolve every (host name, merged data) pair; never raises for bad input, returns errors and warnings.
    `offline`: the control node's secrets are not looked up (listed in `skipped`). `sources` (host -> key ->
    file, from the loader) lets an error name the group_data file or `--data` that gave the value."""
    cat = catalog or load_catalog()
    errors: list[tuple[str, str, str]] = []
    skipped: list[tuple[str, str, str]] | None = [] if offline else None
    hosts: dict[str, HostPlan] = {}
    addresses: dict[tuple[str, int], str] = {}
    lone_routers: list[str] = []  # hosts with router_only
    if not entries:
        errors.append(("inventory", "hosts", "no hosts: the inventory defines no group with a host"))
    for name, data in entries:
        where = f"host {name}"
        if not isinstance(data, dict):
            errors.append((where, "data", f"host data must be a dict, got {type(data).__name__}"))
            continue
        if grammar.host_address(name.lstrip("@").replace("/", ".")):
            errors.append((where, "name", "is not a host name (letters, digits, . -)"))
        errors += _unknown_keys(data, where)
        try:
            host = HostData(**data)
        except ValidationError as exc:
            for err in exc.errors():
                errors.append((where, ".".join(str(p) for p in err["loc"]), err["msg"].removeprefix("Value error, ")))
            continue
        errors += _directory_clash(host, where)
        address = host.ssh_hostname or name
        if (address, host.ssh_port) in addresses:
            errors.append((where, "ssh_hostname", f"duplicate host: {address}:{host.ssh_port} is also "
                           f"{addresses[(address, host.ssh_port)]}"))
        addresses[(address, host.ssh_port)] = name
        hw, board = None, router_only.board(host.router_only, host.hardware)
        if board is None:
            errors.append((where, "hardware", "missing"))
        elif board not in cat.hardware:
            errors.append((where, "hardware", f"unknown hardware {board!r} "
                           f"(known: {', '.join(sorted(cat.hardware))})"))
        else:
            hw = cat.hardware[board]
        if host.router_only:
            errors += router_only.problems(where, data, hw)
            lone_routers.append(name)
        if host.driver_version and host.driver_version.split(".")[0] != host.driver_branch:
            errors.append((where, "driver_version", f"{host.driver_version} is not a release of driver_branch "
                                                    f"{host.driver_branch}"))
        for model_id in host.assess_models:
            if model_id not in cat.models:
                errors.append((where, "assess_models", f"unknown model {model_id!r}"))
        gpu_count = host.gpu_count if host.gpu_count is not None else (hw.gpus_per_node if hw else 0)
        if hw and hw.vendor != "none" and gpu_count > hw.gpus_per_node:
            errors.append((where, "gpu_count", f"{gpu_count}, but a {hw.id} board has {hw.gpus_per_node} GPUs "
                                               "(hardware catalog)"))
        services = []
        ports: dict[int, str] = {}
        reserved = {**RESERVED_PORTS, host.ssh_port: "SSH"}
        for raw in [] if host.router_only else _service_entries(data, host):
            if not isinstance(raw, dict):
                errors.append((where, "services", f"each entry must be a dict, got {type(raw).__name__}"))
                continue
            svc = _resolve_service(name, host, hw, raw, cat, errors, skipped)
            if svc is None:
                continue
            if svc.port in ports:
                errors.append((where, "port", f"{svc.port} is used by pools {ports[svc.port]} and {svc.pool}"))
            if svc.port in reserved:
                errors.append((where, "port", f"{svc.port} is reserved for {reserved[svc.port]}"))
            ports[svc.port] = svc.pool
            if svc.gpus > gpu_count and hw and hw.vendor != "none":
                errors.append((where, "gpus", f"service {svc.pool} wants {svc.gpus} GPUs, host has {gpu_count}"))
            services.append(svc)
        pools_here = [s.pool for s in services]
        if len(set(pools_here)) != len(pools_here):
            errors.append((where, "pool", "two services of this host name the same pool"))
        elif len({s.unit_name for s in services}) != len(services):
            errors.append((where, "pool", "two services of this host would share a unit name: give each its own "
                                          "`pool`"))
        wanted = sum(s.gpus for s in services)
        if len(services) > 1 and hw and hw.vendor != "none" and wanted > gpu_count:
            errors.append((where, "gpus", f"its services want {wanted} GPUs together, host has {gpu_count}"))
        elif hw and hw.vendor != "none":
            services = _assign_gpus(services, gpu_count, where, errors)
        endpoint = (host.hf_endpoint or os.environ.get("HF_ENDPOINT") or HUB_ENDPOINT).rstrip("/")
        errors += [(where, fld, message) for fld, message in trust.transport_problems(
            endpoint, host.model_source, host.hf_token_env, [s.model.id for s in services if s.trust_remote_code],
            host.insecure_http_hosts)]
        if hw is not None:
            hosts[name] = HostPlan(name=name, address=address, hardware=hw, gpu_count=gpu_count,
                                   model_root=host.model_root, config_dir=host.config_dir.rstrip("/"), hf_token_env=host.hf_token_env,
                                   services=tuple(services), assess_models=tuple(host.assess_models),
                                   host_ram_gib=host.host_ram_gib or hw.host_ram_gib,
                                   hf_endpoint=endpoint,
                                   model_source=host.model_source, model_keep_revisions=host.model_keep_revisions,
                                   model_reverify=host.model_reverify, model_fanout_width=host.model_fanout_width,
                                   model_fanout=host.model_fanout,
                                   model_fanout_rate_mb_s=host.model_fanout_rate_mb_s,
                                   model_stall_s=host.model_stall_s,
                                   fabric_address=host.fabric_address or address, network_env=_network_env(host),
                                   nvme_devices=tuple(host.nvme_devices), model_filesystem=host.model_filesystem,
                                   format_allow_serials=tuple(host.format_allow_serials), ssh_port=host.ssh_port,
                                   ssh_user=host.ssh_user, ssh_key=host.ssh_key,
                                   ssh_known_hosts_file=host.ssh_known_hosts_file,
                                   ssh_strict_host_key_checking=host.ssh_strict_host_key_checking, verify_bench=host.verify_bench,
                                   verify_full=host.verify_full, admission=host.admission, admission_valid_h=host.admission_valid_h,
                                   admission_h2d=host.admission_h2d, admission_dcgm_level=host.admission_dcgm_level,
                                   dcgm_exporter=host.dcgm_exporter, unit_dropins=host.unit_dropins,
                                   dcgm_exporter_image=host.dcgm_exporter_image,
                                   stack=StackPlan(manage=host.gpu_stack,
                                                   **{k: getattr(host, k) for k in STACK_KEYS
                                                      if k not in ("gpu_check_image", "repo_key_fingerprints")},
                                                   repo_key_fingerprints=trust.pinned(host.repo_key_fingerprints),
                                                   gpu_check_image=_from_registry(host, host.gpu_check_image or
                                                                                  GPU_CHECK_IMAGES.get(hw.vendor, ""))))
    errors += _single_node_engines([(n, d) for n, d in entries if n not in lone_routers], cat)
    errors += router_only.idle(lone_routers, router_only.named(entries))
    pools = _resolve_pools(hosts, errors)
    hosts = _with_ranks(hosts, pools)
    hosts, routers = routed.resolve(hosts, pools, errors, RESERVED_PORTS, offline=offline)
    return Resolved(hosts=hosts, pools=pools, routers=routers, errors=_name_sources(errors, sources or {}),
                    warnings=_name_sources(warnings(hosts, pools, {n: d for n, d in entries if isinstance(d, dict)}),
                                           sources or {}),
                    skipped=skipped or [], info=information(pools))


def _name_sources(problems: list[tuple[str, str, str]], sources: dict[str, dict[str, str]]) -> list:
    """Each host problem names the file (or `--data`) that gave its value, when not the inventory itself."""
    out = []
    for where, fld, msg in problems:
        origin = sources.get(where.removeprefix("host "), {}).get(fld.split(".")[0]) if where.startswith("host ") \
            else None
        if origin and (origin == "--data" or "group_data" in Path(origin).parts):
            msg = f"{msg} (from {origin})"
        out.append((where, fld, msg))
    return out


def information(pools: dict[str, PoolPlan]) -> list[tuple[str, str, str]]:
    """What a recipe says of itself (its notes): the author's information, not a problem `--strict` refuses."""
    return [(f"pool {pool.name}", "recipe", f"{head.recipe.id}: {' '.join(head.recipe.notes.split())}")
            for pool in pools.values() for head in pool.services[:1] if head.recipe.notes]


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
            out += [(where, "extra_args", f"{p}: the engine would refuse to start") for p in _unknown_extra_flags(svc)]
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
        tag = head.image.rsplit("/", 1)[-1].partition(":")[2].split("@")[0]
        version = TAG_BUILD.search(tag) or TAG_VERSION.search(tag)
        if version is None or version.group(1) == "":
            out.append((where, "image", f"{head.image} names no engine version: its flags were checked with "
                                        f"{head.engine_name} {head.recipe.engine_version}'s parser; pin an image "
                                        "of that version"))
        elif version.group(1) != head.recipe.engine_version.lstrip("v"):
            out.append((where, "image", f"{head.image} is {head.engine_name} {version.group(1)}, but recipe "
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


def _resolve_pools(hosts: dict[str, HostPlan], errors: list) -> dict[str, PoolPlan]:
    pools: dict[str, PoolPlan] = defaultdict(lambda: PoolPlan(name=""))
    for plan in hosts.values():
        for svc in plan.services:
            pool = pools[svc.pool]
            pool.name = svc.pool
            pool.hosts.append(plan.name)
            pool.services.append(svc)
    for pool in pools.values():
        where = f"pool {pool.name}"
        head = pool.services[0]
        for fld in ("model", "engine_name", "recipe", "hardware", "served_name", "port", "revision", "image",
                    "gpus"):
            values = sorted({str(getattr(getattr(s, fld), "id", getattr(s, fld))) for s in pool.services})
            if len(values) > 1:
                label = "mixed hardware" if fld == "hardware" else "members disagree"
                errors.append((where, fld.removesuffix("_name"), f"{label}: {', '.join(values)}"))
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
                                   recipe=head.recipe, host_ram_gib=hosts[pool.hosts[0]].host_ram_gib)
            if not report.fits:
                errors.append((where, "model", report.reason))
    return dict(pools)


def _with_ranks(hosts: dict[str, HostPlan], pools: dict[str, PoolPlan]) -> dict[str, HostPlan]:
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
