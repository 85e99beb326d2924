"""One service entry of a host -> its ServicePlan: the entry's own keys over the host's and group's service
keys, checked against the catalog (model, engine, recipe), the host (driver, GPUs) and the exposure rules, every
problem collected as (where, field, message)."""

from __future__ import annotations

import difflib
import ipaddress
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from modelfleet.base import host_commands, image_runtime, keys, masking
from modelfleet.plan import engine_flags, venvs, weight_cache
from modelfleet.plan.catalog import Catalog, Engine, Hardware, Recipe, arg_refusals, load_catalog
from modelfleet.plan.catalog.routers import pd_role
from modelfleet.plan.exposure import off_loopback_problem
from modelfleet.plan.inventory import applies
from modelfleet.plan.inventory.plan import RouterChoice, ServicePlan, _is_loopback, _slug
from modelfleet.plan.inventory.routed import PROXY_KEY
from modelfleet.plan.inventory.schema import COMMIT_RE, SERVICE_KEYS, HostData, ServiceData


def service_entries(data: dict[str, Any]) -> list[Any]:
    """The services of a host's (checked) data. Service keys given at host or group level are the defaults of
    every `services` entry (an entry's own value wins), as pyinfra's precedence does everywhere else."""
    defaults = {k: data[k] for k in SERVICE_KEYS if k in data}
    if data.get("services") is None:
        return [defaults]
    return [{**defaults, **entry} if isinstance(entry, dict) else entry for entry in data["services"]]


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
                       f"{hardware}; {_recipe_choices(cat, svc, hardware)}"))
        return None
    if len(found) > 1:
        errors.append((where, "recipe", f"several recipes match ({', '.join(r.id for r in found)}): "
                       "name one with `recipe`"))
        return None
    return found[0]


def _recipe_choices(cat: Catalog, svc: ServiceData, hardware: str) -> str:
    """What a service without a recipe can be switched to, and the next step: its model's recipes on its board
    (another engine, a prefill/decode part), else its model's on other boards, else the board's recipes."""
    def listed(recipes: list[Recipe], model: bool = False) -> str:
        return ", ".join(f"{r.id} ({r.model + ', ' if model else ''}{r.engine} on {'/'.join(r.hardware)}"
                         + (f", the {pd_role(r, r.engine)} part of a prefill/decode pair" if pd_role(r, r.engine)
                            else "") + ")" for r in sorted(recipes, key=lambda r: r.id))
    site = f"add a site recipe for {svc.model} with {svc.engine} on {hardware} (recipes/ beside the inventory, " \
           "docs/recipes.md)"
    of_model = [r for r in cat.recipes.values() if r.model == svc.model]
    here = [r for r in of_model if hardware in r.hardware]
    if here:
        return f"on {hardware} it has {listed(here)}: name one with `recipe` (and its `engine`), or {site}"
    if of_model:
        return f"its recipes are for other boards: {listed(of_model)}: serve it on one of those, or {site}"
    on_board = [r for r in cat.recipes.values() if hardware in r.hardware]
    return (f"no recipe serves {svc.model} on any board, and {hardware} has {listed(on_board, True) or 'none'}: "
            f"{site}")


def resolve_service(name: str, host: HostData, hw: Hardware | None, raw: dict[str, Any], cat: Catalog,
                    errors: list, skipped: list | None = None) -> ServicePlan | None:
    """One `services` entry (the host's service keys under it) -> its plan; None where it names no known model,
    engine or recipe. Every problem goes to `errors`; `skipped` (offline) collects the secrets not looked up."""
    where = f"host {name}"
    named = _named(where, raw, cat, hw, errors)
    if named is None:
        return None
    svc, recipe = named
    model, engine = cat.models[svc.model], cat.engines[svc.engine]
    port = svc.port if svc.port is not None else engine.default_port
    # A GGUF recipe's engine (llama.cpp) reads weights and runs none of the checkpoint's own code.
    gguf = bool(recipe.gguf_quant and model.gguf)
    trust = not gguf and (model.trust_remote_code if svc.trust_remote_code is None else svc.trust_remote_code)
    errors += _problems(where, svc, host, hw, recipe, engine, port, trust, skipped)
    if gguf and svc.trust_remote_code:
        errors.append((where, "trust_remote_code", f"True, but recipe {recipe.id} serves GGUF weights with "
                                                   f"{svc.engine}, which runs none of the checkpoint's code: it "
                                                   "would be ignored; take it out"))
    gpus = svc.gpus if svc.gpus is not None else recipe.layout.gpus_per_node
    venv = venv_plan(where, svc, recipe, engine.entrypoint, errors) \
        if (svc.runtime or recipe.default_runtime) == "venv" else None
    errors += [(where, fld, "set, but the service runs a container (say runtime: venv)") for fld in
               ("venv_lock", "venv_wheelhouse", "venv_index_url", "venv_python")
               if venv is None and fld in svc.model_fields_set and (svc.runtime or recipe.default_runtime) != "venv"]
    if venv is None and not (svc.image or recipe.image):
        errors.append((where, "runtime", f"container, but recipe {recipe.id} names no image (it installs the "
                                         "engine into a venv: say runtime: venv with venv_lock)"))
    image = "" if venv or not (svc.image or recipe.image) else from_registry(host, svc.image or recipe.image)
    revision_dir = svc.revision or "main"
    return ServicePlan(
        host=name, pool=svc.pool or _slug(name), unit_stem="" if svc.pool else _slug(svc.served_name or model.id),
        model=model, engine_name=svc.engine, engine=engine,
        recipe=recipe, hardware=hw, gpus=gpus, served_name=svc.served_name or model.id, port=port,
        driver_branch=host.driver_branch,
        bind_address="127.0.0.1" if keyed_door(svc, engine) else svc.bind_address,
        door_address=svc.bind_address if keyed_door(svc, engine) else None,
        api_key_env=svc.api_key_env, revision=svc.revision,
        trust_remote_code=trust, image=image, extra_args=tuple(svc.extra_args),
        env={**recipe.env, **network_env(host), **svc.env},
        model_dir=host_commands.model_dir(host.model_root, model.id, revision_dir),
        gpu_passthrough=host.gpu_passthrough, config_dir=host.config_dir.rstrip("/"),
        checkpoint_group=svc.checkpoint_group or svc.pool or _slug(name),
        engine_cache_sharing=svc.engine_cache_sharing, weight_cache=svc.weight_cache,
        netcheck_min_busbw_gbps=svc.netcheck_min_busbw_gbps, netcheck_timeout_s=svc.netcheck_timeout_s,
        recipe_params=dict(svc.recipe_params), model_file=recipe.model_file,
        gpu_indices=tuple(svc.gpu_indices or ()),
        router=RouterChoice(host=svc.router, port=svc.router_port, bind_address=svc.router_bind_address,
                            policy=svc.router_policy, tls_cert=svc.router_tls_cert,
                            client_keys_env=tuple(svc.router_client_keys_env or ()),
                            tls_key=svc.router_tls_key, server_name=svc.router_server_name)
        if svc.router else None,
        venv=venv,
    )


def venv_plan(where: str, svc: ServiceData, recipe: Recipe, entrypoint: str,
              errors: list) -> venvs.VenvPlan | None:
    """The service's venv (runtime venv) from its lock and wheelhouse on the control node, or None with every
    problem in `errors`: a recipe without a venv route, no lock, a lock without hashes or not holding what the
    guide installs, a wheelhouse missing a file the lock names or built for another Python than venv_python."""
    route = recipe.venv
    if route is None:
        errors.append((where, "runtime", f"venv, but recipe {recipe.id} has no venv route (it runs the image "
                                         f"{recipe.image})"))
        return None
    why = {"image": "no image runs", "weight_cache": "the restart tier's daemon runs in a container"}
    errors += [(where, fld, f"set, but runtime is venv: {why[fld]} (runtime container, or unset it)")
               for fld in why if getattr(svc, fld)]
    if recipe.layout.nodes > 1:
        errors.append((where, "runtime", f"venv: recipe {recipe.id} spans {recipe.layout.nodes} hosts; a pool "
                                         "across hosts runs containers (its network gate runs in the image)"))
    if not svc.venv_lock:
        hint = f" (make one: {route.lock_with})" if route.lock_with else " (pip-compile/uv --generate-hashes)"
        errors.append((where, "venv_lock", f"missing: runtime venv installs from a lock with hashes{hint}"))
        return None
    lock, problems = venvs.read_lock(svc.venv_lock)
    errors += [(where, "venv_lock", p) for p in problems]
    if lock is None or problems:
        return None
    errors += [(where, "venv_lock", p) for p in venvs.requirement_problems(lock, route.requires, route.prerelease)]
    package = route.package or recipe.engine
    entry = lock.get(package)
    if entry is None:
        errors.append((where, "venv_lock", f"{svc.venv_lock} has no {package}, the engine's distribution"))
        return None
    wheels, needs = (), ()
    if svc.venv_wheelhouse:
        files, missing, needs = venvs.wheelhouse_files(lock, svc.venv_wheelhouse)
        errors += [(where, "venv_wheelhouse", m) for m in missing]
        wheels = tuple(files)
        pinned = venvs.python_version_of(svc.venv_python)
        if pinned and needs and pinned not in needs:
            errors.append((where, "venv_python", f"{svc.venv_python}, but the wheelhouse's wheels are built for "
                                                 f"Python {' or '.join(needs)}"))
    return venvs.VenvPlan(
        path=venvs.venv_path(recipe.engine, entry.version, lock.digest), engine=recipe.engine,
        version=entry.version, lock_file=svc.venv_lock, lock_digest=lock.digest, python=svc.venv_python,
        python_needs=needs, python_min=route.python, wheelhouse=svc.venv_wheelhouse, wheels=wheels,
        index_url=svc.venv_index_url, entrypoint=tuple(route.entrypoint or [entrypoint]))


def _named(where: str, raw: dict[str, Any], cat: Catalog, hw: Hardware | None,
           errors: list) -> tuple[ServiceData, Recipe] | None:
    """The entry read by the schema, with the recipe it names or implies; None where its model or engine is
    missing or unknown, or the host has no known board, or no one recipe fits."""
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
    recipe = _pick_recipe(cat, svc, hw.id, where, errors)
    return None if recipe is None else (svc, recipe)


def _problems(where: str, svc: ServiceData, host: HostData, hw: Hardware, recipe: Recipe, engine: Engine,
              port: int, trust: bool, skipped: list | None) -> list[tuple[str, str, str]]:
    """What is wrong with a service that names a known model, engine and recipe: its port, its image against the
    board and the driver, trust_remote_code without a pinned commit, its exposure and key, extra_args, env
    names, recipe parameters."""
    errors: list[tuple[str, str, str]] = applies.service_problems(svc, where)
    if not 1 <= port <= 65535:
        errors.append((where, "port", f"{port} is outside 1-65535"))
    if recipe.rocm and hw.vendor != "amd":
        errors.append((where, "recipe", f"{recipe.id} runs a ROCm image but {hw.id} is a {hw.vendor} host"))
    if recipe.cuda and hw.vendor != "nvidia":
        errors.append((where, "recipe", f"{recipe.id} runs a CUDA image but {hw.id} is a {hw.vendor} host"))
    if trust and not (svc.revision and COMMIT_RE.match(svc.revision)):
        errors.append((where, "revision", f"{svc.model} needs trust_remote_code: pin `revision` to a 40-hex "
                       f"commit (got {svc.revision!r}) so the code that runs is the code you reviewed"))
    if svc.router and "bind_address" in svc.model_fields_set:
        errors.append((where, "bind_address", f"set, but the replica is served through the front door on "
                       f"{svc.router}: it listens where only the router reaches it (unset bind_address)"))
    exposed = None if _is_loopback(svc.bind_address) or keyed_door(svc, engine) else \
        off_loopback_problem(svc.engine, svc.bind_address, svc.api_key_env)
    if exposed:
        errors.append((where, "bind_address", exposed))
    if svc.api_key_env and not svc.router and _is_loopback(svc.bind_address) and not engine.api_key_env \
            and not engine.api_key_config_file:
        errors.append((where, "api_key_env", f"{svc.engine} holds no key: on loopback nothing would check "
                       f"{svc.api_key_env}; unset it, or set `bind_address` for a keyed proxy on that address"))
    if keyed_door(svc, engine) and _ip(svc.bind_address) in WILDCARDS:
        errors.append((where, "bind_address", f"{svc.bind_address} for {svc.engine}, which holds no key: its keyed "
                       f"proxy would listen on every address of the port the engine holds on 127.0.0.1 (the kernel "
                       "refuses both): give the one address clients use"))
    door_key = keys.from_env(svc.api_key_env) if keyed_door(svc, engine) and skipped is None else None
    if door_key and not PROXY_KEY.match(door_key.strip()):
        errors.append((where, "api_key_env", f"the value of {svc.api_key_env} (not shown) has characters the keyed "
                       "proxy's config cannot hold: use 8-512 of A-Z a-z 0-9 . _ ~ + / = -"))
    if svc.api_key_env and skipped is not None:
        skipped.append((where, "api_key_env", f"{svc.api_key_env} not looked up (--offline)"))
    elif svc.api_key_env and keys.from_env(svc.api_key_env) is None:
        errors.append((where, "api_key_env", f"{svc.api_key_env} is not set in the control node's environment"))
    elif svc.api_key_env and not keys.stripped(svc.api_key_env):
        errors.append((where, "api_key_env", f"{svc.api_key_env} is set but empty: the endpoint would serve "
                                             "without a key"))
    if not trust and any("--trust-remote-code" in engine_flags.reads_as(svc.engine, engine.flag_parser, a)
                         for a in recipe.args):
        errors.append((where, "trust_remote_code", f"false, but recipe {recipe.id} passes --trust-remote-code: "
                                                   "the model needs it (pin `revision` to a commit instead)"))
    errors += [(where, "extra_args", message) for message in _extra_args_problems(svc.extra_args, engine, recipe,
                                                                                   svc.engine)]
    errors += [(where if key in svc.env else f"recipe {recipe.id}", f"env.{key}", problem)
               for key in {**recipe.env, **svc.env} if (problem := masking.env_name_problem(key))]
    # What modelfleet sets in the engine's environment itself (its address, its store, its keep-alive): not the
    # env's to move (it would be overwritten in silence).
    own = engine.own_env()
    errors += [(where if key in svc.env else f"recipe {recipe.id}", f"env.{key}", f"set by modelfleet for "
                f"{svc.engine} ({own[key]}): take it out")
               for key in sorted(set(own) & {*recipe.env, *svc.env})]
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
    if svc.weight_cache and (refused := weight_cache.refusal(svc.engine, engine, recipe, svc.extra_args)):
        errors.append((where, "weight_cache", refused))
    # The image's CUDA against the driver, and a service's own image against the recipe's CUDA/ROCm.
    runtime = [("image", image_runtime.tag_problem(svc.image, recipe.cuda, recipe.rocm) if svc.image else None),
               ("driver_branch", image_runtime.driver_problem(recipe.cuda, host.driver_branch)
                if hw.vendor == "nvidia" else None)]
    errors += [(where, fld, f"recipe {recipe.id}: {msg}") for fld, msg in runtime if msg]
    return errors


WILDCARDS = {ipaddress.ip_address("0.0.0.0"), ipaddress.ip_address("::")}  # every address of the host


def _ip(text: str):
    try:
        return ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None


def keyed_door(svc: ServiceData, engine: Engine) -> bool:
    """A service off loopback whose engine cannot hold the key itself (no key variable or file: TokenSpeed,
    Ollama) and that has no front door: the engine listens on loopback, a keyed proxy of its host
    (modelfleet.plan.replica_door, every route but /health keyed) on the address asked for."""
    return bool(svc.api_key_env and not svc.router and not _is_loopback(svc.bind_address)
                and not engine.api_key_env and not engine.api_key_config_file)


def _extra_args_problems(extra: list[str], engine: Engine, recipe: Recipe, engine_name: str = "") -> list[str]:
    """Flags modelfleet or the recipe already set, by any spelling the engine's parser accepts (a prefix, an
    alias, `--flag=value`): a second copy would override the address, key, port or the parallel layout behind
    the validator's back (change the recipe instead)."""
    refused = arg_refusals(extra, engine_name or recipe.engine, engine, load_catalog().engines)
    flags = engine_flags.table(engine_name or recipe.engine, engine.flag_parser)
    if flags is None:
        return refused
    return refused + engine_flags.problems(extra, flags, engine_flags.extra_protected(engine, flags, recipe),
                                           check_unknown=False)


def unknown_extra_flags(svc: ServicePlan) -> list[str]:
    """extra_args the recorded parser of the recipe's engine version does not know (a warning: another image
    may have them)."""
    flags = engine_flags.table(svc.engine_name, svc.engine.flag_parser)
    if flags is None or flags.version != svc.recipe.engine_version.lstrip("v"):
        return []
    return [p for p in engine_flags.problems(svc.extra_args, flags, {}, check_unknown=True)]


def assign_gpus(services: list[ServicePlan], gpu_count: int, where: str, errors: list) -> list[ServicePlan]:
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


def from_registry(host: HostData, image: str) -> str:
    """The image through the site mirror / lab registry, when the inventory names one."""
    if host.image_registry and not image.startswith(f"{host.image_registry.rstrip('/')}/"):
        return f"{host.image_registry.rstrip('/')}/{image}"
    return image


def network_env(host: HostData) -> dict[str, str]:
    """NCCL/Gloo interface settings, for the gate's container and the engine's alike."""
    names = {"NCCL_SOCKET_IFNAME": host.nccl_socket_ifname, "GLOO_SOCKET_IFNAME": host.gloo_socket_ifname,
             "NCCL_IB_HCA": host.nccl_ib_hca}
    return {key: value for key, value in names.items() if value}
