"""Sizing arithmetic (pure): does a model fit the GPUs (and, for llama.cpp recipes that keep MoE experts in host
RAM, the host's RAM), how much KV-cache room is left, how much disk."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from modelfleet.plan.catalog import BYTES_PER_PARAM, Hardware, Model, Recipe, load_catalog

MIB = 2**20
GIB = 2**30
# huggingface_hub writes each file to .incomplete before moving it; keep 5 % of the checkpoint spare.
TEMP_FRACTION = 0.05
# Below this per-GPU KV-cache room an engine starts but cannot hold a useful context.
MIN_KV_BYTES_PER_GPU = 1 * 2**30
# What llama-server's --fit leaves free on each device by default (--fit-target, MiB).
FIT_TARGET_MIB = 1024
# A GGUF's weights outside the routed experts (attention, shared expert, embeddings), sized at Q8_0 (34 bytes per
# 32 weights): dynamic quantizations keep these in more bits than the experts, and the catalog does not record
# each tensor's type, so the GPU part is sized as if all of it were 8-bit.
DENSE_GGUF_BYTES_PER_PARAM = 34 / 32


@dataclass
class CapacityReport:
    model: str
    hardware: str
    gpus_per_node: int
    nodes: int
    raw_bytes: dict[str, float]
    checkpoint_bytes: float
    checkpoint_estimated: bool
    weights_per_gpu_bytes: float
    hbm_per_gpu_bytes: float
    memory_fraction: float
    usable_per_gpu_bytes: float
    kv_room_per_gpu_bytes: float
    disk_needed_bytes: float
    fits: bool
    reason: str
    # Experts in host RAM (llama.cpp offload recipes); None: everything is on the GPUs.
    offload: dict | None = None
    # The restart tier's weight cache (weight_cache_share); None: the service has none.
    weight_cache: dict | None = None

    def to_json(self) -> dict:
        return asdict(self)


def checkpoint_size(model: Model, recipe: Recipe | None = None) -> tuple[float, bool]:
    """Real bytes when the catalog knows them (or the GGUF quant), else an estimate from the weight format."""
    if recipe is not None and recipe.gguf_quant and model.gguf:
        return float(model.gguf["quants"][recipe.gguf_quant]), False
    if model.checkpoint_bytes:
        return float(model.checkpoint_bytes), False
    return model.params_total * BYTES_PER_PARAM[model.weights], True


def expert_offload(recipe: Recipe | None) -> tuple[str, int] | None:
    """How a recipe keeps MoE experts in host RAM, from its engine's offload flags (the catalog's
    `expert_offload`): ("all", 0) for every layer's, ("layers", N) for the first N layers', ("fit", 0) for what
    the GPUs cannot hold; None when every weight stays on the GPUs."""
    flags = load_catalog().engines[recipe.engine].expert_offload if recipe is not None else None
    if flags is None:
        return None
    args = list(recipe.args)

    def value(*names: str) -> str | None:
        for i, arg in enumerate(args):
            name, eq, inline = arg.partition("=")
            if name in names:
                return inline if eq else (args[i + 1] if i + 1 < len(args) else "")
        return None

    if any(a in flags.all for a in args):
        return ("all", 0)
    layers = value(*flags.layers)
    if layers is not None:
        return ("layers", int(layers))
    if flags.fit and value(*flags.fit) == "on":
        return ("fit", 0)
    return None


def routed_expert_params(model: Model) -> float:
    """Parameters in the routed experts: total = dense + routed and active = dense + routed x selected / routed
    (every token runs the dense part and its selected experts)."""
    experts = model.experts or {}
    routed, selected = experts.get("routed"), experts.get("selected_per_token")
    if not routed or not selected:
        return 0.0
    return (model.params_total - model.params_active) / (1 - selected / routed)


def _tb(n: float) -> str:
    return f"{n / 1e12:.2f} TB" if n >= 1e12 else f"{n / 1e9:.1f} GB"


def _split(model: Model, hardware: Hardware, total_gpus: int, usable: float, ckpt: float, overhead: float,
           mode: tuple[str, int], host_ram_gib: int | None) -> tuple[dict, str | None]:
    """The offload split: dense weights (and experts --fit keeps) on the GPUs, the rest of the experts in host
    RAM, each part with the guides' runtime margin. Returns (split, refusal or None)."""
    dense = min(ckpt, (model.params_total - routed_expert_params(model)) * DENSE_GGUF_BYTES_PER_PARAM)
    experts = ckpt - dense
    kind, layers = mode
    if kind == "all":
        in_ram = experts
    elif kind == "layers":
        if not model.layers:
            return {}, f"{model.id}: the model catalog gives no layer count, so --n-cpu-moe {layers} cannot be sized"
        in_ram = experts * min(layers, model.layers) / model.layers
    else:  # fit: the GPUs keep as many experts as leave them the minimum KV room, the rest go to RAM
        free = MIN_KV_BYTES_PER_GPU + FIT_TARGET_MIB * MIB
        gpu_room = max(0.0, total_gpus * (usable - free) / (1 + overhead) - dense)
        in_ram = max(0.0, experts - gpu_room)
    gpu_weights = (ckpt - in_ram) * (1 + overhead)
    ram_need = in_ram * (1 + overhead)
    ram = host_ram_gib * GIB if host_ram_gib else None
    label = {"all": "all (--cpu-moe)", "fit": "what the GPUs cannot hold (--fit on)"}.get(
        kind, f"those of the first {layers} layers (--n-cpu-moe)")
    split = {"mode": label, "dense_bytes": dense,
             "experts_bytes": experts, "experts_on_gpus_bytes": experts - in_ram, "experts_in_ram_bytes": in_ram,
             "margin": overhead, "gpu_need_bytes": gpu_weights, "ram_need_bytes": ram_need,
             "host_ram_bytes": ram, "host_ram_gib": host_ram_gib}
    if in_ram and ram is None:
        return split, (f"{model.id} keeps {_tb(ram_need)} of experts in host RAM: set the host's `host_ram_gib` "
                       f"(the hardware catalog gives no typical figure for {hardware.id})")
    if in_ram and ram_need > ram:
        return split, (f"{model.id} needs {_tb(ram_need)} of host RAM for its experts ({_tb(in_ram)} + "
                       f"{overhead:.0%}), the host has {host_ram_gib} GiB ({_tb(ram)}); GPUs and RAM together "
                       f"offer {_tb(total_gpus * usable + ram)} for {_tb(ckpt * (1 + overhead))}")
    return split, None


def weight_cache_share(per_gpu: float) -> dict:
    """What a weight cache unit holds on each GPU. The daemon keeps its rank's shard in GPU memory and the engine
    maps it (vLLM's `zero_copy`, SGLang's client mode): one copy, counted once in the engine's weights, and it
    stays resident while the engine restarts (the engine's KV room comes back on top of it, the weights do not
    have to)."""
    return {"mode": "zero_copy", "held_on": "gpu", "per_gpu_bytes": per_gpu, "counted_once": True,
            "resident_while_engine_restarts_bytes": per_gpu}


def plan_capacity(model: Model, hardware: Hardware, gpus: int, nodes: int = 1, recipe: Recipe | None = None,
                  keep_revisions: int = 1, host_ram_gib: int | None = None,
                  weight_cache: bool = False) -> CapacityReport:
    """`host_ram_gib`: the RAM a llama.cpp offload recipe may fill (None: the hardware catalog's figure);
    `weight_cache`: the service keeps its weights in a weight cache unit (the restart tier)."""
    total_gpus = gpus * nodes
    fraction = recipe.memory_fraction if recipe else 0.9
    ckpt, estimated = checkpoint_size(model, recipe)
    gguf = bool(recipe and recipe.gguf_quant and model.gguf)
    overhead = model.gguf["memory_overhead"] if gguf else 0.0
    need = ckpt * (1 + overhead)
    hbm = hardware.hbm_mib * MIB
    usable = hbm * fraction
    mode = expert_offload(recipe)
    split, refusal = (None, None)
    if mode and hardware.vendor != "none":
        split, refusal = _split(model, hardware, total_gpus, usable, ckpt, overhead, mode,
                                host_ram_gib if host_ram_gib is not None else hardware.host_ram_gib)
        need = split.get("gpu_need_bytes", need)
    per_gpu = need / total_gpus if total_gpus else need
    kv_room = usable - per_gpu
    disk = ckpt * (1 + keep_revisions) + ckpt * TEMP_FRACTION
    if recipe is not None and load_catalog().engines[recipe.engine].registration:
        # Its own store holds a copy of the file it registers (Ollama's blob), one store beside each revision on
        # disk: the served one and each kept for rollback (render.store_dir; pruned with its revision).
        disk += ckpt * (1 + keep_revisions)
    raw = {"bf16": model.params_total * 2, "8bit": model.params_total * 1, "4bit": model.params_total * 0.5}
    reason = ""
    fits = True
    on_gpus = "of weights on the GPUs" if split else "of weights"
    if gpus > hardware.gpus_per_node and hardware.vendor != "none":
        fits, reason = False, f"{hardware.id} hosts carry {hardware.gpus_per_node} GPUs, not {gpus}"
    elif refusal:
        fits, reason = False, refusal
    elif kv_room < MIN_KV_BYTES_PER_GPU and _by_layer(model, hardware, gpus, recipe, need, host_ram_gib):
        fits, reason = _by_layer(model, hardware, gpus, recipe, need, host_ram_gib)
    elif total_gpus == 0 or kv_room < MIN_KV_BYTES_PER_GPU:
        fits = False
        reason = (f"{model.id} needs {_tb(need)} {on_gpus} ({_tb(per_gpu)} per GPU over {total_gpus} GPU(s)); "
                  f"{total_gpus}x {hardware.id} offers {_tb(usable)} usable per GPU "
                  f"({hardware.hbm_mib} MiB x {fraction:.2f}), leaving {_tb(max(kv_room, 0))} for KV cache "
                  f"(minimum {_tb(MIN_KV_BYTES_PER_GPU)})")
    elif split:
        reason = (f"fits: {_tb(per_gpu)} weights per GPU, {_tb(kv_room)} left for KV cache per GPU; "
                  f"{_tb(split['ram_need_bytes'])} of experts in host RAM of {split['host_ram_gib']} GiB")
    else:
        reason = (f"fits: {_tb(per_gpu)} weights per GPU, {_tb(kv_room)} left for KV cache per GPU")
    if weight_cache and fits:
        reason += f"; the weight cache holds those {_tb(per_gpu)} per GPU, also while the engine restarts"
    return CapacityReport(
        model=model.id, hardware=hardware.id, gpus_per_node=gpus, nodes=nodes, raw_bytes=raw,
        checkpoint_bytes=ckpt, checkpoint_estimated=estimated, weights_per_gpu_bytes=per_gpu,
        hbm_per_gpu_bytes=hbm, memory_fraction=fraction, usable_per_gpu_bytes=usable,
        kv_room_per_gpu_bytes=kv_room, disk_needed_bytes=disk, fits=fits, reason=reason, offload=split,
        weight_cache=weight_cache_share(per_gpu) if weight_cache else None,
    )


def gpu_layers(model: Model, hardware: Hardware, gpus: int, recipe: Recipe | None) -> tuple[int, int] | None:
    """An engine that places whole layers (catalog `layer_offload`: Ollama's num_gpu): (layers on the GPUs,
    layers) for the recipe's GGUF, sized as the GPU part of plan_capacity is, a layer being an equal share of the
    file with the guide's runtime margin; None where the engine places experts instead or the count is unknown."""
    engine = load_catalog().engines[recipe.engine] if recipe is not None else None
    if engine is None or engine.layer_offload is None or not model.layers or hardware.vendor == "none":
        return None
    ckpt, _ = checkpoint_size(model, recipe)
    overhead = model.gguf["memory_overhead"] if recipe.gguf_quant and model.gguf else 0.0
    room = gpus * (hardware.hbm_mib * MIB * recipe.memory_fraction - MIN_KV_BYTES_PER_GPU)
    per_layer = ckpt * (1 + overhead) / model.layers
    return max(0, min(model.layers, int(room // per_layer))), model.layers


def _by_layer(model: Model, hardware: Hardware, gpus: int, recipe: Recipe | None, need: float,
              host_ram_gib: int | None) -> tuple[bool, str] | None:
    """An engine that places whole layers, the model too big for its GPUs: the layers that do not fit run from
    host RAM (slowly), so it fits when the RAM holds them. None: not such an engine, or nothing to size with."""
    layers = gpu_layers(model, hardware, gpus, recipe)
    if layers is None or gpus > hardware.gpus_per_node:
        return None
    on_gpus, total = layers
    in_ram = need * (total - on_gpus) / total
    ram = host_ram_gib if host_ram_gib is not None else hardware.host_ram_gib
    placed = f"{on_gpus} of {total} layers on the GPUs, {_tb(in_ram)} of layers in host RAM"
    if ram is None:
        return False, f"{placed}: set the host's `host_ram_gib` (the hardware catalog gives no typical figure)"
    if in_ram > ram * GIB:
        return False, f"{placed}, the host has {ram} GiB ({_tb(ram * GIB)}): it does not fit"
    return True, f"fits by layer: {placed} of {ram} GiB (layers in RAM run on the CPU: slow)"


def layer_lines(report: CapacityReport, model: Model, hardware: Hardware, recipe: Recipe | None) -> list[str]:
    """What `modelfleet plan` says of an engine that places whole layers: the layers on the GPUs, and the GGUF
    guide's caveat that this does not shrink what the model needs."""
    engine = load_catalog().engines[recipe.engine] if recipe is not None else None
    if engine is None or engine.layer_offload is None:
        return []
    need = report.checkpoint_bytes * (1 + (model.gguf or {}).get("memory_overhead", 0.0))
    layers = gpu_layers(model, hardware, report.gpus_per_node, recipe)
    placed = (f"{layers[0]} of {layers[1]} layers on the GPUs ({engine.layer_offload.parameter} {layers[0]}), the "
              "rest in host RAM" if layers and layers[0] < layers[1] else
              f"all {layers[1]} layers on the GPUs" if layers else
              f"the model catalog gives no layer count for {model.id}: the engine decides")
    return [f"{recipe.engine} offloads whole layers, not MoE experts: {placed}",
            f"caveat (the GGUF guide): {recipe.engine} does not shrink the memory requirement; GPUs and host RAM "
            f"together must hold about {_tb(need)} (download + {(model.gguf or {}).get('memory_overhead', 0):.0%})"]


def split_lines(report: CapacityReport) -> list[str]:
    """The offload split as `modelfleet plan` prints it (empty when every weight is on the GPUs)."""
    s = report.offload
    if not s:
        return []
    gpus = report.gpus_per_node * report.nodes
    ram = f"{s['host_ram_gib']} GiB" if s["host_ram_gib"] else "not set"
    return [
        f"experts kept in host RAM: {s['mode']}",
        f"on the GPUs: {_tb(s['dense_bytes'])} dense weights (attention, shared expert, embeddings) + "
        f"{_tb(s['experts_on_gpus_bytes'])} experts, x {1 + s['margin']:.2f} runtime margin = "
        f"{_tb(s['gpu_need_bytes'])} over {gpus} GPU(s); KV-cache room {_tb(report.kv_room_per_gpu_bytes)} per GPU",
        f"in host RAM: {_tb(s['experts_in_ram_bytes'])} experts x {1 + s['margin']:.2f} = "
        f"{_tb(s['ram_need_bytes'])} of {ram}",
    ]
