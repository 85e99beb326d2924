"""Rendering (pure): engine argv, docker run argv, systemd unit and env file for a ServicePlan."""

from __future__ import annotations

import json

import jinja2
import yaml

from modelfleet import TEMPLATES_DIR
from modelfleet.base import grammar, keys, masking, runscope
from modelfleet.plan import caches, engine_flags, venvs, weight_cache
from modelfleet.plan.catalog.routers import pd_role, pd_spec
from modelfleet.plan.inventory.plan import HostFabric, ServicePlan, _url_host

DOCKER = "/usr/bin/docker"
CONTAINER_MODEL_DIR = "/model"
CONTAINER_SECRETS = "/run/modelfleet/secrets.yaml"
# A venv engine reads its key file as a systemd credential (root's 0600 file, handed to the unit's own user):
# `%d` is the unit's credentials directory, a specifier systemd expands in ExecStart.
CREDENTIAL = "secrets.yaml"
_CREDENTIAL_MARK = "@MODELFLEET_CREDENTIAL@"
START_LIMIT_INTERVAL_S = 600
START_LIMIT_BURST = 3
MASK = masking.MASK
# Multi-node rendezvous ports (on the head's fabric address): vLLM's DP coordinator, torch.distributed's master.
DP_RPC_PORT = 13345
MASTER_PORT = 29500

class Lines(str):
    """Text modelfleet itself split over lines (a unit's continued ExecStart): the one value a template may
    print with a newline in it."""


def _one_line(value):
    """Every value a template prints (unit, env file, proxy config, launcher) stays on its line, whatever door
    it came through: the last guard after the grammar."""
    if not isinstance(value, Lines) and grammar.no_control(str(value)):
        raise ValueError(f"refusing to render a value with a control character: {str(value)[:40]!r}...")
    return value


_env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR), keep_trailing_newline=True,
                          trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
                          finalize=_one_line)


def served_names(svc: ServicePlan) -> list[str]:
    """The names clients call the model by: the inventory's, then the hub id when the recipe serves it too and
    the engine takes several names."""
    names = [svc.served_name]
    if svc.recipe.serve_hub_id and svc.engine.several_served_names and svc.model.hf_repo not in names:
        names.append(svc.model.hf_repo)
    return names


def engine_argv(svc: ServicePlan) -> list[str]:
    """
    The engine's own command line (what follows the image name): modelfleet's flags, the engine's defaults
    (metrics, and the memory fraction the planner sized with) unless the recipe sets them itself, the recipe's
    flags, the multi-node flags, the recipe's required parameters, then `extra_args`. No flag appears twice
    (validate refuses extra_args that repeat one).
    """
    engine, recipe = svc.engine, svc.recipe
    argv = [a.format(model_path=_model_path(svc)) for a in engine.argv]
    if not engine.address_env:  # else its environment names the address (env_values), its Modelfile the model
        argv += [engine.served_name_flag, *served_names(svc), engine.host_flag, svc.bind_address,
                 engine.port_flag, str(svc.port)]

    def reads(token: str) -> set[str]:  # as the engine's parser reads it: `--a_b=1` is `--a-b`
        return engine_flags.reads_as(svc.engine_name, engine.flag_parser, token)

    in_recipe = {o for a in recipe.args for o in reads(a)}
    argv += [a for a in engine.metrics_args if not reads(a) & in_recipe]
    if engine.memory_fraction_flag and not reads(engine.memory_fraction_flag) & in_recipe:
        argv += [engine.memory_fraction_flag, str(recipe.memory_fraction)]
    # With the weight cache, a recipe flag its client flags replace (--load-format) goes to the daemon.
    argv += weight_cache.displaced(svc, recipe.args)[0] + multinode_args(svc)
    argv += [a for flag, value in pd_values(svc, "engine_args").items() for a in (flag, value)]
    argv += weight_cache.engine_args(svc)
    for name, parameter in recipe.parameters.items():
        if name in svc.recipe_params:
            argv += [parameter.flag, str(svc.recipe_params[name])]
    argv += list(svc.extra_args)
    if svc.api_key_env and engine.api_key_config_file:
        argv += ["--config", _CREDENTIAL_MARK if svc.venv else CONTAINER_SECRETS]
    return argv


def multinode_args(svc: ServicePlan) -> list[str]:
    """
    The engine's own multi-node flags (`multinode` in catalog/engines.yaml), from the pool's ranks (the first
    host is the head, rank 0): its data-parallel launch for a recipe with dp > 1 where it has one, else the
    sharded (TP/PP) one; workers add their own flags.
    """
    if svc.nnodes == 1:
        return []
    layout, modes = svc.recipe.layout, svc.engine.multinode
    flags = modes["dp"] if layout.dp > 1 and "dp" in modes else modes["tp"]
    local = layout.dp // svc.nnodes
    values = {"nnodes": svc.nnodes, "node_rank": svc.node_rank, "head": rendezvous_address(svc),
              "master_port": MASTER_PORT, "dp": layout.dp, "dp_local": local, "dp_rpc_port": DP_RPC_PORT,
              "dp_start": svc.node_rank * local}
    return [arg.format(**values) for arg in flags.all + (flags.workers if svc.node_rank else [])]


def pd_values(svc: ServicePlan, kind: str) -> dict[str, str]:
    """The fabric's values a server of a prefill/decode layout gets (`engine_args` or `engine_env` of its router's
    PD mode, catalog/routers.yaml): its own address, the derived HCAs. A value the fabric does not give (a pool of
    one host has no derived fabric; a member but the head has no known address without one) is left to the
    engine's own choice."""
    pd = pd_spec(svc.engine_name)
    if pd is None or pd_role(svc.recipe, svc.engine_name) is None:
        return {}
    fabric = svc.fabric
    own = (fabric.env.get(svc.engine.host_ip_env or "") if fabric else None) or \
        (svc.head_address if svc.node_rank == 0 and not fabric else None)
    listed = fabric.env.get("NCCL_IB_HCA", "") if fabric else ""  # NCCL's exact-match form; `^` excludes
    known = {"address": own, "hcas": ",".join(fabric.hcas) if fabric and fabric.hcas else None,
             "hca_ports": listed.lstrip("=") if listed and not listed.startswith("^") else None}
    return {name: known[source] for name, source in getattr(pd, kind).items() if known[source]}


def rendezvous_address(svc: ServicePlan) -> str:
    """Where the pool's members meet: the head's address on the fabric interface when the pool's fabric is
    known, else the inventory's (fabric_address, then the SSH address)."""
    return svc.fabric.head_address if svc.fabric and svc.fabric.head_address else svc.head_address


def fabric_flags(fabric: HostFabric | None) -> list[str]:
    """
    What a container needs to use the host's fabric, the engine's and the gate's alike: the RDMA and IMEX
    channel device nodes, and where HCAs are used, IPC_LOCK and an unlimited memlock (verbs pin their
    buffers; without them NCCL falls back to sockets without a word).
    """
    if fabric is None:
        return []
    argv = [arg for device in fabric.devices for arg in ("--device", device)]
    return argv + (["--cap-add", "IPC_LOCK", "--ulimit", "memlock=-1"] if fabric.rdma else [])


def fabric_env(svc: ServicePlan) -> dict[str, str]:
    """The pool network's environment (NCCL_*, GLOO_*, the engines' host-IP variables): the inventory's
    settings, then the fabric's (which already carry the inventory's values where it gave them). The gate's
    container gets exactly these; the engine's env file holds them beside the rest."""
    env = {k: v for k, v in svc.env.items() if k.startswith(("NCCL_", "GLOO_"))}
    return {**env, **(svc.fabric.env if svc.fabric else {})}


# The first DRM render node; amdgpu numbers its GPUs' nodes from here in PCI order (an integrated GPU or a
# display adapter ahead of them shifts this: give gpu_indices accordingly).
AMD_FIRST_RENDER_NODE = 128


def gpu_flags(svc: ServicePlan) -> list[str]:
    """
    The service's own GPUs, by index. NVIDIA: CDI device requests (`--device nvidia.com/gpu=N`, from the spec
    container_runtime generates): the devices are in the container's OCI spec, so a `systemctl daemon-reload`
    re-applies them instead of dropping them (NVIDIA container toolkit issue #48, which `--gpus` hits under
    the systemd cgroup driver). AMD: /dev/kfd and the service's render nodes, the video group by name (every
    image has it) and the host's render group by number (read on the host).
    """
    if not svc.gpu_passthrough or svc.hardware.vendor == "none":
        return []
    if svc.hardware.vendor == "amd":
        nodes = [arg for i in svc.gpu_indices for arg in ("--device", f"/dev/dri/renderD{AMD_FIRST_RENDER_NODE + i}")]
        render_group = ["--group-add", str(svc.render_gid)] if svc.render_gid is not None else []
        return ["--device", "/dev/kfd", *nodes, "--group-add", "video", *render_group]
    return [arg for i in svc.gpu_indices for arg in ("--device", f"nvidia.com/gpu={i}")]


# An engine's container shares the host's network: its root must not take another user's uid (the owner rule
# before a front door's router lets two users in by uid, modelfleet.plan.router.render_rule), neither by setuid() nor
# by a setuid file it made.
CONTAINER_UIDS_FIXED = ("--cap-drop", "SETUID", "--cap-drop", "SETGID", "--security-opt", "no-new-privileges")


def docker_run_argv(svc: ServicePlan) -> list[str]:
    docker = svc.recipe.docker
    argv = [DOCKER, "run", "--rm", "--name", svc.container_name, "--init", "--network", "host",
            f"--ipc={docker.get('ipc', 'host')}", *CONTAINER_UIDS_FIXED]
    if "shm_size" in docker:
        argv += ["--shm-size", docker["shm_size"]]
    argv += gpu_flags(svc) + fabric_flags(svc.fabric)
    # Secrets and recipe env come from a 0600 file, never from this command line.
    argv += ["--env-file", svc.env_file, "-v", f"{svc.model_dir}:{CONTAINER_MODEL_DIR}:ro"]
    argv += caches.docker_flags(engine_cache(svc)) + weights_mount(svc)
    if svc.api_key_env and svc.engine.api_key_config_file:
        argv += ["-v", f"{svc.secrets_config_file}:{CONTAINER_SECRETS}:ro"]
    if svc.engine.registration:  # its store on the model root, the Modelfile that registers the checkpoint
        argv += ["-v", f"{store_dir(svc)}:{CONTAINER_STORE}", "-v", f"{modelfile_path(svc)}:{CONTAINER_MODELFILE}:ro"]
    argv += ["--entrypoint", svc.engine.entrypoint, svc.image]
    return argv + engine_argv(svc)


def weights_mount(svc: ServicePlan) -> list[str]:
    """The weight cache's sockets (both containers), and what both need beside the host's IPC namespace."""
    cache = weight_cache.spec(svc)
    if cache is None:
        return []
    return ["-v", f"{weight_cache.socket_dir(svc)}:{weight_cache.CONTAINER_SOCKETS}", *cache.docker_args]


# The weight cache unit names its image through its environment file (systemd expands it in ExecStart): an
# image-only change rewrites that file, not the unit, so the running daemon keeps its weights.
WEIGHTS_IMAGE_VAR = "MODELFLEET_WEIGHTS_IMAGE"
_IMAGE_MARK = "@MODELFLEET_WEIGHTS_IMAGE@"


def weights_docker_argv(svc: ServicePlan) -> list[str]:
    """The weight cache daemon's container: the engine's GPUs, fabric and environment (no key), the revision's
    folder read-only, the sockets' folder; its image from the unit's environment file."""
    argv = [DOCKER, "run", "--rm", "--name", weight_cache.container_name(svc), "--init", "--network", "host",
            f"--ipc={svc.recipe.docker.get('ipc', 'host')}", *CONTAINER_UIDS_FIXED]
    argv += ["--shm-size", svc.recipe.docker["shm_size"]] if "shm_size" in svc.recipe.docker else []
    argv += gpu_flags(svc) + fabric_flags(svc.fabric)
    argv += ["--env-file", weight_cache.env_file(svc), "-v", f"{svc.model_dir}:{CONTAINER_MODEL_DIR}:ro"]
    argv += weights_mount(svc) + ["--entrypoint", weight_cache.spec(svc).daemon_entrypoint, _IMAGE_MARK]
    return argv + weights_daemon_argv(svc)


def weights_daemon_argv(svc: ServicePlan) -> list[str]:
    """The daemon's own command line (what follows its entrypoint and image)."""
    return weight_cache.daemon_argv(svc, engine_argv(svc), _model_path(svc), rendezvous_address(svc))


def _model_path(svc: ServicePlan) -> str:
    """Where the engine finds the checkpoint: the container's mount, or the host's directory for a venv."""
    root = svc.model_dir if svc.venv else CONTAINER_MODEL_DIR
    return f"{root}/{svc.model_file}" if svc.model_file else root


def weights_env(svc: ServicePlan, mask: bool = False) -> dict[str, str]:
    """The daemon's environment: the engine's without its key and its compile caches (not mounted there), and
    the image its unit runs."""
    cache = engine_cache(svc)
    left_out = {svc.engine.api_key_env, *(cache.env if cache else ())}
    env = {k: v for k, v in env_values(svc, mask).items() if k not in left_out}
    return {**env, WEIGHTS_IMAGE_VAR: svc.image}


def render_weights_unit(svc: ServicePlan) -> str:
    argv = one_line_each(weights_docker_argv(svc))
    # Every GPU's socket, or the daemon's container gone (after its first 30 s: docker may not have made it
    # yet): a failed daemon fails its unit at once, and the engine waiting on it starts and loads from disk.
    running = f"{DOCKER} container inspect -f {{{{.State.Running}}}} {weight_cache.container_name(svc)}"
    ready = (f"n=0; until [ $(find {weight_cache.socket_dir(svc)} -maxdepth 1 -type s | wc -l) -ge {svc.gpus} ]; "
             f"do n=$((n + 1)); if [ $n -gt 15 ] && [ \"$({running} 2>/dev/null)\" != true ]; then exit 1; fi; "
             "sleep 2; done")
    stale = f"find {weight_cache.socket_dir(svc)} -mindepth 1 -maxdepth 1 -delete"
    return render_template("weights.service.j2", svc=svc, unit=weight_cache, key=weight_cache.key_hash(
        svc, engine_argv(svc)), exec_start=Lines(exec_start(argv).replace(_IMAGE_MARK, "${" + WEIGHTS_IMAGE_VAR + "}")),
        exec_ready=exec_start(["/bin/sh", "-c", ready]), exec_clean=exec_start(["/bin/sh", "-c", stale]),
        exec_verified=exec_start(["/bin/sh", "-c", weight_cache.verified_check(svc)]))


def render_weights_env(svc: ServicePlan, mask: bool = False) -> str:
    env = weights_env(svc, mask)
    one_line_each([*env, *env.values()])
    return _env.get_template("engine.env.j2").render(svc=svc, env=env, what="weight cache")


def engine_cache(svc: ServicePlan) -> caches.EngineCache | None:
    """The service's engine cache directory, keyed by (among the rest) the engine's full argv; worked out once
    per run for each form of the service (the stages, its unit and its env file all ask)."""
    return runscope.memo("engine caches", svc, lambda: caches.cache_of(svc, engine_argv(svc)))


def systemd_quote(arg: str) -> str:
    """Quote one argument for a systemd Exec line (systemd.service(5): quoting and specifiers)."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if escaped and not any(c in escaped for c in " \t\"'\\;"):
        return escaped
    return "'" + escaped.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _paired(argv: list[str]) -> list[str]:
    """One line per flag and its value, for a readable unit file."""
    lines: list[str] = []
    for arg in argv:
        if lines and lines[-1].startswith("-") and " " not in lines[-1] and not arg.startswith("-"):
            lines[-1] += " " + arg
        else:
            lines.append(arg)
    return lines


def render_template(template: str, **values) -> str:
    """Any unit template, with the start limits every modelfleet unit shares."""
    return _env.get_template(template).render(docker=DOCKER, start_limit_interval=START_LIMIT_INTERVAL_S,
                                          start_limit_burst=START_LIMIT_BURST, **values)


def exec_start(argv: list[str]) -> str:
    """A unit's ExecStart value: quoted for systemd, one flag and its value per continued line."""
    return Lines(" \\\n    ".join(_paired([systemd_quote(a) for a in one_line_each(argv)])))


def one_line_each(values) -> list[str]:
    """The last guard before a file is written: a value with a control character (a newline would start a new
    unit or env line) is refused even if it got past validation."""
    values = list(values)
    for value in values:
        if grammar.no_control(str(value)):
            raise ValueError("refusing to render a value with a control character: "
                             f"{masking.mask(str(value))[:40]!r}...")
    return values


def venv_argv(svc: ServicePlan) -> list[str]:
    """A venv engine's whole command line: the venv's own entry point, then the argv a container gets."""
    return svc.venv.argv0 + engine_argv(svc)


# The device nodes a GPU's process opens, beside its own (/dev/nvidiaN; AMD: its render node): what a venv
# unit's device policy allows, as the container gets them from CDI or --device.
NVIDIA_SHARED_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


def venv_devices(svc: ServicePlan) -> list[str]:
    """The service's GPUs as device nodes, for the venv unit's DeviceAllow (its GPUs only, as the container's
    --device flags give it): none where GPUs are not passed (a CPU board)."""
    if not svc.gpu_passthrough or svc.hardware.vendor == "none":
        return []
    if svc.hardware.vendor == "amd":
        return ["/dev/kfd", *(f"/dev/dri/renderD{AMD_FIRST_RENDER_NODE + i}" for i in svc.gpu_indices)]
    return [*NVIDIA_SHARED_DEVICES, *(f"/dev/nvidia{i}" for i in svc.gpu_indices)]


def venv_gpu_env(svc: ServicePlan) -> dict[str, str]:
    """Which GPUs the venv engine sees, by the host's index (the container sees only its own devices): CUDA
    numbers devices fastest first unless told PCI bus order, which is nvidia-smi's."""
    if not svc.venv or not svc.gpu_passthrough or svc.hardware.vendor == "none":
        return {}
    indices = ",".join(map(str, svc.gpu_indices))
    if svc.hardware.vendor == "amd":
        return {"ROCR_VISIBLE_DEVICES": indices}
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": indices}


def venv_notes(svc: ServicePlan) -> list[str]:
    """What `render` says of a venv engine: where it is built, from what, and what only the host can tell."""
    venv = svc.venv
    source = (f"the wheelhouse {venv.wheelhouse} ({len(venv.wheels)} files, pushed to {venv.staging}; pip checks "
              "each against the lock's hashes on the host)" if venv.wheelhouse
              else f"the index {venv.index_url}" if venv.index_url else "the host's own pip index settings")
    needs = (f"Python {' or '.join(venv.python_needs)} (the wheels' tags)" if venv.python_needs
             else f"Python {venv.python_min} or newer" if venv.python_min else "any Python the lock's wheels take")
    return [f"venv route: {svc.recipe.venv.source}",
            f"runtime venv: {venv.path}, {venv.engine} {venv.version} from the lock {venv.lock_file} "
            f"(sha256 {venv.lock_digest[:DIGEST_SHOWN]}...), installed with pip --require-hashes --no-deps from "
            f"{source}; the previous venv is kept for rollback",
            f"interpreter {venv.python} on the host: needs {needs} with its venv module; read on the host by "
            "preflight (not known before the run)",
            f"flags checked with {svc.engine_name} {svc.recipe.engine_version}'s parser; the lock installs "
            f"{venv.version}"]


DIGEST_SHOWN = 16


def render_unit(svc: ServicePlan) -> str:
    if svc.venv:
        line = exec_start(one_line_each(venv_argv(svc)))
        line = Lines(line.replace(_CREDENTIAL_MARK, f"%d/{CREDENTIAL}"))
        return render_template("engine.service.j2", svc=svc, weights=None, unit=weight_cache, exec_start=line,
                               venv=svc.venv, user=venvs.ENGINE_USER, devices=venv_devices(svc),
                               cache=engine_cache(svc), credential=CREDENTIAL if secrets_in_config(svc) else None)
    weights = weight_cache.unit_name(svc) if weight_cache.spec(svc) else None
    return render_template("engine.service.j2", svc=svc, weights=weights, unit=weight_cache, venv=None,
                           exec_start=exec_start(one_line_each(docker_run_argv(svc))),
                           exec_start_post=registration_steps(svc))


def api_key(svc: ServicePlan) -> str | None:
    return keys.from_env(svc.api_key_env)


def env_values(svc: ServicePlan, mask: bool = False) -> dict[str, str]:
    cache = engine_cache(svc)
    env = {**(cache.env if cache else {}), **pd_values(svc, "engine_env"), **weight_cache.env(svc),
           **venv_gpu_env(svc), **svc.env, **fabric_env(svc), **address_env(svc)}
    key = api_key(svc)
    if key and svc.engine.api_key_env:
        env[svc.engine.api_key_env] = MASK if mask else key
    return masking.masked(env) if mask else env


# An engine with its own model store (Ollama): the store and modelfleet's Modelfile inside its container.
CONTAINER_STORE = "/modelfleet-store"
CONTAINER_MODELFILE = "/run/modelfleet/Modelfile"


def store_dir(svc: ServicePlan) -> str:
    """The engine's own model store, beside the revision it registers (on the NVMe model root): a new revision
    gets a new store, the old one stays with its revision."""
    return f"{svc.model_dir}.{_slug_engine(svc)}-store"


def _slug_engine(svc: ServicePlan) -> str:
    return "".join(c if c.isalnum() else "-" for c in svc.engine_name)


def modelfile_path(svc: ServicePlan) -> str:
    return f"{svc.config_dir}/{svc.pool}.Modelfile"


def render_modelfile(svc: ServicePlan) -> str | None:
    """The Modelfile that registers the fetched checkpoint's GGUF file (FROM the file, never a hub name), with the
    GPU layers the planner sized (the engine's layer_offload parameter; left out: every layer fits)."""
    if not svc.engine.registration:
        return None
    from modelfleet.plan import planner  # the planner reads the catalog; render stays importable without it

    lines = [f"FROM {_model_path(svc)}"]
    layers = planner.gpu_layers(svc.model, svc.hardware, svc.gpus, svc.recipe)
    if svc.engine.layer_offload and layers is not None and layers[0] < layers[1]:
        lines.append(f"PARAMETER {svc.engine.layer_offload.parameter} {layers[0]}")
    one_line_each(lines)
    return "\n".join(lines) + "\n"


def registration_steps(svc: ServicePlan) -> list[str]:
    """ExecStartPost lines of an engine that serves only registered models: wait until it answers, register the
    checkpoint (its registration command in the container), load it; each must succeed or the start fails."""
    reg = svc.engine.registration
    if reg is None:
        return []
    local = svc.base_url
    wait = (f"n=0; until curl -fsS -m 5 -o /dev/null {local}{svc.engine.health_path}; do n=$((n + 1)); "
            "if [ $n -gt 300 ]; then exit 1; fi; sleep 1; done")
    create = [a.format(name=svc.served_name, modelfile=CONTAINER_MODELFILE) for a in reg.command]
    body = json.dumps({k: v.format(name=svc.served_name) if isinstance(v, str) else v
                       for k, v in reg.load_body.items()}, separators=(",", ":"))
    load = ["/usr/bin/curl", "-fsS", "-o", "/dev/null", "-m", str(svc.recipe.ready_timeout_s), "-d", body,
            f"{local}{reg.load_path}"]
    return [exec_start(["/bin/sh", "-c", wait]), exec_start([DOCKER, "exec", svc.container_name, *create]),
            exec_start(load)]


def address_env(svc: ServicePlan) -> dict[str, str]:
    """An engine configured through its environment (Ollama's OLLAMA_HOST): the address and port it listens on,
    its store and what keeps its model served (the keys of Engine.own_env, which validate refuses in any env);
    set last, so neither the recipe nor the inventory's env moves it."""
    engine, reg = svc.engine, svc.engine.registration
    env = {**reg.env, reg.store_env: CONTAINER_STORE} if reg else {}
    return {**env, engine.address_env: f"{_url_host(svc.bind_address)}:{svc.port}"} if engine.address_env else env


def listed_name(svc: ServicePlan) -> str:
    """The served name as the engine's /v1/models lists it: Ollama adds its default tag (`:latest`) to a name
    without one, and lists a tagged name (`tiny:q4`; a tag follows the last `/`) as it is."""
    name = svc.served_name
    if svc.engine.listed_name.startswith("{name}:") and ":" in name.rsplit("/", 1)[-1]:
        return name
    return svc.engine.listed_name.format(name=name)


def render_env(svc: ServicePlan, mask: bool = False) -> str:
    env = env_values(svc, mask)
    one_line_each([*env, *env.values()])
    return _env.get_template("engine.env.j2").render(svc=svc, env=env)


def secrets_in_config(svc: ServicePlan) -> bool:
    """Does the engine read the service's key from a config file (SGLang: it has no environment variable)?"""
    return bool(api_key(svc) and svc.engine.api_key_config_file)


def render_secrets_config(svc: ServicePlan, mask: bool = False) -> str | None:
    if not secrets_in_config(svc):
        return None
    return yaml.safe_dump({"api-key": MASK if mask else api_key(svc)})
