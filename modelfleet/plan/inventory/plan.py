"""The typed plans the resolver builds from the schema and the catalog: one HostPlan per host (its services,
its GPU stack), one PoolPlan per pool. Stages read these, never raw host data."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace

from modelfleet.base import grammar
from modelfleet.base.errors import ModelfleetError
from modelfleet.base.host_commands import revisions_dir
from modelfleet.plan.catalog import Engine, Hardware, Model, Recipe
from modelfleet.plan.inventory.schema import HUB_ENDPOINT, HostData, ServiceData
from modelfleet.plan.venvs import VenvPlan


@dataclass(frozen=True)
class HostFabric:
    """One pool member's fabric, as its containers get it."""

    host: str
    ifname: str | None  # the control interface: the one that routes to the pool's head
    head_address: str  # the head's address on that interface (never the SSH address when a fabric one exists)
    hcas: tuple[str, ...] = ()  # active HCAs used by NCCL, in the same order on every member
    env: dict[str, str] = field(default_factory=dict)  # NCCL_/GLOO_/engine host-IP variables, exact-match forms
    devices: tuple[str, ...] = ()  # host device nodes passed into the container (RDMA, IMEX channel)
    rdma: bool = False  # HCAs are used: the container needs IPC_LOCK and an unlimited memlock
    imex: bool = False  # NVLink domain: IMEX node list, service and channel on this host
    imex_nodes: tuple[str, ...] = ()  # the domain's fabric addresses, in pool order (IMEX's node list)
    reasons: dict[str, str] = field(default_factory=dict)  # value name -> why it has this value
    distances: dict[str, dict[str, str]] = field(default_factory=dict)  # GPU PCI address -> HCA -> PIX/PXB/...



def _default(name: str, model=HostData):
    """A setting's default, from the schema (its one home); lists as tuples, as the plans hold them."""
    value = model.model_fields[name].default
    return tuple(value) if isinstance(value, list) else value


@dataclass(frozen=True)
class StackPlan:
    """The GPU host stack a host should have: HostData's fields of the same names (defaults live there)."""

    manage: bool
    driver_branch: str
    driver_version: str | None
    driver_flavor: str
    driver_source: str
    driver_allow_downgrade: bool
    driver_pinning: bool
    cuda_toolkit: str | None
    reboot: bool
    nvidia_repo_url: str
    container_toolkit_repo_url: str
    container_toolkit_key_url: str
    docker_source: str
    docker_repo_url: str
    amd_repo_url: str
    rocm_version: str
    amdgpu_install_build: str
    gpu_check_image: str
    service_user: str
    repo_key_fingerprints: tuple = ()  # modelfleet.plan.trust.pinned: (repository, fingerprints) pairs


# The container GPU check's default image per vendor: any image works (the NVIDIA toolkit injects the host's
# nvidia-smi; the AMD check lists /dev/dri), so CUDA's base image from NVIDIA's registry, and plain Ubuntu.
GPU_CHECK_IMAGES = {"nvidia": "nvcr.io/nvidia/cuda:13.0.2-base-ubuntu24.04", "amd": "ubuntu:24.04"}
STACK_KEYS = tuple(f for f in StackPlan.__dataclass_fields__ if f != "manage")


@dataclass(frozen=True)
class RouterChoice:
    """A service's `router*` settings (ServiceData's fields of the same names; defaults live there)."""

    host: str
    port: int
    bind_address: str | None
    policy: str
    tls_cert: str | None = None  # control-node files: the front door's certificate chain and its key
    tls_key: str | None = None
    client_keys_env: tuple[str, ...] = ()  # control-node variables of the keys clients use (none: api_key_env's)
    server_name: str | None = None  # the name clients use (router_server_name)


@dataclass(frozen=True)
class Worker:
    """One replica behind a front door: its pool, the host serving its HTTP (a pool's head) and the URL the
    router reaches it at."""

    pool: str
    host: str
    url: str
    role: str | None = None  # prefill or decode behind a PD front door (read from its recipe's flags)
    bootstrap_port: int | None = None  # a prefill server's, where the router's engine has one (SGLang)


@dataclass(frozen=True)
class RouterPlan:
    """One model's front door: the engine's router on `host`, listing the model's replicas."""

    name: str
    host: str
    engine_name: str
    served_name: str
    bind_address: str
    port: int
    policy: str
    api_key_env: str
    config_dir: str
    workers: tuple[Worker, ...]
    pd: bool = False  # prefill/decode mode: the router pairs its prefill and decode servers
    tls_cert: str | None = None  # control-node files (RouterChoice); set: the front door speaks HTTPS
    tls_key: str | None = None
    # The variables of the keys clients use; the front door then sends the replicas api_key_env's key instead.
    client_keys_env: tuple[str, ...] = ()
    server_name: str | None = None  # the name clients use for it (router_server_name); None: its address
    host_address: str = ""  # the router host's address: where a wildcard bind_address is reached
    worker_firewall: bool = True  # the router host's router_worker_firewall

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    @property
    def backend_port(self) -> int:
        """Where the router itself listens on loopback when a proxy is the front door."""
        return self.port + 1

    @property
    def metrics_port(self) -> int:
        return self.port + 2

    @property
    def unit_name(self) -> str:
        return f"modelfleet-router-{self.name}.service"

    @property
    def proxy_unit_name(self) -> str:
        return f"modelfleet-door-{self.name}.service"

    @property
    def reached_at(self) -> str:
        """The address clients and checks connect to: the bind address, the host's for a wildcard one."""
        wildcard = self.host_address and self.bind_address in ("0.0.0.0", "::")
        return self.host_address if wildcard else self.bind_address

    @property
    def client_name(self) -> str:
        """The name clients use (and a TLS certificate must cover): `server_name`, else the address."""
        return self.server_name or self.reached_at

    @property
    def base_url(self) -> str:
        """The URL clients use: by `server_name` where the inventory gives it, else the address."""
        return f"{'https' if self.tls else 'http'}://{_url_host(self.client_name)}:{self.port}"

    @property
    def dial_url(self) -> str:
        """Where the control node's checks connect (the address; with TLS they check `client_name`)."""
        return f"{'https' if self.tls else 'http'}://{_url_host(self.reached_at)}:{self.port}"


@dataclass(frozen=True)
class ServicePlan:
    host: str
    pool: str
    model: Model
    engine_name: str
    engine: Engine
    recipe: Recipe
    hardware: Hardware
    gpus: int
    served_name: str
    port: int
    bind_address: str
    api_key_env: str | None
    revision: str | None
    trust_remote_code: bool
    image: str
    extra_args: tuple[str, ...]
    env: dict[str, str]
    model_dir: str
    gpu_passthrough: bool
    config_dir: str = _default("config_dir")
    node_rank: int = 0
    nnodes: int = 1
    head_address: str = ""
    checkpoint_group: str = ""
    engine_cache_sharing: bool = True
    weight_cache: bool = False  # the restart tier's unit beside the engine's (modelfleet.plan.weight_cache)
    netcheck_min_busbw_gbps: float | None = _default("netcheck_min_busbw_gbps", ServiceData)
    netcheck_timeout_s: int = _default("netcheck_timeout_s", ServiceData)
    recipe_params: dict = field(default_factory=dict)  # values for the recipe's required parameters
    gpu_indices: tuple[int, ...] = ()  # this service's GPUs on its host (disjoint from the other services')
    model_file: str | None = None  # the file the engine loads, inside the checkpoint (GGUF: the first shard)
    fabric: HostFabric | None = None  # a multi-node pool member's fabric (devices, env, head address), from facts
    router: RouterChoice | None = None  # the model's front door, when its replicas sit behind one
    # A keyed proxy before this routed replica listens here (its fabric address) on `port`, the engine on loopback:
    # its engine's key leaves model routes open (modelfleet.plan.replica_door). None: the engine is what listens.
    door_address: str | None = None
    driver_branch: str = ""  # the host's (HostPlan fills it in): part of the engine cache's key
    # A replica (no `pool` given) names its unit after what it serves, so every replica has the same unit name.
    unit_stem: str = ""
    render_gid: int | None = None  # AMD: the host's render group (read with the probe), added by number
    venv: VenvPlan | None = None  # runtime venv: the engine runs from this virtual environment, not `image`

    @property
    def runtime(self) -> str:
        return "venv" if self.venv else "container"

    def at_commit(self, commit: str, model_file: str | None = None, **pinned) -> "ServicePlan":
        """The same service pinned to a resolved 40-hex commit: its own model directory, so a new revision
        changes the unit (and restarts the engine) while the old one stays on disk for rollback. `pinned`:
        other pinned fields set in the same step (the image by digest)."""
        return replace(self, revision=commit, model_dir=f"{revisions_dir(self.model_dir)}/{commit}",
                       model_file=model_file or self.model_file, **pinned)

    @property
    def hf_repo(self) -> str:
        """Where the checkpoint comes from: the model's repository, or its GGUF repository for a GGUF recipe."""
        return self.model.gguf["repo"] if self.recipe.gguf_quant and self.model.gguf else self.model.hf_repo

    @property
    def checkpoint_patterns(self) -> tuple[str, ...]:
        """The files of the repository this service needs (a GGUF repository holds every quantization)."""
        return (f"{self.recipe.gguf_quant}/*",) if self.recipe.gguf_quant and self.model.gguf else ()

    @property
    def ports(self) -> tuple[int, ...]:
        """Every port the service's engine listens on: its own, then its side ports (TokenSpeed's control server
        on port + 1), from the engine entry."""
        return (self.port, *(self.port + offset for offset in self.engine.side_ports))

    @property
    def unit_name(self) -> str:
        return f"modelfleet-{self.unit_stem or self.pool}.service"

    @property
    def legacy_unit_name(self) -> str | None:
        """A replica's unit named after its pool (the host): found on a host, it is retired for `unit_name`."""
        return f"modelfleet-{self.pool}.service" if self.unit_stem and self.unit_stem != self.pool else None

    @property
    def container_name(self) -> str:
        # The host name keeps containers of several hosts apart when they share one dockerd (the lab).
        return _slug(f"modelfleet-{self.pool}-{self.host}")

    @property
    def env_file(self) -> str:
        return f"{self.config_dir}/{self.pool}.env"

    @property
    def secrets_config_file(self) -> str:
        return f"{self.config_dir}/{self.pool}.secrets.yaml"

    @property
    def auth_file(self) -> str:
        """`Authorization:` header for clients on the host (readiness checks), when a key is set."""
        return f"{self.config_dir}/{self.pool}.auth"

    @property
    def loopback(self) -> bool:
        return _is_loopback(self.bind_address)

    @property
    def base_url(self) -> str:
        return f"http://{_url_host(self.bind_address)}:{self.port}"

    @property
    def router_url(self) -> str:
        """Where its front door's router reaches it: its keyed proxy, or the engine itself."""
        return f"http://{_url_host(self.door_address)}:{self.port}" if self.door_address else self.base_url


@dataclass(frozen=True)
class HostPlan:
    name: str
    address: str
    hardware: Hardware
    gpu_count: int
    model_root: str
    config_dir: str
    hf_token_env: str
    services: tuple[ServicePlan, ...]
    stack: StackPlan
    assess_models: tuple[str, ...] = _default("assess_models")
    host_ram_gib: int | None = _default("host_ram_gib")  # the host's setting, else the hardware catalog's figure
    hf_endpoint: str = HUB_ENDPOINT
    model_source: str | None = _default("model_source")
    model_keep_revisions: int = _default("model_keep_revisions")
    model_reverify: bool = _default("model_reverify")
    model_fanout_width: int = _default("model_fanout_width")
    model_fanout: str = _default("model_fanout")
    model_fanout_rate_mb_s: int | None = _default("model_fanout_rate_mb_s")
    model_stall_s: int = _default("model_stall_s")
    fabric_address: str = ""
    network_env: dict = field(default_factory=dict)
    nvme_devices: tuple[str, ...] = _default("nvme_devices")
    model_filesystem: str = _default("model_filesystem")
    format_allow_serials: tuple[str, ...] = _default("format_allow_serials")
    verify_bench: bool = _default("verify_bench")
    verify_full: bool = _default("verify_full")
    admission: bool = _default("admission")
    admission_valid_h: int = _default("admission_valid_h")
    admission_h2d: bool = _default("admission_h2d")
    admission_dcgm_level: int = _default("admission_dcgm_level")
    dcgm_exporter: bool = _default("dcgm_exporter")
    unit_dropins: str = _default("unit_dropins")
    dcgm_exporter_image: str = _default("dcgm_exporter_image")
    # pyinfra's SSH settings, for the client commands (status, logs, tunnel) that reach hosts without pyinfra
    ssh_port: int = _default("ssh_port")
    ssh_user: str | None = _default("ssh_user")
    ssh_key: str | None = _default("ssh_key")
    ssh_known_hosts_file: str | None = _default("ssh_known_hosts_file")
    ssh_strict_host_key_checking: str | None = _default("ssh_strict_host_key_checking")
    routers: tuple[RouterPlan, ...] = ()  # the front doors this host runs (modelfleet.plan.inventory.routed)
    router_worker_firewall: bool = _default("router_worker_firewall")
    router_pip_index_url: str | None = _default("router_pip_index_url")

    def __post_init__(self):
        # The engine cache's key names the driver branch; services learn it from their host, its one home. The
        # resolver builds them with it already: a service is rebuilt here only where it differs.
        branch = self.stack.driver_branch if self.stack else ""
        if any(s.driver_branch != branch for s in self.services):
            object.__setattr__(self, "services", tuple(replace(s, driver_branch=branch) for s in self.services))

    @property
    def stack_ours(self) -> bool:
        """modelfleet installs and keeps this host's GPU stack: `gpu_stack` on and GPUs to drive (not someone else's
        stack on a pre-built host, nor a host without GPUs). Its one home: every stage and tool asks it."""
        return self.stack.manage and self.hardware.vendor != "none"


@dataclass
class PoolPlan:
    name: str
    hosts: list[str] = field(default_factory=list)
    services: list[ServicePlan] = field(default_factory=list)


@dataclass
class Resolved:
    hosts: dict[str, HostPlan]
    pools: dict[str, PoolPlan]
    errors: list[tuple[str, str, str]]  # (where, field, message)
    routers: dict[str, RouterPlan] = field(default_factory=dict)  # front door name -> its plan
    warnings: list[tuple[str, str, str]] = field(default_factory=list)  # the same shape; `--strict` refuses them
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # checks `--offline` left out
    info: list[tuple[str, str, str]] = field(default_factory=list)  # the recipes' own notes: said, never refused
    # Where the data came from (set by the door): host -> key -> file or "--data"; the files read.
    sources: dict[str, dict[str, str]] = field(default_factory=dict)
    group_data_files: list[str] = field(default_factory=list)
    group_data_folders: list[str] = field(default_factory=list)
    site_recipe_files: list[str] = field(default_factory=list)
    site_hardware_files: list[str] = field(default_factory=list)
    groups: dict[str, list[str]] = field(default_factory=dict)  # pyinfra's groups: group -> hosts
    data: dict[str, dict] = field(default_factory=dict)  # host -> its merged data, as pyinfra gives it

    def error_lines(self) -> list[str]:
        return [f"{where}: {fld}: {msg}" for where, fld, msg in self.errors]

    def error_report(self, problems: list[tuple[str, str, str]] | None = None) -> str:
        """Every error (or the given problems), grouped by host, pool or file (in the order they were found)."""
        groups: dict[str, list[str]] = {}
        for where, fld, msg in self.errors if problems is None else problems:
            groups.setdefault(where, []).append(f"  {fld}: {msg}")
        return "\n".join(f"{where}:\n" + "\n".join(lines) for where, lines in groups.items())


class InventoryError(ModelfleetError):
    def __init__(self, errors: list[tuple[str, str, str]]):
        self.errors = errors
        super().__init__("\n".join(f"{w}: {f}: {m}" for w, f, m in errors))


def _slug(text: str) -> str:
    return grammar.slug(text, "-")


def _url_host(address: str) -> str:
    """An address as a URL's host: an IPv6 address in brackets."""
    return f"[{address}]" if ":" in address else address


def _is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


