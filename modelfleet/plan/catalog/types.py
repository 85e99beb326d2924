"""The catalog's types: what a model, a board, an engine and a recipe file may say, field by field, each checked
as it is read (modelfleet.plan.catalog reads the files into them)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from modelfleet.base import grammar, image_runtime


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# The grammar's kinds of value (modelfleet/base/grammar.py), as catalog and site files use them: the same rules an
# inventory value gets, because these values reach the same units, env files, commands and log lines.
Id = Annotated[str, grammar.checked(grammar.name)]


Text = Annotated[str, grammar.checked(grammar.single_line)]


Version = Annotated[str, grammar.checked(grammar.version)]


Image = Annotated[str, grammar.checked(grammar.image)]


Token = Annotated[str, grammar.checked(grammar.no_control)]  # one argument of a command line


Flag = Annotated[str, grammar.checked(grammar.flag)]


EnvName = Annotated[str, grammar.checked(grammar.env_entry)]


EnvValue = Annotated[str, grammar.checked(grammar.env_value)]


Fraction = Annotated[float, Field(gt=0, le=1)]


Size = Annotated[int, Field(ge=1, le=4096)]  # a parallel size


GpusPerNode = Annotated[int, Field(ge=1, le=72)]  # the largest NVLink domain one host sees (NVL72)


Bandwidth = Annotated[float, Field(gt=0, le=10000)]  # GB/s: past any link that exists (NVLink 5: 1800)


# Host RAM in GiB: 64 TiB is past the largest single servers sold (32 TiB); more is a unit slip.
RamGib = Annotated[int, Field(ge=1, le=65536)]


Seconds = Annotated[int, Field(ge=1, le=86400)]  # a wait or a goal in whole seconds, at most a day


def _gguf(spec: dict) -> dict:
    """A model's GGUF repository (downloaded like a hub repository) and its quantizations' sizes."""
    reason = grammar.hub_repo(str(spec.get("repo", "")))
    if reason:
        raise ValueError(f"gguf.repo {reason}")
    if not 0 <= spec.get("memory_overhead", 0) <= 1:
        raise ValueError("gguf.memory_overhead must be a fraction (0-1)")
    for quant, size in (spec.get("quants") or {}).items():
        try:
            positive = float(size) > 0  # YAML 1.1 reads 1.51e12 as text: the planner takes float() of it
        except (TypeError, ValueError):
            positive = False
        if grammar.name(str(quant)) or not positive:
            raise ValueError("gguf.quants: each a quantization name and its size in bytes (> 0)")
    return spec


class Model(_Strict):
    id: Id
    hf_repo: Annotated[str, grammar.checked(grammar.hub_repo)]
    source: Text
    architecture: Literal["moe", "dense"]
    params_total: float
    params_active: float
    layers: int | None = None
    layer_mix: dict[str, int] | None = None
    experts: dict[str, int] | None = None
    context_max: Annotated[int, Field(ge=1)]
    modalities: list[Id]
    weights: Id
    activations: Id | None = None
    checkpoint_bytes: Annotated[float, Field(gt=0)] | None = None
    trust_remote_code: bool = False
    gguf: Annotated[dict, AfterValidator(_gguf)] | None = None


class Hardware(_Strict):
    id: Id
    vendor: Literal["nvidia", "amd", "none"]
    gpu_name: Text | None
    hbm_mib: Annotated[int, Field(ge=0, le=4 * 1024 * 1024)]
    gpus_per_node: Annotated[int, Field(ge=0, le=72)]  # 0: a CPU-only board (the lab's)
    interconnect: Text
    nvswitch: bool
    fabric_manager: bool
    extra_packages: list[Annotated[str, grammar.checked(grammar.package)]] = Field(default_factory=list)
    allreduce_busbw_gbps: Bandwidth | None
    threshold_source: Text
    # The PCIe link every GPU of a healthy board trains to (admission refuses a link trained down); None: not
    # known to this catalog, the check is skipped.
    pcie_gen: Annotated[int, Field(ge=1, le=8)] | None = None
    pcie_width: Literal[1, 2, 4, 8, 16, 32] | None = None
    # Each GPU's copy bandwidth from and to pinned host memory (GB/s) a healthy board reaches, for
    # `admission_h2d`; None: not known to this catalog, the figures are reported, not judged.
    h2d_min_gbps: Bandwidth | None = None
    h2d_source: Text | None = None
    # Host RAM of a typical server of this board (GiB), the default of a host's `host_ram_gib`: llama.cpp
    # recipes that keep MoE experts in host RAM are sized against it. None: no typical figure (workstations).
    host_ram_gib: RamGib | None = None
    host_ram_source: Text | None = None


class MultinodeFlags(_Strict):
    """Flags every node of a multi-node pool gets, and those only the workers (rank > 0) add; `{...}` are the
    pool's values: nnodes, node_rank, head, master_port, dp, dp_local, dp_rpc_port, dp_start."""

    all: list[str]
    workers: list[str] = []


class EngineMetrics(_Strict):
    """The series of the engine's /metrics the bench samples while a level runs (modelfleet/run/checks/bench.py):
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
    """The engine's flags that keep MoE experts in host RAM (modelfleet/plan/planner.py sizes GPUs and RAM from them):
    `all` every layer's experts, `layers` (a count) those of the first N layers, `fit` with the value `on` what
    the GPUs cannot hold."""

    all: list[str]
    layers: list[str] = []
    fit: list[str] = []


class WeightCache(_Strict):
    """The engine's same-host restart tier (docs/restart-tier.md; modelfleet/plan/weight_cache.py): a daemon that
    holds each rank's loaded shard and hands it to a restarted engine. `since`: the first engine version read to
    have it; `engine_args`/`env` turn the engine into its client ({socket_dir}: the sockets' directory inside
    the containers); the daemon runs `daemon_entrypoint daemon_argv` ({model_path}) with the engine argv's
    `shard_flags` (what shapes a rank's shard: the cache's key) and, in a pool across hosts, `daemon_multinode`
    ({head}, {port}: its own rendezvous, apart from the engine's)."""

    source: str
    since: Version
    engine_args: list[str]
    env: dict[str, str] = {}
    daemon_entrypoint: str
    daemon_argv: list[str]
    shard_flags: list[str]
    daemon_multinode: list[str] = []
    docker_args: list[str] = []  # what both containers need beside the host's IPC namespace (--ipc=host)


# The families of boot lines modelfleet/run/timeline.py reads from an engine's log (its line head and its messages).
BootLog = Literal["vllm", "sglang", "llama.cpp"]


class Registration(_Strict):
    """How a model is registered with an engine that serves only models in its own store (Ollama): after the
    engine answers, `command` runs in its container ({name}: the served name, {modelfile}: modelfleet's Modelfile
    for it, FROM the checkpoint's file on the model root), then a POST of `load_body` to `load_path` loads it."""

    source: str
    command: list[str]
    load_path: str
    load_body: dict
    store_env: str  # the variable naming the engine's own model store (a directory on the model root)
    env: dict[str, str] = {}  # what the engine needs beside it to keep a registered model served


class LayerOffload(_Strict):
    """An engine that keeps whole layers on the GPUs and the rest in host RAM (Ollama's num_gpu), not MoE
    experts: the planner sizes the GPU layers and the Modelfile parameter `parameter` carries them."""

    source: str
    parameter: str


class Engine(_Strict):
    source: str
    entrypoint: str
    argv: list[str]
    # The engine's flags for its served name, address and port; an engine configured through its environment
    # instead (Ollama) names `address_env` (set to host:port) and has no such flags.
    served_name_flag: str | None = None
    host_flag: str | None = None
    port_flag: str | None = None
    address_env: str | None = None
    # Where readiness is asked (200 once the server is up), and how /v1/models lists a served name.
    health_path: str = "/health"
    listed_name: str = "{name}"
    registration: Registration | None = None  # none: the engine serves the checkpoint it is started with
    # Ports the engine also listens on, as offsets from its port (TokenSpeed's control server: port + 1).
    side_ports: list[Annotated[int, Field(ge=1, le=100)]] = []
    layer_offload: LayerOffload | None = None
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
    # directory); none: nothing worth keeping (modelfleet/plan/caches.py).
    caches: dict[str, str | dict[str, str]] = Field(default_factory=dict)
    # What the bench reads from /metrics (EngineMetrics), and which boot-line family the timeline reads from the
    # engine's log (null: its log is not read). Both required: a new engine says what it has, or that it has
    # none, rather than inheriting another engine's.
    metrics: EngineMetrics
    boot_log: BootLog | None
    expert_offload: ExpertOffload | None = None  # none: every weight stays on the GPUs
    # The variable naming the address a node of a multi-node pool advertises (set from the pool's fabric).
    host_ip_env: str | None = None
    # How the engine's parser reads a flag (modelfleet/plan/engine_flags.py): argparse (prefixes, aliases), vllm
    # (argparse, plus `_` for `-`, dotted JSON keys, --config files), exact (whole names only).
    flag_parser: Literal["argparse", "vllm", "exact"] = "argparse"
    weight_cache: WeightCache | None = None  # none: no restart tier

    @model_validator(mode="after")
    def _an_address(self):
        if not self.address_env and not (self.host_flag and self.port_flag and self.served_name_flag):
            raise ValueError("give host_flag, port_flag and served_name_flag, or address_env")
        return self

    def own_env(self) -> dict[str, str]:
        """The environment modelfleet sets itself for the engine (modelfleet.plan.render.address_env), each variable
        with what it carries: no recipe or inventory env may set one (it would be overwritten)."""
        reg = self.registration
        out = {key: f"{value} (the engine entry's, to keep a registered model served)"
               for key, value in (reg.env if reg else {}).items()}
        if reg:
            out[reg.store_env] = "its store on the model root"
        if self.address_env:
            out[self.address_env] = "bind_address and port"
        return out


class Layout(_Strict):
    tp: Size = 1
    pp: Size = 1
    dp: Size = 1
    ep: bool = False
    dcp: Size = 1
    nodes: Annotated[int, Field(ge=1, le=1024)] = 1
    gpus_per_node: GpusPerNode = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


class RecipeParameter(_Strict):
    """A setting the guide makes the user supply (no default exists): the inventory gives it in
    `recipe_params`, and validate names the missing one and where to get it."""

    flag: Flag
    where: Text  # where the value comes from (the guide's calculator, a doc)


class ProbeSettings(_Strict):
    """How the verify gate's tool probe asks this recipe's model (defaults: as a user's client would)."""

    tool_choice: Literal["auto", "required"] = "auto"     # first turn: may call the tool, or must
    final_tool_choice: Literal["auto", "none"] = "auto"   # the turn after the tool result
    why: Text | None = None                                # required when not the defaults

    @model_validator(mode="after")
    def _says_why(self):
        if (self.tool_choice, self.final_tool_choice) != ("auto", "auto") and not self.why:
            raise ValueError("probe: say `why` the tool probe asks this model differently")
        return self


class ReadyBudget(_Strict):
    """Seconds from a serve run's start to the endpoint ready (the timeline's ready_s) this recipe is held to:
    `cold` on a host that holds nothing of it, `restart` when only its unit restarts (weights already on the
    host: a changed image or setting, a crash). Goals, not limits: `upgrade` reports a batch whose restart took
    longer, `make bench-ready` prints each beside what it measured; ready_timeout_s still fails the host."""

    cold: Seconds
    restart: Seconds
    why: Text  # where the figures come from (a measured run, a vendor's published startup time)

    @model_validator(mode="after")
    def _restart_within_cold(self):
        if self.restart > self.cold:
            raise ValueError(f"ready_budget_s: restart ({self.restart}) may not exceed cold ({self.cold})")
        return self


class VenvRoute(_Strict):
    """The engine installed into a virtual environment on the host, as the guide installs it (`runtime: venv`,
    docs/venv.md). The site's lock (requirements with hashes) says exactly what is installed; this says what
    that lock must hold (`requires`, the guide's own requirements) and how to start the engine from it."""

    source: Text  # the guide's install commands, verbatim
    requires: Annotated[list[Annotated[str, grammar.checked(grammar.single_line)]], Field(min_length=1)]
    package: Id | None = None  # the distribution whose version names the venv; unset: the engine's name
    prerelease: bool = False  # the guide installs a pre-release (uv's --prerelease=allow): the lock may pin one
    python: Version | None = None  # the oldest Python the engine supports (checked against the host's)
    entrypoint: list[Token] = []  # the engine's command inside the venv's bin/; unset: the engine's entrypoint
    lock_with: Text | None = None  # how to make a lock from `requires` (shown when a service has none)


def _docker_options(options: dict) -> dict:
    """The docker run options a recipe may set, each held to what docker accepts."""
    for key, value in options.items():
        if key == "ipc" and value not in ("host", "private", "shareable", "none"):
            raise ValueError("docker.ipc must be host, private, shareable or none")
        if key == "shm_size" and not grammar.re.match(r"^[0-9]{1,6}[bkmg]?$", value):
            raise ValueError("docker.shm_size must be a size such as 32g")
    return options


class Recipe(_Strict):
    id: Id
    model: Id
    engine: Id
    hardware: Annotated[list[Id], Field(min_length=1)]
    source: Text
    verified: bool
    notes: Text | None = None
    # The engine's container image; a recipe with a `venv` route only may leave it out (runtime venv).
    image: Image | None = None
    # How a service of this recipe runs its engine unless it says otherwise: container (the image) or venv.
    runtime: Literal["container", "venv"] | None = None
    venv: VenvRoute | None = None
    min_engine_version: Version | None = None
    # The engine version whose argument parser these flags were checked with (an image tag without a version,
    # such as vllm/vllm-openai:kimi-k3, says nothing itself; `render` shows both).
    engine_version: Version
    serve_hub_id: bool = False  # also serve the model under its hub id, as the guides' clients call it
    parameters: dict[Id, RecipeParameter] = Field(default_factory=dict)
    min_driver: Annotated[str, grammar.checked(grammar.driver)] | None = None
    cuda: Version | None = None  # what the image is built with (checked against its tag and the driver branch)
    rocm: Version | None = None
    runtime_source: Text | None = None  # where that CUDA/ROCm version comes from
    gguf_quant: Id | None = None
    model_file: Annotated[str, grammar.checked(grammar.relative_file)] | None = None
    layout: Layout
    memory_fraction: Fraction = 0.9
    docker: Annotated[dict[Literal["ipc", "shm_size"], str], AfterValidator(_docker_options)] = \
        Field(default_factory=dict)
    args: list[Token]
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    ready_timeout_s: Seconds
    ready_budget_s: ReadyBudget | None = None
    probe: ProbeSettings = Field(default_factory=ProbeSettings)
    # The site file a recipe came from (None: shipped); not a field a file can set.
    _site: str | None = PrivateAttr(None)

    @property
    def site(self) -> str | None:
        return self._site

    @property
    def default_runtime(self) -> str:
        return self.runtime or ("container" if self.image else "venv")

    @model_validator(mode="after")
    def _runtime_matches_the_tag(self):
        if self.default_runtime == "container" and not self.image:
            raise ValueError("runtime container needs an image (or say runtime: venv with a venv route)")
        if self.default_runtime == "venv" and not self.venv:
            raise ValueError("runtime venv needs a `venv` route (what the guide installs)")
        problem = image_runtime.tag_problem(self.image, self.cuda, self.rocm) if self.image else None
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
