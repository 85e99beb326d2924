"""The catalog: models, hardware, engines and recipes as YAML data with provenance."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

CATALOG_DIR = Path(__file__).parent


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Model(_Strict):
    id: str
    hf_repo: str
    source: str
    architecture: Literal["moe", "dense"]
    params_total: float
    params_active: float
    layers: int | None = None
    layer_mix: dict[str, int] | None = None
    experts: dict[str, int] | None = None
    context_max: int
    modalities: list[str]
    weights: str
    activations: str | None = None
    checkpoint_bytes: float | None = None
    trust_remote_code: bool = False
    engines: list[str]
    gguf: dict | None = None


class Hardware(_Strict):
    id: str
    vendor: Literal["nvidia", "amd", "none"]
    gpu_name: str | None
    hbm_mib: int
    gpus_per_node: int
    interconnect: str
    nvswitch: bool
    fabric_manager: bool
    extra_packages: list[str] = Field(default_factory=list)
    allreduce_busbw_gbps: float | None
    threshold_source: str


class Engine(_Strict):
    source: str
    entrypoint: str
    argv: list[str]
    served_name_flag: str
    host_flag: str
    port_flag: str
    api_key_env: str | None = None
    api_key_config_file: bool = False
    default_port: int
    metrics_args: list[str] = []  # what turns /metrics on (vLLM serves it by default)


class Layout(_Strict):
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: bool = False
    dcp: int = 1
    nodes: int = 1
    gpus_per_node: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


class Recipe(_Strict):
    id: str
    model: str
    engine: str
    hardware: list[str]
    source: str
    verified: bool
    notes: str | None = None
    image: str
    min_engine_version: str | None = None
    min_driver: str | None = None
    cuda: str | None = None
    rocm: str | None = None
    gguf_quant: str | None = None
    model_file: str | None = None
    layout: Layout
    memory_fraction: float = 0.9
    docker: dict[str, str] = Field(default_factory=dict)
    args: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    ready_timeout_s: int


# Bytes per parameter of each weight format (block scales included for MX formats:
# 32 values share one 8-bit scale, so MXFP4 is 4.25 bits per weight).
BYTES_PER_PARAM = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "mxfp8": 1.0 + 1 / 32, "int8": 1.0,
                   "int4": 0.5, "mxfp4": 0.5 + 1 / 32, "nvfp4": 0.5 + 1 / 16}


class Catalog(_Strict):
    models: dict[str, Model]
    hardware: dict[str, Hardware]
    engines: dict[str, Engine]
    recipes: dict[str, Recipe]

    def recipes_for(self, model: str, engine: str, hardware: str) -> list[Recipe]:
        return [r for r in self.recipes.values()
                if r.model == model and r.engine == engine and hardware in r.hardware]


def _load_dir(folder: Path, cls):
    items = {}
    for path in sorted(folder.glob("*.yaml")):
        item = cls(**yaml.safe_load(path.read_text()))
        items[item.id] = item
    return items


@lru_cache(maxsize=None)
def load_catalog(root: Path = CATALOG_DIR) -> Catalog:
    engines = yaml.safe_load((root / "engines.yaml").read_text())
    return Catalog(
        models=_load_dir(root / "models", Model),
        hardware=_load_dir(root / "hardware", Hardware),
        engines={name: Engine(**spec) for name, spec in engines.items()},
        recipes=_load_dir(root / "recipes", Recipe),
    )
