"""The resolver: raw host data (catalog defaults < group_data < host data) -> HostPlan / PoolPlan, with every
problem collected (host or pool, field, message) so `modelfleet validate` reports them all at once. A host's
own checks are here; its services' in inventory/services.py, the pools' in inventory/pools.py."""

from __future__ import annotations

import difflib
import functools
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pyinfra.api import arguments
from pyinfra.api.connectors import get_all_connectors

from modelfleet.base import grammar
from modelfleet.plan import claims, trust, weight_cache
from modelfleet.plan.catalog import Catalog, Hardware, load_catalog
from modelfleet.plan.inventory import applies, routed, router_only
from modelfleet.plan.inventory.plan import GPU_CHECK_IMAGES, STACK_KEYS, HostPlan, Resolved, ServicePlan, StackPlan
from modelfleet.plan.inventory.pools import information, resolve_pools, warnings, with_ranks
from modelfleet.plan.inventory.schema import COMMIT_RE, HUB_ENDPOINT, SERVICE_KEYS, HostData
from modelfleet.plan.inventory.services import (
    assign_gpus,
    from_registry,
    network_env,
    resolve_service,
    service_entries,
)

# Ports an engine may not take: SSH, the exporters', and the pool's rendezvous and fan-out ports.
RESERVED_PORTS = {22: "SSH", 9100: "node exporter", 9400: "DCGM exporter", 13345: "vLLM data-parallel RPC",
                  18431: "checkpoint fan-out", 29500: "multi-node rendezvous",
                  weight_cache.MASTER_PORT: "the weight caches' rendezvous"}


@functools.cache
def _pyinfra_keys() -> frozenset[str]:
    """pyinfra's own host data: its global arguments and every connector's settings (read once per process:
    scanning the installed packages' entry points costs ~9 ms, and every host of every resolve asked)."""
    keys = {name for name, _ in arguments.all_global_arguments()}  # op_order may have replaced it: looked up now
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
    checked_hosts: dict[str, HostData] = {}
    if not entries:
        errors.append(("inventory", "hosts", "no hosts: the inventory defines no group with a host"))
    for name, data in entries:
        checked = _host(name, data, cat, addresses, errors)
        if checked is None:
            continue
        host, hw = checked
        checked_hosts[name] = host
        if host.router_only:
            lone_routers.append(name)
        gpu_count = host.gpu_count if host.gpu_count is not None else (hw.gpus_per_node if hw else 0)
        if hw and hw.vendor != "none" and gpu_count > hw.gpus_per_node:
            errors.append((f"host {name}", "gpu_count", f"{gpu_count}, but a {hw.id} board has {hw.gpus_per_node} "
                                                        "GPUs (hardware catalog)"))
        services = _services(name, data, host, hw, gpu_count, cat, errors, skipped)
        endpoint = (host.hf_endpoint or os.environ.get("HF_ENDPOINT") or HUB_ENDPOINT).rstrip("/")
        errors += [(f"host {name}", "revision", f"{svc.revision or 'main (unset)'} is not a commit, but model_source "
                    "is a mirror, which has no branches to resolve: pin `revision` to the 40-hex commit it holds "
                    f"(pool {svc.pool})") for svc in services
                   if host.model_source and not COMMIT_RE.match(svc.revision or "")]
        errors += [(f"host {name}", fld, message) for fld, message in trust.transport_problems(
            endpoint, host.model_source, host.hf_token_env, [s.model.id for s in services if s.trust_remote_code],
            host.insecure_http_hosts)]
        if hw is not None:
            hosts[name] = _host_plan(name, host, hw, gpu_count, services, endpoint)
    errors += _single_node_engines([(n, d) for n, d in entries if n not in lone_routers], cat)
    errors += router_only.idle(lone_routers, router_only.named(entries))
    pools = resolve_pools(hosts, errors)
    hosts = with_ranks(hosts, pools)
    door_warnings: list[tuple[str, str, str]] = []
    scopes = routed.door_scopes(hosts)
    for name, host in checked_hosts.items():
        errors += applies.door_problems(host, scopes.get(name, set()), f"host {name}")
    hosts, routers = routed.resolve(hosts, pools, errors, RESERVED_PORTS, offline=offline, warnings=door_warnings)
    errors += claims.collisions(hosts)
    errors, fleet = applies.fleet_wide(errors, sources or {})
    found = warnings(hosts, pools, {n: d for n, d in entries if isinstance(d, dict)}) + door_warnings + fleet
    return Resolved(hosts=hosts, pools=pools, routers=routers, errors=_name_sources(errors, sources or {}),
                    warnings=_name_sources(found, sources or {}),
                    skipped=skipped or [], info=information(pools))


def _host(name: str, data: Any, cat: Catalog, addresses: dict[tuple[str, int], str],
          errors: list) -> tuple[HostData, Hardware | None] | None:
    """The host's own data checked (its keys, directories, SSH address, board, driver, assessed models); None
    where the data is not a host's at all. `addresses` collects (address, port) -> host across the inventory."""
    where = f"host {name}"
    if not isinstance(data, dict):
        errors.append((where, "data", f"host data must be a dict, got {type(data).__name__}"))
        return None
    if grammar.host_address(name.lstrip("@").replace("/", ".")):
        errors.append((where, "name", "is not a host name (letters, digits, . -)"))
    errors += _unknown_keys(data, where)
    try:
        host = HostData(**data)
    except ValidationError as exc:
        for err in exc.errors():
            errors.append((where, ".".join(str(p) for p in err["loc"]), err["msg"].removeprefix("Value error, ")))
        # The other checks still run, the refused values left out, so every error is said at once (no plan runs
        # while any is); `services` refused leaves nothing to check.
        bad = {str(err["loc"][0]) for err in exc.errors() if err["loc"]}
        if "services" in bad or not bad:
            return None
        try:
            host = HostData(**{k: v for k, v in data.items() if k not in bad})
        except ValidationError:
            return None
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
        errors += router_only.problems(where, data, hw) + applies.router_only_problems(data, where)
    errors += applies.host_problems(host, hw, where)
    if host.driver_version and host.driver_version.split(".")[0] != host.driver_branch:
        errors.append((where, "driver_version", f"{host.driver_version} is not a release of driver_branch "
                                                f"{host.driver_branch}"))
    for model_id in host.assess_models:
        if model_id not in cat.models:
            errors.append((where, "assess_models", f"unknown model {model_id!r}"))
    return host, hw


def _services(name: str, data: dict[str, Any], host: HostData, hw: Hardware | None, gpu_count: int, cat: Catalog,
              errors: list, skipped: list | None) -> list[ServicePlan]:
    """The host's services, each resolved, then held together: ports apart and off the reserved ones, pools and
    unit names apart, GPUs enough and each given its own."""
    where = f"host {name}"
    services = []
    ports: dict[int, str] = {}
    reserved = {**RESERVED_PORTS, host.ssh_port: "SSH"}
    for raw in [] if host.router_only else service_entries(data):
        if not isinstance(raw, dict):
            errors.append((where, "services", f"each entry must be a dict, got {type(raw).__name__}"))
            continue
        svc = resolve_service(name, host, hw, raw, cat, errors, skipped)
        if svc is None:
            continue
        if any(s.pool == svc.pool for s in services):  # one pool, one service per host: later checks see one
            errors.append((where, "pool", _same_pool(svc)))
            continue
        for port in svc.ports:
            side = "" if port == svc.port else f" ({svc.engine_name} listens there too, at port + {port - svc.port})"
            if port in ports:
                errors.append((where, "port", f"{port} is used by pools {ports[port]} and {svc.pool}{side}"))
            if port in reserved or port > 65535:
                errors.append((where, "port", f"{port} is reserved for {reserved.get(port, 'nothing: past 65535')}"
                                              f"{side}"))
            ports[port] = svc.pool + side
        if svc.gpus > gpu_count and hw and hw.vendor != "none":
            errors.append((where, "gpus", f"service {svc.pool} wants {svc.gpus} GPUs, host has {gpu_count}"))
        services.append(svc)
    if len({s.unit_name for s in services}) != len(services):
        errors.append((where, "pool", "two services of this host would share a unit name: give each its own "
                                      "`pool`"))
    wanted = sum(s.gpus for s in services)
    if len(services) > 1 and hw and hw.vendor != "none" and wanted > gpu_count:
        errors.append((where, "gpus", f"its services want {wanted} GPUs together, host has {gpu_count}"))
    elif hw and hw.vendor != "none":
        services = assign_gpus(services, gpu_count, where, errors)
    return services


def _same_pool(svc: ServicePlan) -> str:
    """Why a host's second service of one pool is refused, and the layout that serves several replicas there."""
    if svc.unit_stem:  # no `pool` given: every such service is the pool named after the host
        return (f"two services of this host leave `pool` unset, so both would be pool {svc.pool} (one unit, one "
                f"env file): give each service of a host its own `pool` (e.g. {svc.pool}-0, {svc.pool}-1) and "
                "`port`, and `gpu_indices` to choose their GPUs (docs/validation.md, \"Several replicas on one "
                "host\")")
    return (f"two services of this host name pool {svc.pool}: a pool is one service per host (a replica "
            "beside it is a pool of its own: give it its own `pool` and `port`)")


def _host_plan(name: str, host: HostData, hw: Hardware, gpu_count: int, services: list[ServicePlan],
               endpoint: str) -> HostPlan:
    """The checked host data as its plan (the settings carried over as they are, defaults filled in)."""
    address = host.ssh_hostname or name
    return HostPlan(name=name, address=address, hardware=hw, gpu_count=gpu_count,
                    model_root=host.model_root, config_dir=host.config_dir.rstrip("/"), hf_token_env=host.hf_token_env,
                    services=tuple(services), assess_models=tuple(host.assess_models),
                    host_ram_gib=host.host_ram_gib or hw.host_ram_gib,
                    hf_endpoint=endpoint,
                    model_source=host.model_source, model_keep_revisions=host.model_keep_revisions,
                    model_reverify=host.model_reverify, model_fanout_width=host.model_fanout_width,
                    model_fanout=host.model_fanout,
                    model_fanout_rate_mb_s=host.model_fanout_rate_mb_s,
                    model_stall_s=host.model_stall_s,
                    fabric_address=host.fabric_address or address, network_env=network_env(host),
                    nvme_devices=tuple(host.nvme_devices), model_filesystem=host.model_filesystem,
                    format_allow_serials=tuple(host.format_allow_serials), ssh_port=host.ssh_port,
                    ssh_user=host.ssh_user, ssh_key=host.ssh_key,
                    ssh_known_hosts_file=host.ssh_known_hosts_file,
                    ssh_strict_host_key_checking=host.ssh_strict_host_key_checking, verify_bench=host.verify_bench,
                    verify_full=host.verify_full, admission=host.admission, admission_valid_h=host.admission_valid_h,
                    admission_h2d=host.admission_h2d, admission_dcgm_level=host.admission_dcgm_level,
                    dcgm_exporter=host.dcgm_exporter, unit_dropins=host.unit_dropins,
                    dcgm_exporter_image=host.dcgm_exporter_image, router_worker_firewall=host.router_worker_firewall,
                    router_pip_index_url=host.router_pip_index_url,
                    stack=StackPlan(manage=host.gpu_stack,
                                    **{k: getattr(host, k) for k in STACK_KEYS
                                       if k not in ("gpu_check_image", "repo_key_fingerprints")},
                                    repo_key_fingerprints=trust.pinned(host.repo_key_fingerprints),
                                    gpu_check_image=from_registry(host, host.gpu_check_image or
                                                                  GPU_CHECK_IMAGES.get(hw.vendor, ""))))


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


