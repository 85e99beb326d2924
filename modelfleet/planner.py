"""Sizing arithmetic (pure): does a model fit the GPUs, how much KV-cache room is left, how much disk."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from modelfleet.catalog import BYTES_PER_PARAM, Hardware, Model, Recipe

MIB = 2**20
# huggingface_hub writes each file to .incomplete before moving it; keep 5 % of the checkpoint spare.
TEMP_FRACTION = 0.05
# Below this per-GPU KV-cache room an engine starts but cannot hold a useful context.
MIN_KV_BYTES_PER_GPU = 1 * 2**30


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

    def to_json(self) -> dict:
        return asdict(self)


def checkpoint_size(model: Model, recipe: Recipe | None = None) -> tuple[float, bool]:
    """Real bytes when the catalog knows them (or the GGUF quant), else an estimate from the weight format."""
    if recipe is not None and recipe.gguf_quant and model.gguf:
        return float(model.gguf["quants"][recipe.gguf_quant]), False
    if model.checkpoint_bytes:
        return float(model.checkpoint_bytes), False
    return model.params_total * BYTES_PER_PARAM[model.weights], True


def _tb(n: float) -> str:
    return f"{n / 1e12:.2f} TB" if n >= 1e12 else f"{n / 1e9:.1f} GB"


def plan_capacity(model: Model, hardware: Hardware, gpus: int, nodes: int = 1, recipe: Recipe | None = None,
                  keep_revisions: int = 1) -> CapacityReport:
    total_gpus = gpus * nodes
    fraction = recipe.memory_fraction if recipe else 0.9
    ckpt, estimated = checkpoint_size(model, recipe)
    need = ckpt * (1 + model.gguf["memory_overhead"]) if recipe and recipe.gguf_quant and model.gguf else ckpt
    hbm = hardware.hbm_mib * MIB
    usable = hbm * fraction
    per_gpu = need / total_gpus if total_gpus else need
    kv_room = usable - per_gpu
    disk = ckpt * (1 + keep_revisions) + ckpt * TEMP_FRACTION
    raw = {"bf16": model.params_total * 2, "8bit": model.params_total * 1, "4bit": model.params_total * 0.5}
    reason = ""
    fits = True
    if gpus > hardware.gpus_per_node and hardware.vendor != "none":
        fits, reason = False, f"{hardware.id} hosts carry {hardware.gpus_per_node} GPUs, not {gpus}"
    elif total_gpus == 0 or kv_room < MIN_KV_BYTES_PER_GPU:
        fits = False
        reason = (f"{model.id} needs {_tb(need)} of weights ({_tb(per_gpu)} per GPU over {total_gpus} GPU(s)); "
                  f"{total_gpus}x {hardware.id} offers {_tb(usable)} usable per GPU "
                  f"({hardware.hbm_mib} MiB x {fraction:.2f}), leaving {_tb(max(kv_room, 0))} for KV cache "
                  f"(minimum {_tb(MIN_KV_BYTES_PER_GPU)})")
    else:
        reason = (f"fits: {_tb(per_gpu)} weights per GPU, {_tb(kv_room)} left for KV cache per GPU")
    return CapacityReport(
        model=model.id, hardware=hardware.id, gpus_per_node=gpus, nodes=nodes, raw_bytes=raw,
        checkpoint_bytes=ckpt, checkpoint_estimated=estimated, weights_per_gpu_bytes=per_gpu,
        hbm_per_gpu_bytes=hbm, memory_fraction=fraction, usable_per_gpu_bytes=usable,
        kv_room_per_gpu_bytes=kv_room, disk_needed_bytes=disk, fits=fits, reason=reason,
    )
