"""The catalog: models, hardware, engines and recipes as YAML data with provenance."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from modelfleet import image_runtime
from modelfleet.errors import ModelfleetError

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
    # The PCIe link every GPU of a healthy board trains to (admission refuses a link trained down); None: not
    # known to this catalog, the check is skipped.
    pcie_gen: int | None = None
    pcie_width: int | None = None
    # Each GPU's copy bandwidth from and to pinned host memory (GB/s) a healthy board reaches, for
    # `admission_h2d`; None: not known to this catalog, the figures are reported, not judged.
    h2d_min_gbps: float | None = None
    h2d_source: str | None = None
    # Host RAM of a typical server of this board (GiB), the default of a host's `host_ram_gib`: llama.cpp
    # recipes that keep MoE experts in host RAM are sized against it. None: no typical figure (workstations).
    host_ram_gib: int | None = None
    host_ram_source: str | None = None


class MultinodeFlags(_Strict):
    """Flags every node of a multi-node pool gets, and those only the workers (rank > 0) add; `{...}` are the
    pool's values: nnodes, node_rank, head, master_port, dp, dp_local, dp_rpc_port, dp_start."""

    all: list[str]
    workers: list[str] = []


class EngineMetrics(_Strict):
    """The series of the engine's /metrics the bench samples while a level runs (modelfleet/checks/bench.py):
    queue depth, KV-cache use (0..1), and the prefix cache's hits either as a rate gauge or as hits and queries
    counters. A series left out is not measured; `{}` says the engine has none of them."""

    queue: str | None = None
    kv: str | None = None
    prefix_hits: str | None = None
    prefix_queries: str | None = None
    prefix_hit_rate: str | None = None

    @model_validator(mode="after")
    def _one_way_to_hits(self):
        if bool(self.prefix_hits) != bool(self.prefix_queries):
            raise ValueError("prefix_hits and prefix_queries go together (the rate is hits / queries)")
        if self.prefix_hits and self.prefix_hit_rate:
            raise ValueError("give prefix_hit_rate or prefix_hits with prefix_queries, not both")
        return self


class ExpertOffload(_Strict):
    """The engine's flags that keep MoE experts in host RAM (modelfleet/planner.py sizes GPUs and RAM from them):
    `all` every layer's experts, `layers` (a count) those of the first N layers, `fit` with the value `on` what
    the GPUs cannot hold."""

    all: list[str]
    layers: list[str] = []
    fit: list[str] = []


# The families of boot lines modelfleet/timeline.py reads from an engine's log (its line head and its messages).
BootLog = Literal["vllm", "sglang", "llama.cpp"]


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
    # Flags modelfleet sets itself (address, port, key, model, names, parallel layout, multi-node), with the
    # engine's aliases: `extra_args` may not set them (the flags the rendered command already carries are
    # refused too).
    managed_flags: list[str] = []
    # How the engine is told the share of GPU memory the planner sized with (None: the engine has no such flag).
    memory_fraction_flag: str | None = None
    several_served_names: bool = False  # the served-name flag takes more than one name (vLLM: nargs +)
    # Layout dimension (tp, pp, dp) -> the engine's flags for it; none: the engine has no such sizes (llama.cpp).
    parallel_flags: dict[str, list[str]] = Field(default_factory=dict)
    # Multi-node launch flags: "tp" for a pool that shards one model over its nodes, "dp" (when the engine has a
    # data-parallel launch) for one whose nodes each run their share of DP ranks; none: no multi-node mode.
    multinode: dict[Literal["tp", "dp"], "MultinodeFlags"] = Field(default_factory=dict)
    # Compile/JIT caches kept across restarts: `source`, and `env` (variable -> subdirectory of the mounted cache
    # directory); none: nothing worth keeping (modelfleet/caches.py).
    caches: dict[str, str | dict[str, str]] = Field(default_factory=dict)
    # What the bench reads from /metrics (EngineMetrics), and which boot-line family the timeline reads from the
    # engine's log (null: its log is not read). Both required: a new engine says what it has, or that it has
    # none, rather than inheriting another engine's.
    metrics: EngineMetrics
    boot_log: BootLog | None
    expert_offload: ExpertOffload | None = None  # none: every weight stays on the GPUs
    # The variable naming the address a node of a multi-node pool advertises (set from the pool's fabric).
    host_ip_env: str | None = None


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


class RecipeParameter(_Strict):
    """A setting the guide makes the user supply (no default exists): the inventory gives it in
    `recipe_params`, and validate names the missing one and where to get it."""

    flag: str
    where: str  # where the value comes from (the guide's calculator, a doc)


class ProbeSettings(_Strict):
    """How the verify gate's tool probe asks this recipe's model (defaults: as a user's client would)."""

    tool_choice: Literal["auto", "required"] = "auto"     # first turn: may call the tool, or must
    final_tool_choice: Literal["auto", "none"] = "auto"   # the turn after the tool result
    why: str | None = None                                 # required when not the defaults

    @model_validator(mode="after")
    def _says_why(self):
        if (self.tool_choice, self.final_tool_choice) != ("auto", "auto") and not self.why:
            raise ValueError("probe: say `why` the tool probe asks this model differently")
        return self


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
    # The engine version whose argument parser these flags were checked with (an image tag without a version,
    # such as vllm/vllm-openai:kimi-k3, says nothing itself; `render` shows both).
    engine_version: str
    serve_hub_id: bool = False  # also serve the model under its hub id, as the guides' clients call it
    parameters: dict[str, RecipeParameter] = Field(default_factory=dict)
    min_driver: str | None = None
    cuda: str | None = None  # what the image is built with (checked against its tag and the driver branch)
    rocm: str | None = None
    runtime_source: str | None = None  # where that CUDA/ROCm version comes from
    gguf_quant: str | None = None
    model_file: str | None = None
    layout: Layout
    memory_fraction: float = 0.9
    docker: dict[str, str] = Field(default_factory=dict)
    args: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    ready_timeout_s: int
    probe: ProbeSettings = Field(default_factory=ProbeSettings)

    @model_validator(mode="after")
    def _runtime_matches_the_tag(self):
        problem = image_runtime.tag_problem(self.image, self.cuda, self.rocm)
        if problem:
            raise ValueError(problem)
        return self


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


class CatalogError(ModelfleetError):
    """A catalog (or site recipe) file that cannot be used: `where` is `path[:line]`."""

    def __init__(self, where: str, message: str):
        self.where, self.message = where, message
        super().__init__(f"{where}: {message}")


# libyaml's loader where PyYAML was built with it: the same safe subset, read in C. Every run (a converge, each
# shard) reads the whole catalog before its first host; in Python that was a tenth of a no-op converge's CPU.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _yaml(text: str):
    return yaml.load(text, Loader=_SafeLoader)


def _read(path: Path, cls):
    try:
        data = _yaml(path.read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise CatalogError(where, f"not valid YAML: {getattr(error, 'problem', None) or error}") from None
    if not isinstance(data, dict):
        raise CatalogError(str(path), f"must be a mapping of fields, got {type(data).__name__}")
    try:
        return cls(**data)
    except ValidationError as error:
        first = error.errors()[0]
        raise CatalogError(str(path), f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def _flag_value(args: list[str], flags: list[str]) -> str | None:
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in flags:
            return value if eq else (args[i + 1] if i + 1 < len(args) else "")
    return None


def layout_problems(recipe: "Recipe", engine: "Engine") -> list[str]:
    """Where a recipe's args contradict its layout: a parallel size set to another value, or a size the layout
    needs that no flag sets (the engine would run with 1 while holding the layout's GPUs)."""
    out = []
    for dim, flags in engine.parallel_flags.items():
        wanted, given = getattr(recipe.layout, dim), _flag_value(recipe.args, flags)
        if given is not None and given != str(wanted):
            out.append(f"args set {flags[0]} {given} but layout says {dim} {wanted}")
        elif given is None and wanted > 1 and not (recipe.layout.nodes > 1 and dim in engine.multinode):
            out.append(f"layout says {dim} {wanted} but args set no {flags[0]}: the engine would run {dim} 1")
    return out


def _check_layouts(recipes: dict, engines: dict, where) -> None:
    for recipe in recipes.values():
        engine = engines.get(recipe.engine)
        problems = layout_problems(recipe, engine) if engine else []
        if problems:
            raise CatalogError(where(recipe), f"recipe {recipe.id}: " + "; ".join(problems))


def _load_dir(folder: Path, cls):
    items: dict = {}
    for path in sorted(folder.glob("*.yaml")):
        item = _read(path, cls)
        if item.id in items:
            raise CatalogError(str(path), f"id {item.id} is already defined by another file of {folder}")
        items[item.id] = item
    return items


class SiteRecipe(Recipe):
    """A site's own recipe (a `recipes/` folder beside the inventory): a new id, or `overrides: <id>` to replace
    a shipped recipe on purpose."""

    overrides: str | None = None


def with_site_recipes(catalog: "Catalog", folder: Path) -> "Catalog":
    """The catalog plus a site's recipes; an id that shadows a shipped recipe without `overrides` is an error."""
    recipes = dict(catalog.recipes)
    for path in sorted(folder.glob("*.yaml")):
        site = _read(path, SiteRecipe)
        if site.overrides and site.overrides not in catalog.recipes:
            raise CatalogError(str(path), f"overrides: no shipped recipe {site.overrides!r}")
        if site.id in catalog.recipes and site.overrides != site.id:
            raise CatalogError(str(path), f"id {site.id} is a shipped recipe: pick a new id, or say "
                                          f"`overrides: {site.id}` to replace it")
        if site.overrides and site.overrides != site.id:
            recipes.pop(site.overrides)
        recipes[site.id] = Recipe(**site.model_dump(exclude={"overrides"}))
        _check_layouts({site.id: recipes[site.id]}, catalog.engines, lambda _, where=str(path): where)
    return catalog.model_copy(update={"recipes": recipes})


def _load_engines(path: Path) -> dict[str, Engine]:
    """engines.yaml: engine name -> its entry; a bad entry is named with the field at fault."""
    engines = {}
    for name, spec in (_yaml(path.read_text()) or {}).items():
        if not isinstance(spec, dict):
            raise CatalogError(str(path), f"engine {name}: must be a mapping of fields, got {type(spec).__name__}")
        try:
            engines[name] = Engine(**spec)
        except ValidationError as error:
            first = error.errors()[0]
            raise CatalogError(str(path), f"engine {name}: {'.'.join(map(str, first['loc']))}: "
                                          f"{first['msg']}") from None
    return engines


@lru_cache(maxsize=None)
def load_catalog(root: Path = CATALOG_DIR) -> Catalog:
    engines = _load_engines(root / "engines.yaml")
    recipes = _load_dir(root / "recipes", Recipe)
    _check_layouts(recipes, engines, lambda recipe: next(
        str(p) for p in sorted((root / "recipes").glob("*.yaml")) if _read(p, Recipe).id == recipe.id))
    return Catalog(
        models=_load_dir(root / "models", Model),
        hardware=_load_dir(root / "hardware", Hardware),
        engines=engines,
        recipes=recipes,
    )
