"""The lab's scenario: what inventories/lab.py makes of the lab's hosts (which of them, their engines, images,
revision, pools and fault switches), and two knobs of `lab up`, as one typed JSON file in the lab's state folder.
No file: every field's default, the lab's ordinary serving fleet. Tests and lab scripts write it before a run.

    python lab/scenario.py                                   # the scenario now (JSON)
    python lab/scenario.py gate_hosts=2 only=mflab-1,mflab-2 # write it
    python lab/scenario.py --defaults                        # back to the defaults: no file
    python lab/scenario.py gate_hosts=2 -- pyinfra -y inventories/lab.py deploys/netcheck.py
                                                             # one command under it, the previous file restored

Where the lab lives stays in the environment, set once for all its commands: MODELFLEET_LAB_STATE (its folder,
default .lab next to the checkout) and MODELFLEET_LAB_NET (its addresses, lab/daemons.py). So does the hub's
token, a secret: hosts read it from the control node's MODELFLEET_LAB_HF_TOKEN (hf_token_env).

Loaded by its path from inventories/lab.py, so it imports nothing of the lab package.
"""

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import types
import typing
from pathlib import Path

STATE = Path(os.environ.get("MODELFLEET_LAB_STATE", Path(__file__).resolve().parent.parent / ".lab"))
PATH = STATE / "scenario.json"


@dataclasses.dataclass(frozen=True)
class Scenario:
    # Only these hosts (names): a rehearsal on some hosts of a running lab. Empty: every host.
    only: list[str] = dataclasses.field(default_factory=list)
    # One engine for every serving host (e.g. vllm everywhere, for a rollout); None: each host's own.
    engine: str | None = None
    # The serving image (e.g. the upgrade or a broken tag); None: the recipe's.
    image: str | None = None
    # The checkpoint revision every pool serves (a tag or commit); None: the recipe's.
    revision: str | None = None
    # The hosts' model folder; None: each host's own under the lab state.
    model_root: str | None = None
    # Keys added to every engine container's environment (the engine double's fault switches among them).
    engine_env: dict[str, str] = dataclasses.field(default_factory=dict)
    # Flags added to every engine's command line (e.g. one it refuses).
    extra_args: list[str] = dataclasses.field(default_factory=list)
    # Where every service binds (e.g. 0.0.0.0, to see validate refuse it); None: the host's own address.
    bind_address: str | None = None
    # The control-node variable holding the services' API key; None: no key.
    api_key_env: str | None = None
    # The checkpoint group of every pool (one hub download, the others copy); None: each pool its own, e.g. shards.
    checkpoint_group: str | None = "lab"
    # The first N hosts (2 or 3) form one multi-node data-parallel pool, `gate` (recipe tiny-lab-vllm-dp2 / -dp3),
    # for the netcheck gate and the multi-node units; their Gloo traffic stays on loopback.
    gate_hosts: int = 0
    # The gate's bus bandwidth threshold (GB/s).
    gate_min_busbw: float = 0.01
    # Fault switch: the second gate host gets an interface that does not exist.
    gate_bad_ifname: bool = False
    # A fabric persona (lab/fabric.py: e.g. b300x8-roce-1 or b300x8-roce-1-port-down): the inventory is one two-node
    # pool, `gate`, of the lab's first host of that persona's pool head and its first host of the persona, each on the
    # fabric address its persona's tree holds; no gloo_socket_ifname: the fabric derives it.
    fabric: str | None = None
    # That host (an 8-GPU persona) serves two pools side by side, pair-a and pair-b, one GPU each.
    two_pools: str | None = None
    # Keys added to pair-b's engine environment only.
    pair_b_env: dict[str, str] = dataclasses.field(default_factory=dict)
    # That host serves the tiny mixture-of-experts GGUF (the hub double's revision `moe`) with the real llama-server,
    # its experts kept in host RAM (recipe tiny-lab-llamacpp-moe: --cpu-moe); a checkpoint group of its own, as no
    # other host holds that revision, and the RAM it really has as host_ram_gib (the lab's hosts are containers on
    # this machine: their /proc/meminfo is its own), which preflight holds the plan to.
    moe: str | None = None
    # That host runs the front door (`router`) of every serving host's pool, on router_port; their replicas listen
    # on router_port + 10 (beside the router: loopback; elsewhere: the host's address).
    router: str | None = None
    router_port: int = 8800
    # The router host runs only the front door (`router_only`: no board, no service of its own).
    router_only: bool = False
    # That host serves the tiny Llama checkpoint (the hub double's modelfleet/tiny-llama) with the real vLLM, a CPU
    # build (recipe tiny-llama-vllm-cpu, image lab/build-vllm.sh) instead of its engine double; a checkpoint group
    # of its own. About 3 GB of memory and half a minute (quiet machine) to a few minutes (loaded) to get ready.
    real_vllm: str | None = None
    # These hosts serve it too, each its own replica of the same served name (a front door's replicas).
    real_vllm_replicas: list[str] = dataclasses.field(default_factory=list)
    # The gate pool (gate_hosts=2) serves the tiny Llama with the real vLLM, data parallel across its two hosts
    # (recipe tiny-llama-vllm-cpu-dp2: a head and a --headless rank); about 7.7 GB for the pair.
    real_vllm_pool: bool = False
    # That host serves the tiny Llama with the real vLLM from a venv (runtime venv, recipe tiny-llama-vllm-cpu), built
    # from `venv_lock` with the control node's `venv_wheelhouse` (lab/vllm_venv.py): no container, no index.
    venv_vllm: str | None = None
    venv_lock: str | None = None
    venv_wheelhouse: str | None = None
    # Admission also asks for copy bandwidth (the lab's containers have no GPU: a refusal to see).
    admission_h2d: bool = False
    # Admission also runs DCGM's diagnostic at this level (the persona's recording, where it has one); 0: not.
    dcgm_level: int = 0
    # The driver release bare hosts get (a driver upgrade when it changes); None: the product's default.
    driver_version: str | None = None
    # The hub double answers badly (read at each request, no restart): every file body answered with this status
    # (429, 503, ...) and hub_retry_after as its Retry-After (s; None: no header), cut after hub_cut_after bytes
    # (the connection closed), or the bytes of revision hub_swap under the asked revision's names (a mirror
    # serving another revision); each for a file's first hub_fault_times requests (0: every request).
    hub_status: int | None = None
    hub_retry_after: int | None = None
    hub_cut_after: int | None = None
    hub_swap: str | None = None
    hub_fault_times: int = 0
    # Another hub (e.g. a closed port: the hub-unreachable fault); None: the lab's hub double.
    hf_endpoint: str | None = None
    # Each host's first loop device (lab up --disks) stands in for its NVMe drive.
    nvme: bool = False
    # Checkpoint revisions kept beside the served one.
    keep_revisions: int = 1
    # The checkpoint fan-out's tree width.
    fanout_width: int = 8
    # The checkpoint fan-out: `swarm` (pieces from every peer) or `tree` (whole copies in waves).
    fanout: str = "swarm"
    # The fan-out's per-server send cap (MB/s); None: uncapped.
    fanout_rate_mb_s: int | None = None
    # A download or copy's no-progress deadline (model_stall_s); None: the product's default.
    stall_s: int | None = None
    # Hash every checkpoint file again (model_reverify).
    reverify: bool = False
    # `lab up`: the pre-built NVIDIA hosts (names, or `all`) that get a Docker with CDI of their own (lab/cdi.py).
    cdi: list[str] = dataclasses.field(default_factory=list)
    # `lab up`: the shard size of the hub double's sharded checkpoint (MiB; 4 shards).
    hub_shard_mib: int = 2


_TYPES = typing.get_type_hints(Scenario)


def _fits(value: object, kind: object) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind in (str, bool):
        return isinstance(value, kind)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is types.UnionType:
        return any(value is None if a is type(None) else _fits(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items())
    raise TypeError(f"no check for {kind}")


def _name(kind: object) -> str:
    return kind.__name__ if typing.get_origin(kind) is None else str(kind)


def make(source: str = "scenario", **fields) -> Scenario:
    """A Scenario from `fields`, refusing a field it does not have or a value of the wrong type, by name."""
    unknown = sorted(set(fields) - set(_TYPES))
    if unknown:
        raise ValueError(f"{source}: no scenario field {', '.join(unknown)} (fields: {', '.join(_TYPES)})")
    for key, value in fields.items():
        if not _fits(value, _TYPES[key]):
            raise ValueError(f"{source}: {key} must be {_name(_TYPES[key])}, not {json.dumps(value)}")
    return Scenario(**fields)


def load(path: Path | str | None = None) -> Scenario:
    """The scenario in `path` (default: the lab's); an absent file is every default."""
    path = Path(path or PATH)
    if not path.exists():
        return Scenario()
    fields = json.loads(path.read_text())
    if not isinstance(fields, dict):
        raise ValueError(f"{path}: a scenario is a JSON object of fields")
    return make(str(path), **fields)


def write(path: Path | str | None = None, **fields) -> Scenario:
    """Write the scenario of `fields` (the others: defaults) to `path` (default: the lab's)."""
    scenario = make(**fields)
    path = Path(path or PATH)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fields, indent=2, sort_keys=True) + "\n")
    return scenario


def clear(path: Path | str | None = None) -> None:
    """Back to the defaults: no file."""
    Path(path or PATH).unlink(missing_ok=True)


@contextlib.contextmanager
def applied(path: Path | str | None = None, **fields):
    """The scenario of `fields` for the block; the file as it was before, after it."""
    path = Path(path or PATH)
    before = path.read_bytes() if path.exists() else None
    try:
        yield write(path, **fields)
    finally:
        if before is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(before)


def parse(pair: str) -> tuple[str, object]:
    """FIELD=VALUE as the command line gives it: lists comma-separated, dicts JSON, an empty value None."""
    key, sep, text = pair.partition("=")
    if not sep or key not in _TYPES:
        raise ValueError(f"{pair}: not FIELD=VALUE of a scenario field (fields: {', '.join(_TYPES)})")
    kind = _TYPES[key]
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    base = args[0] if typing.get_origin(kind) is types.UnionType else kind
    if text == "" and typing.get_origin(kind) is types.UnionType:
        return key, None
    if base is bool:
        return key, text.lower() in ("1", "true", "yes")
    if base in (int, float):
        try:
            return key, base(text)
        except ValueError:
            raise ValueError(f"{key} must be {_name(base)}, not {text!r}") from None
    if typing.get_origin(base) is list:
        return key, [v for v in text.split(",") if v]
    if typing.get_origin(base) is dict:
        return key, json.loads(text)
    return key, text


def main(argv: list[str]) -> int:
    pairs, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    try:
        if pairs == ["--defaults"] and not command:
            clear()
        fields = dict(parse(p) for p in pairs if p != "--defaults")
        if command:
            with applied(**fields):
                return subprocess.run(command).returncode
        if fields:
            write(**fields)
        print(json.dumps(dataclasses.asdict(load()), indent=2))
    except ValueError as error:
        print(f"lab/scenario.py: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
