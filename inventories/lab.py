"""The local lab fleet made by `modelfleet lab up` (reads .lab/hosts.json).

Each lab host serves the tiny lab model with one engine (vllm, sglang, llama.cpp in turn) from the lab
registry's engine double, bound to the host's own loopback address so ports never collide.
"""

import json
import os
from pathlib import Path

_state = Path(os.environ.get("MODELFLEET_LAB_STATE", Path(__file__).resolve().parent.parent / ".lab"))
if not (_state / "hosts.json").exists():
    raise SystemExit(f"no lab found ({_state / 'hosts.json'} missing): run `modelfleet lab up` first")
_lab = json.loads((_state / "hosts.json").read_text())
# Fault switches for tests: engine double environment and extra engine flags.
_engine_env = json.loads(os.environ.get("MODELFLEET_LAB_ENGINE_ENV", "{}"))
_extra_args = json.loads(os.environ.get("MODELFLEET_LAB_EXTRA_ARGS", "[]"))
_bind_address = os.environ.get("MODELFLEET_LAB_BIND_ADDRESS")  # e.g. 0.0.0.0, to see validate refuse it
# The hub double is gated by the token `lab up` made; pyinfra's process reads it like a user's HF_TOKEN.
if _lab.get("hub"):
    os.environ.setdefault("MODELFLEET_LAB_HF_TOKEN", Path(_lab["hub"]["token_file"]).read_text().strip())
# MODELFLEET_LAB_GATE_HOSTS=2 (or 3): the first hosts form one multi-node data-parallel pool (recipe
# tiny-lab-vllm-dp2 / -dp3) for the netcheck gate and the multi-node units, whose Gloo traffic stays on loopback; MODELFLEET_LAB_GATE_MIN_BUSBW sets its threshold.
_gate_hosts = int(os.environ.get("MODELFLEET_LAB_GATE_HOSTS", "0"))
_gate_min = float(os.environ.get("MODELFLEET_LAB_GATE_MIN_BUSBW", "0.01"))
# Fault switch: MODELFLEET_LAB_GATE_BAD_IFNAME=1 gives the second gate host an interface that does not exist.
_gate_faults = {1: {"gloo_socket_ifname": "mfl-noif0"}} if os.environ.get("MODELFLEET_LAB_GATE_BAD_IFNAME") else {}
# MODELFLEET_LAB_FABRIC=PERSONA (a fabric persona, lab/fabric.py: e.g. b300x8-roce-1 or b300x8-roce-1-port-down):
# the inventory is one two-node pool, `gate`, of the lab's first host of that persona's pool head and its first host
# of PERSONA, each on the fabric address its persona's tree holds; no gloo_socket_ifname: the fabric derives it.
_fabric = os.environ.get("MODELFLEET_LAB_FABRIC")
if _fabric:
    _by_persona = {}
    for _spec in _lab["hosts"]:
        _by_persona.setdefault(_spec["persona"], _spec)
    _head = (_by_persona.get(_fabric) or {}).get("fabric", {}).get("head")
    if not _head or _head == _fabric or _head not in _by_persona:
        raise SystemExit(f"MODELFLEET_LAB_FABRIC={_fabric}: the lab needs a host of that fabric persona and one of "
                         f"its pool head's ({_head or 'none: not a fabric persona, or no such host'})")
    _lab["hosts"], _gate_hosts = [_by_persona[_head], _by_persona[_fabric]], 2
# MODELFLEET_LAB_ONLY=mflab-4,mflab-5: only these hosts (a rehearsal on some hosts of a running lab).
_only = {n for n in os.environ.get("MODELFLEET_LAB_ONLY", "").split(",") if n}
# All lab hosts serve the same checkpoint: one hub download, the others copy from the first host.
# MODELFLEET_LAB_CHECKPOINT_GROUP= (empty): each pool its own group (the default), e.g. for shards.
_checkpoint_group = os.environ.get("MODELFLEET_LAB_CHECKPOINT_GROUP", "lab") or None
# MODELFLEET_LAB_TWO_POOLS=mflab-4: that host (an 8-GPU persona) serves two pools side by side, pair-a and
# pair-b, one GPU each; MODELFLEET_LAB_PAIR_B_ENV (JSON) changes only pair-b's unit.
_two_pools = os.environ.get("MODELFLEET_LAB_TWO_POOLS")
_pair_b_env = json.loads(os.environ.get("MODELFLEET_LAB_PAIR_B_ENV", "{}"))
# MODELFLEET_LAB_MOE=mflab-3: that host serves the tiny mixture-of-experts GGUF (the hub double's revision `moe`)
# with the real llama-server, its experts kept in host RAM (recipe tiny-lab-llamacpp-moe: --cpu-moe); a checkpoint
# group of its own, as no other host holds that revision, and the RAM it really has as host_ram_gib (the lab's
# hosts are containers on this machine: their /proc/meminfo is its own), which preflight holds the plan to.
_moe = os.environ.get("MODELFLEET_LAB_MOE")


def _machine_ram_gib() -> int:
    with open("/proc/meminfo") as meminfo:
        kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    return max(1, kib // 2**20)



def _pool(index: int, spec: dict) -> dict:
    if index < _gate_hosts:
        return {"pool": "gate", "recipe": f"tiny-lab-vllm-dp{_gate_hosts}", "engine": "vllm", "port": 8100, "netcheck_min_busbw_gbps": _gate_min,
                "netcheck_timeout_s": 15, **_gate_faults.get(index, {})}
    if spec["name"] == _moe:
        return {"pool": f"tiny-{spec['name']}", "engine": "llama.cpp", "recipe": "tiny-lab-llamacpp-moe",
                "revision": "moe", "checkpoint_group": None}
    engine = os.environ.get("MODELFLEET_LAB_ENGINE") or spec["engine"]  # e.g. vllm everywhere, for a rollout
    return {"pool": f"tiny-{spec['name']}", "engine": engine, "recipe": f"tiny-lab-{engine.replace('.', '')}",
            **({"image": os.environ["MODELFLEET_LAB_IMAGE"]} if os.environ.get("MODELFLEET_LAB_IMAGE") else {})}


def _serves(index: int, spec: dict) -> dict:
    """What the host serves: one pool (service keys at the top), or the two pools of MODELFLEET_LAB_TWO_POOLS."""
    service = {"model": "tiny-lab", "checkpoint_group": _checkpoint_group,
               "revision": os.environ.get("MODELFLEET_LAB_REVISION") or None, **_pool(index, spec),
               "bind_address": _bind_address or spec["address"],
               "api_key_env": os.environ.get("MODELFLEET_LAB_API_KEY_ENV") or None,
               "env": _engine_env, "extra_args": _extra_args}
    if spec["name"] != _two_pools:
        return service
    pair = {**service, "engine": "vllm", "recipe": "tiny-lab-vllm", "gpus": 1}
    return {"services": [{**pair, "pool": "pair-a", "port": 8000},
                         {**pair, "pool": "pair-b", "port": 8001, "env": {**_engine_env, **_pair_b_env}}]}


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
        # A host made with MODELFLEET_LAB_CDI has a Docker with CDI and its GPUs' device nodes (lab/cdi.py): its
        # containers get their GPUs as the units ask for them; the others' Docker (20.10) has no CDI.
        "gpu_passthrough": bool(spec.get("cdi")),
        # Admission judges the persona's recorded `nvidia-smi -q -x` (and kernel log) where it has one.
        "admission": spec.get("admission", False),
        # MODELFLEET_LAB_ADMISSION_H2D=1: the gate also asks for copy bandwidth (the lab's containers have no GPU)
        "admission_h2d": bool(os.environ.get("MODELFLEET_LAB_ADMISSION_H2D")),
        # MODELFLEET_LAB_DCGM_LEVEL=N: admission also runs DCGM's diagnostic (the persona's recording, where it has one)
        "admission_dcgm_level": int(os.environ.get("MODELFLEET_LAB_DCGM_LEVEL", "0")),
        # Hosts made bare (`lab up --persona h200x1-bare`) get their driver, Fabric Manager, Docker and toolkit
        # from the lab's apt repositories (the real URLs' paths on 127.0.0.1:5080); the others come pre-built.
        "gpu_stack": spec.get("bare", False),
        # MODELFLEET_LAB_DRIVER_VERSION: the driver release bare hosts get (a driver upgrade when it changes).
        **({"driver_version": os.environ["MODELFLEET_LAB_DRIVER_VERSION"]}
           if spec.get("bare") and os.environ.get("MODELFLEET_LAB_DRIVER_VERSION") else {}),
        **(_lab["apt"]["stack_urls"] if spec.get("bare") else {}),
        "hf_token_env": "MODELFLEET_LAB_HF_TOKEN",
        # MODELFLEET_LAB_HF_ENDPOINT: another hub (e.g. a closed port: the hub-unreachable fault)
        "hf_endpoint": os.environ.get("MODELFLEET_LAB_HF_ENDPOINT") or (_lab["hub"]["endpoint"] if _lab.get("hub") else None),
        "model_root": os.environ.get("MODELFLEET_LAB_MODEL_ROOT") or spec["model_root"],
        # MODELFLEET_LAB_NVME=1: the host's first loop device (lab up --disks) stands in for its NVMe drive.
        "nvme_devices": spec.get("disks", [])[:1] if os.environ.get("MODELFLEET_LAB_NVME") else [],
        "model_keep_revisions": int(os.environ.get("MODELFLEET_LAB_KEEP_REVISIONS", "1")),
        # The checkpoint fan-out's tree width and per-server send cap (`make bench-fanout` sets them).
        "model_fanout_width": int(os.environ.get("MODELFLEET_LAB_FANOUT_WIDTH", "8")),
        **({"model_fanout_rate_mb_s": int(os.environ["MODELFLEET_LAB_FANOUT_RATE_MB_S"])}
           if os.environ.get("MODELFLEET_LAB_FANOUT_RATE_MB_S") else {}),
        **({"fabric_address": spec["fabric"]["address"]} if _fabric else {"gloo_socket_ifname": "lo"}),
        **({"host_ram_gib": _machine_ram_gib()} if spec["name"] == _moe else {}),
        **_serves(index, spec),
    })
    for index, spec in enumerate(_lab["hosts"])
    if not _only or spec["name"] in _only
]

# Every host, group_data file and recipe is validated here, before pyinfra connects to any host (exit 2).
from modelfleet.inventory import refuse_invalid as _refuse_invalid  # noqa: E402

_refuse_invalid(__file__)
