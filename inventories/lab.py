"""The local lab fleet made by `modelfleet lab up` (reads .lab/hosts.json), as its scenario (.lab/scenario.json) has it.

Each lab host serves the tiny lab model with one engine (vllm, sglang, llama.cpp in turn) from the lab
registry's engine double, bound to the host's own loopback address so ports never collide.
"""

import importlib.util
import json
import os
from pathlib import Path

_checkout = Path(__file__).resolve().parent.parent
_state = Path(os.environ.get("MODELFLEET_LAB_STATE", _checkout / ".lab"))
if not (_state / "hosts.json").exists():
    raise SystemExit(f"no lab found ({_state / 'hosts.json'} missing): run `modelfleet lab up` first")
_lab = json.loads((_state / "hosts.json").read_text())
# The scenario (lab/scenario.py: which hosts, engines, images, fault switches; no file: the ordinary fleet), read
# with the lab's own code, which hosts.json names: this file may be a copy outside the checkout.
_spec = importlib.util.spec_from_file_location(
    "modelfleet_lab_scenario", _lab.get("scenario_module") or _checkout / "lab" / "scenario.py")
_scenario_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_scenario_module)
_scenario = _scenario_module.load(_state / "scenario.json")
# The hub double is gated by the token `lab up` made; pyinfra's process reads it like a user's HF_TOKEN.
if _lab.get("hub"):
    os.environ.setdefault("MODELFLEET_LAB_HF_TOKEN", Path(_lab["hub"]["token_file"]).read_text().strip())
_gate_hosts = _scenario.gate_hosts
_gate_faults = {1: {"gloo_socket_ifname": "mfl-noif0"}} if _scenario.gate_bad_ifname else {}
_fabric = _scenario.fabric
if _fabric:
    _by_persona = {}
    for _host in _lab["hosts"]:
        _by_persona.setdefault(_host["persona"], _host)
    _head = (_by_persona.get(_fabric) or {}).get("fabric", {}).get("head")
    if not _head or _head == _fabric or _head not in _by_persona:
        raise SystemExit(f"scenario fabric={_fabric}: the lab needs a host of that fabric persona and one of "
                         f"its pool head's ({_head or 'none: not a fabric persona, or no such host'})")
    _lab["hosts"], _gate_hosts = [_by_persona[_head], _by_persona[_fabric]], 2


def _machine_ram_gib() -> int:
    with open("/proc/meminfo") as meminfo:
        kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    return max(1, kib // 2**20)



def _pool(index: int, spec: dict) -> dict:
    if index < _gate_hosts and _scenario.real_vllm_pool:
        return {"pool": "gate", "recipe": f"tiny-llama-vllm-cpu-dp{_gate_hosts}", "engine": "vllm", "port": 8100,
                "model": "tiny-llama", "checkpoint_group": None, "netcheck_min_busbw_gbps": _scenario.gate_min_busbw,
                "netcheck_timeout_s": 60}
    if index < _gate_hosts:
        return {"pool": "gate", "recipe": f"tiny-lab-vllm-dp{_gate_hosts}", "engine": "vllm", "port": 8100,
                "netcheck_min_busbw_gbps": _scenario.gate_min_busbw, "netcheck_timeout_s": 15,
                **_gate_faults.get(index, {})}
    if spec["name"] == _scenario.moe:
        return {"pool": f"tiny-{spec['name']}", "engine": "llama.cpp", "recipe": "tiny-lab-llamacpp-moe",
                "revision": "moe", "checkpoint_group": None}
    if spec["name"] == _scenario.venv_vllm:  # the real vLLM from a venv the control node's wheelhouse fills
        return {"pool": f"tiny-{spec['name']}", "engine": "vllm", "recipe": "tiny-llama-vllm-cpu",
                "model": "tiny-llama", "checkpoint_group": "tiny-llama", "runtime": "venv",
                "venv_lock": _scenario.venv_lock, "venv_wheelhouse": _scenario.venv_wheelhouse}
    if spec["name"] == _scenario.real_vllm or spec["name"] in _scenario.real_vllm_replicas:
        # the real vLLM's hosts share their checkpoint (a host joining copies it from a peer); no other host has it
        return {"pool": f"tiny-{spec['name']}", "engine": "vllm", "recipe": "tiny-llama-vllm-cpu",
                "model": "tiny-llama", "checkpoint_group": "tiny-llama"}
    engine = _scenario.engine or spec["engine"]
    return {"pool": f"tiny-{spec['name']}", "engine": engine, "recipe": f"tiny-lab-{engine.replace('.', '')}",
            **({"image": _scenario.image} if _scenario.image else {})}


def _for_vendor(settings: dict, hardware: str) -> dict:
    """The settings a host's board can use (an NVIDIA repository on an AMD host is refused; on the router-only
    `cpu` board, nothing of GPUs or checkpoints)."""
    from modelfleet.plan.catalog import load_catalog
    from modelfleet.plan.inventory import HostData
    from modelfleet.plan.inventory.applies import DOOR_SCOPES, host_scopes, scope_of

    held = host_scopes(load_catalog().hardware[hardware].vendor) | ({"model"} if hardware != "cpu" else set()) | \
        DOOR_SCOPES  # a front door's settings are the host's whatever its board
    return {k: v for k, v in settings.items()
            if k not in HostData.model_fields or scope_of(HostData, k) in (None, *held)}


def _serves(index: int, spec: dict) -> dict:
    """What the host serves: one pool (service keys at the top), or the two pools of the scenario's two_pools."""
    service = {"model": "tiny-lab", "checkpoint_group": _scenario.checkpoint_group,
               "revision": _scenario.revision, **_pool(index, spec),
               "bind_address": _scenario.bind_address or spec["address"],
               "api_key_env": _scenario.api_key_env,
               "env": _scenario.engine_env, "extra_args": _scenario.extra_args}
    if _scenario.router:  # behind the front door: the router decides where the replica listens
        del service["bind_address"]
        service.update(router=_scenario.router, router_port=_scenario.router_port, port=_scenario.router_port + 10)
    if spec["name"] != _scenario.two_pools:
        return service
    pair = {**service, "engine": "vllm", "recipe": "tiny-lab-vllm", "gpus": 1}
    return {"services": [{**pair, "pool": "pair-a", "port": 8000},
                         {**pair, "pool": "pair-b", "port": 8001,
                          "env": {**_scenario.engine_env, **_scenario.pair_b_env}}]}


lab_hosts = [
    (spec["name"], {
        "ssh_hostname": spec["address"],
        "ssh_user": "root",
        "ssh_key": _lab["key"],
        "ssh_known_hosts_file": _lab["known_hosts"],
        "hardware": spec["hardware"],
        "gpu_count": spec["gpu_count"],
        # Same path on the lab host and the machine: the machine's dockerd resolves the unit's mounts.
        "config_dir": spec["config_dir"],
        "image_registry": _lab["registry"],
        # A host made with the scenario's cdi has a Docker with CDI and its GPUs' device nodes (lab/cdi.py): its
        # containers get their GPUs as the units ask for them; the others' Docker (20.10) has no CDI.
        "gpu_passthrough": bool(spec.get("cdi")),
        # Admission judges the persona's recorded `nvidia-smi -q -x` (and kernel log) where it has one.
        "admission": spec.get("admission", False),
        "admission_h2d": _scenario.admission_h2d,
        "admission_dcgm_level": _scenario.dcgm_level,
        # Hosts made bare (`lab up --persona h200x1-bare`) get their driver, Fabric Manager, Docker and toolkit
        # from the lab's apt repositories (the real URLs' paths on 127.0.0.1:5080); the others come pre-built.
        "gpu_stack": spec.get("bare", False),
        **({"driver_version": _scenario.driver_version} if spec.get("bare") and _scenario.driver_version else {}),
        **(_for_vendor(_lab["apt"]["stack_urls"], spec["hardware"]) if spec.get("bare") else {}),
        "hf_token_env": "MODELFLEET_LAB_HF_TOKEN",
        "hf_endpoint": _scenario.hf_endpoint or (_lab["hub"]["endpoint"] if _lab.get("hub") else None),
        "model_root": _scenario.model_root or spec["model_root"],
        "nvme_devices": spec.get("disks", [])[:1] if _scenario.nvme else [],
        "model_keep_revisions": _scenario.keep_revisions,
        "model_fanout_width": _scenario.fanout_width,
        "model_fanout": _scenario.fanout,
        **({"model_fanout_rate_mb_s": _scenario.fanout_rate_mb_s} if _scenario.fanout_rate_mb_s else {}),
        **({"model_stall_s": _scenario.stall_s} if _scenario.stall_s else {}),
        **({"model_reverify": True} if _scenario.reverify else {}),
        **({"fabric_address": spec["fabric"]["address"]} if _fabric else {"gloo_socket_ifname": "lo"}),
        **({"host_ram_gib": _machine_ram_gib()} if spec["name"] == _scenario.moe else {}),
        **_serves(index, spec),
    })
    for index, spec in enumerate(_lab["hosts"])
    if not _scenario.only or spec["name"] in _scenario.only
]


def _vllm_doors(data: dict) -> set:
    """The hosts this host's vLLM services name in `router` (a front door whose router checks no key)."""
    return {s.get("router", data.get("router")) for s in data.get("services") or [data]
            if s.get("engine", data.get("engine")) == "vllm"} - {None}


# Lab hosts share the machine's network namespace and have no NET_ADMIN: no nftables rule of their own
# (tests/router/test_worker_api_owner_e2e.py shows the router's rule in a namespace of its own). Set on the
# hosts of a vLLM front door alone: it applies nowhere else (refused there).
_open_doors = set().union(*(_vllm_doors(data) for _, data in lab_hosts))
lab_hosts = [(name, {**data, "router_worker_firewall": False} if name in _open_doors else data)
             for name, data in lab_hosts]

if _scenario.router_only and _scenario.router:  # the router host runs only the front door: no board, no service
    from modelfleet.plan.inventory.schema import SERVICE_KEYS as _SERVICE_KEYS  # noqa: E402

    # ...nor any setting that applies only to hosts with GPUs or serving a model (refused there).
    lab_hosts = [(name, {**_for_vendor({k: v for k, v in data.items() if k not in ("hardware", "gpu_count",
                                                                                   "services", *_SERVICE_KEYS)},
                                       "cpu"), "router_only": True})
                 if name == _scenario.router else (name, data) for name, data in lab_hosts]

# Every host, group_data file and recipe is validated here, before pyinfra connects to any host (exit 2).
from modelfleet.plan.inventory import refuse_invalid as _refuse_invalid  # noqa: E402

_refuse_invalid(__file__)
