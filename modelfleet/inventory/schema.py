"""The inventory's schema: what host data, group_data and `services` entries may say, field by field, each
value held to its grammar (modelfleet.grammar). Unknown keys are refused by the resolver, with a suggestion."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from modelfleet import grammar

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SERVICE_KEYS = ("pool", "model", "engine", "recipe", "gpus", "served_name", "port", "bind_address",
                "api_key_env", "revision", "trust_remote_code", "image", "extra_args", "env", "checkpoint_group",
                "netcheck_min_busbw_gbps", "netcheck_timeout_s", "recipe_params", "gpu_indices")


def _fits(rule):
    """A pydantic validator from a grammar rule (the reason becomes the error; the value is never echoed)."""

    def check(value):
        reason = rule(value)
        if reason:
            raise ValueError(reason)
        return value

    return AfterValidator(check)


def _each(rule):
    return _fits(lambda values: next((f"entry {i + 1} {r}" for i, v in enumerate(values) if (r := rule(v))), None))


def _unique(values):
    return None if len(set(values)) == len(values) else "lists the same entry twice"


def _url(value: str) -> str | None:
    if grammar.no_control(value) or " " in value:
        return "may not contain spaces or control characters"
    return None if re.match(r"^(https?|file)://[^\s]+$", value) else "is not an http(s):// or file:// URL"


def _registry(value: str) -> str | None:
    return None if re.match(r"^[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*/?$", value) else \
        "is not a registry prefix (host[:port][/path])"


def _bind(value: str) -> str | None:
    return None if value == "localhost" else grammar.address(value)


Name = Annotated[str, _fits(grammar.name)]
Port = Annotated[int, Field(ge=1, le=65535)]
SecretVar = Annotated[str, _fits(grammar.secret_variable)]
Image = Annotated[str, _fits(grammar.image)]
Url = Annotated[str, _fits(_url)]
OwnedDir = Annotated[str, _fits(grammar.owned_directory)]


class ServiceData(BaseModel):
    """What an inventory may say about one served model on a host (all optional until resolved)."""

    model_config = ConfigDict(extra="forbid", strict=True)  # strict: no `True` as a port or a count
    pool: Name | None = None
    model: Name | None = None
    engine: Name | None = None
    recipe: Name | None = None
    gpus: Annotated[int, Field(ge=1)] | None = None
    served_name: Annotated[str, _fits(grammar.served_name)] | None = None
    port: Port | None = None
    bind_address: Annotated[str, _fits(_bind)] = "127.0.0.1"
    api_key_env: SecretVar | None = None
    revision: Annotated[str, _fits(grammar.revision)] | None = None
    trust_remote_code: bool | None = None
    image: Image | None = None
    extra_args: Annotated[list[str], _each(grammar.no_control)] = []
    env: dict[Annotated[str, _fits(grammar.env_name)], Annotated[str, _fits(grammar.env_value)]] = {}
    # Hosts that copy the checkpoint from each other (one hub download per group); default: the pool.
    checkpoint_group: Name | None = None
    # Gate threshold on all_reduce busbw at the largest size; default: the hardware catalog's.
    netcheck_min_busbw_gbps: Annotated[float, Field(gt=0)] | None = None
    netcheck_timeout_s: int = Field(120, ge=5, le=3600)  # how long a rank waits for the others to join
    # Which of the host's GPUs (nvidia-smi indices); default: the lowest free ones, in service order.
    gpu_indices: Annotated[list[Annotated[int, Field(ge=0, le=71)]], _fits(_unique)] | None = None
    # Values for the recipe's required parameters (e.g. SGLang's mamba_full_memory_ratio for Kimi K3).
    recipe_params: dict[Name, Annotated[float | int | str, _fits(lambda v: grammar.no_control(str(v)))]] = {}


class HostData(BaseModel):
    """Host-level settings; `services` (or the top-level service keys) say what the host serves."""

    # Unknown keys are refused by `resolve` (with a suggestion); pyinfra's own keys (ssh_*, _sudo, ...) pass.
    model_config = ConfigDict(extra="ignore", strict=True)
    hardware: Name | None = None
    gpu_count: Annotated[int, Field(ge=1)] | None = None
    ssh_hostname: Annotated[str, _fits(grammar.host_address)] | None = None
    ssh_port: Port = 22
    ssh_user: Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_.-]{0,31}$")] | None = None
    ssh_key: str | None = None
    ssh_known_hosts_file: str | None = None
    # pyinfra's own setting; modelfleet's status/logs/tunnel/upgrade honour it too (unset: unknown keys refused)
    ssh_strict_host_key_checking: Literal["yes", "accept-new", "no", "off"] | None = None
    model_root: OwnedDir = "/srv/models"
    config_dir: OwnedDir = "/etc/modelfleet"  # env and secret files (0700 directory, 0600 files)
    hf_token_env: SecretVar = "HF_TOKEN"
    image_registry: Annotated[str, _fits(_registry)] | None = None  # site mirror / lab registry prefix
    gpu_passthrough: bool = True  # the lab's hosts have no GPUs to hand to containers
    services: Annotated[list[dict[str, Any]], Field(min_length=1)] | None = None
    assess_models: list[Name] = []  # preflight also reports whether these would fit the measured GPUs
    hf_endpoint: Url | None = None  # default: the control node's HF_ENDPOINT, else https://huggingface.co
    # Air-gapped sites: a mirror URL or file:// directory holding <repo>/<commit>/ instead of the hub.
    model_source: Url | None = None
    model_keep_revisions: int = Field(1, ge=0)  # older revisions kept for rollback beside the served one
    model_reverify: bool = False  # hash every file again instead of trusting the manifest's size + mtime
    # Peers one host serves a checkpoint to at once; hosts that got their copy serve the next ones (a tree),
    # so no host's link carries more than this many copies and a large group takes log(N) waves, not N.
    # The checkpoint group's first host's setting counts for the whole group.
    model_fanout_width: int = Field(8, ge=1, le=1024)
    # A host serving peers sends at most this many MB/s in all (unset: as fast as the link goes), so a fan-out
    # on a link it shares with inference traffic leaves room for it.
    model_fanout_rate_mb_s: int | None = Field(None, ge=1)
    verify_bench: bool = False  # the verify stage also runs a short bench and fails on regressions
    verify_full: bool = False  # smoke + tool probe on every converge, not only when a unit (re)started
    admission: bool = True  # False: the admission stage leaves this host's GPUs unjudged (NVIDIA hosts only)
    admission_valid_h: int = Field(24, ge=1, le=720)  # how long an admission pass holds (reports/admission)
    # Also measure each GPU's pinned host <-> device copy bandwidth inside the serving image when the pool's
    # gate runs (netcheck), against the hardware catalog's h2d_min_gbps; a slow GPU fails the pool.
    admission_h2d: bool = False
    # DCGM's diagnostic at this level when admission judges the host (`dcgmi diag -r N`; 0 = off; 1 takes about
    # a minute, 2 a few, 3-4 half an hour or more): needs DCGM on the host; a failing test refuses it.
    admission_dcgm_level: int = Field(0, ge=0, le=4)
    dcgm_exporter: bool = False  # a DCGM exporter unit on NVIDIA hosts (:9400 on the fabric address)
    # NVIDIA's tag from github.com/NVIDIA/dcgm-exporter's README quickstart (DCGM 4.4.2, exporter 4.7.1)
    dcgm_exporter_image: Image = "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.2-4.7.1-ubuntu22.04"
    # NVMe for model_root: device paths, or ["auto"] for every blank NVMe disk; several become one RAID0.
    nvme_devices: Annotated[list[str], _each(lambda v: None if v == "auto" else grammar.device(v)),
                            _fits(_unique)] = []
    model_filesystem: Literal["xfs", "ext4"] = "xfs"
    # Devices that hold a partition table, filesystem or RAID metadata are never formatted, unless their
    # serial number is listed here.
    format_allow_serials: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")]] = []
    # The pool network: the gate and the engine units get the same settings.
    fabric_address: Annotated[str, _fits(grammar.address)] | None = None  # default: ssh_hostname
    nccl_socket_ifname: Annotated[str, _fits(grammar.interfaces)] | None = None
    gloo_socket_ifname: Annotated[str, _fits(grammar.interfaces)] | None = None
    nccl_ib_hca: Annotated[str, _fits(grammar.ib_hca)] | None = None
    # The GPU host stack (stages os_base, gpu_driver, container_runtime). Every outside URL is data: a site
    # mirror replaces it; nothing is downloaded from anywhere not named here.
    gpu_stack: bool = True  # False: the driver, Docker and toolkit are someone else's job (checked, not installed)
    driver_branch: str = Field("580", pattern=r"^[0-9]{3}$")
    # One release of the branch (e.g. 580.159.04): installed with Fabric Manager at the same version; changing
    # it is a driver upgrade (`modelfleet upgrade` drains, installs, reboots and gates one batch at a time).
    driver_version: str | None = Field(None, pattern=r"^[0-9]{3}\.[0-9]{2,3}(\.[0-9]{2})?$")
    driver_flavor: Literal["open", "proprietary"] = "open"  # open kernel modules are NVIDIA's default since R560
    driver_allow_downgrade: bool = False  # a loaded driver newer than the branch is refused unless this is set
    driver_pinning: bool = True  # NVIDIA's nvidia-driver-pinning-<branch> package; False: apt-mark hold
    # e.g. "13-0" installs cuda-toolkit-13-0 (the engine images bring their own)
    cuda_toolkit: Annotated[str, Field(pattern=r"^[0-9]{1,2}-[0-9]{1,2}$")] | None = None
    reboot: bool = True  # False (`--data reboot=false`): record "reboot pending" instead of rebooting
    # https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/ (network repository, cuda-keyring)
    nvidia_repo_url: Url = "https://developer.download.nvidia.com/compute/cuda/repos"
    # https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html
    container_toolkit_repo_url: Url = "https://nvidia.github.io/libnvidia-container/stable/deb"
    container_toolkit_key_url: Url = "https://nvidia.github.io/libnvidia-container/gpgkey"
    docker_source: Literal["docker", "distro"] = "docker"  # Docker's repository (docker-ce) or the distro's docker.io
    docker_repo_url: Url = "https://download.docker.com/linux"  # https://docs.docker.com/engine/install/ubuntu/
    # https://rocm.docs.amd.com/projects/install-on-linux/ (amdgpu-install, then amdgpu-dkms and rocm)
    amd_repo_url: Url = "https://repo.radeon.com"
    rocm_version: str = Field("7.0", pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$")
    # amdgpu-install_<build>_all.deb for rocm_version
    amdgpu_install_build: str = Field("7.0.70000-1", pattern=r"^[0-9][0-9.]*-[0-9]+$")
    gpu_check_image: Image | None = None  # default: GPU_CHECK_IMAGES for the host's vendor
    service_user: str = Field("root", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")  # added to render/video on AMD hosts


