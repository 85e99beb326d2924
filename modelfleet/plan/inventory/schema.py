"""The inventory's schema: what host data, group_data and `services` entries may say, field by field, each
value held to its grammar (modelfleet.base.grammar). Unknown keys are refused by the resolver, with a suggestion."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from modelfleet.base import grammar
from modelfleet.plan import trust

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
HUB_ENDPOINT = "https://huggingface.co"


_fits = grammar.checked  # a pydantic validator from a grammar rule (the value is never echoed)


def _each(rule):
    return _fits(lambda values: next((f"entry {i + 1} {r}" for i, v in enumerate(values) if (r := rule(v))), None))


def _unique(values):
    return None if len(set(values)) == len(values) else "lists the same entry twice"


def _url(value: str) -> str | None:
    if grammar.no_control(value) or " " in value:
        return "may not contain spaces or control characters"
    if not re.match(r"^(https?|file)://[^\s]+$", value):
        return "is not an http(s):// or file:// URL"
    if value.startswith("file://") and not value.startswith("file:///"):
        return "is a file:// URL without an absolute path (file://x/y names the host x): write file:///srv/mirror"
    return None


def _index_url(value: str) -> str | None:
    """A package index for pip: a URL whose user and password would land in a command line are refused."""
    return _url(value) or ("may not carry a user or password (they would be in pip's command line): put them in "
                           "the host's pip.conf or ~/.netrc" if "@" in value.split("://", 1)[-1].split("/", 1)[0]
                           else None)


def _registry(value: str) -> str | None:
    if grammar.no_control(value):
        return grammar.no_control(value)
    if not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*/?", value):
        return "is not a registry prefix (host[:port][/path])"
    host = value.split("/", 1)[0]
    if "." not in host and ":" not in host and host != "localhost":
        return f"starts with {host!r}, which docker reads as a Docker Hub namespace, not a registry: name the " \
               "registry's host (with a dot or a port, or localhost)"
    return None


def _host_name(value: str) -> str | None:
    """A host of the inventory, as pyinfra names it (`@local`, `@fake/x` for connectors)."""
    return grammar.host_address(value.lstrip("@").replace("/", "."))


def _http_host(value: str) -> str | None:
    """host[:port], an IPv4 address[:port], an IPv6 address, or [IPv6][:port]."""
    if grammar.no_control(value):
        return grammar.no_control(value)
    host, port = value, None
    if value.startswith("["):
        host, closed, rest = value[1:].partition("]")
        if not closed or grammar.address(host) or ":" not in host or (rest and not re.fullmatch(r":[0-9]{1,5}", rest)):
            return "is not [IPv6 address] or [IPv6 address]:port"
        port = rest[1:] or None
    elif value.count(":") > 1:
        return None if grammar.address(value) is None else "is neither host[:port] nor an IPv6 address"
    elif ":" in value:
        host, port = value.split(":")
        if not re.fullmatch(r"[0-9]{1,5}", port):
            return "has a port that is not a number"
    if port is not None and not 1 <= int(port) <= 65535:
        return "has a port outside 1-65535"
    return grammar.host_address(host)


def _bind(value: str) -> str | None:
    return None if value == "localhost" else grammar.address(value)


# Where a setting can apply (its `json_schema_extra`): the resolver refuses a value other than the default on a
# host or service where it cannot (modelfleet.plan.inventory.applies), so no setting vanishes in silence.
# `strict`: turning it off counts as asking too (a defence turned off where it is not is meant for another host).
def applies(scope: str, strict: bool = False) -> dict[str, str | bool]:
    return {"applies": scope, **({"strict": True} if strict else {})}


Name = Annotated[str, _fits(grammar.name)]
Port = Annotated[int, Field(ge=1, le=65535)]
SecretVar = Annotated[str, _fits(grammar.secret_variable)]
Image = Annotated[str, _fits(grammar.image)]
Url = Annotated[str, _fits(_url)]
OwnedDir = Annotated[str, _fits(grammar.owned_directory)]


class ServiceData(BaseModel):
    """What an inventory may say about one served model on a host (all optional until resolved)."""

    model_config = ConfigDict(extra="forbid", strict=True)  # strict: no `True` as a port or a count
    pool: Name | None = Field(None, description="Hosts naming the same pool serve one model together (host order "
                              "is rank order); unset: a pool of its own per host, named after the host.")
    model: Name | None = Field(None, description="Catalog model id to serve, e.g. `kimi-k3.1-pro` (required).")
    engine: Name | None = Field(None, description="`vllm`, `sglang`, `llama.cpp`, `tokenspeed` or `ollama` "
                                "(required).")
    recipe: Name | None = Field(None, description="Catalog or site recipe id; unset: the one recipe for this "
                                "model, engine and hardware (an error if there are several).")
    gpus: Annotated[int, Field(ge=1, le=72)] | None = Field(None, description="GPUs this service uses on each host; "
                                                     "unset: the recipe's gpus_per_node.")
    served_name: Annotated[str, _fits(grammar.served_name)] | None = Field(
        None, description="Model name clients call; unset: the catalog model id.")
    port: Port | None = Field(None, description="Endpoint port; unset: the engine's default (vLLM 8000, SGLang "
                              "30000, llama.cpp 8080, TokenSpeed 8000 with its control server on the next port, "
                              "Ollama 11434).")
    bind_address: Annotated[str, _fits(_bind)] = Field(
        "127.0.0.1", description="Address the endpoint listens on; off loopback only with `api_key_env`, and "
        "never for vLLM (its key leaves inference routes open); TokenSpeed and Ollama (no key of their own) then "
        "listen on loopback behind a keyed proxy on this address.")
    api_key_env: SecretVar | None = Field(None, description="Name of the control-node variable holding the API "
                                          "key (reaches the host only in a 0600 file); unset: no key.")
    revision: Annotated[str, _fits(grammar.revision)] | None = Field(
        None, description="Hub branch, tag or 40-hex commit (a commit is required with trust_remote_code); "
        "unset: `main`.")
    trust_remote_code: bool | None = Field(None, description="Run the checkpoint's own Python code; unset: what "
                                           "the catalog model says.")
    image: Image | None = Field(None, description="Engine image (tag or `@sha256:` digest), through "
                                "`image_registry`; unset: the recipe's image.")
    extra_args: Annotated[list[str], _each(grammar.no_control)] = Field(
        [], description="More engine flags after the recipe's (flags modelfleet or the recipe set are refused).")
    env: dict[Annotated[str, _fits(grammar.env_entry)], Annotated[str, _fits(grammar.env_value)]] = Field(
        {}, description="Environment for the engine container, over the recipe's and the network settings.")
    checkpoint_group: Name | None = Field(None, description="Hosts that copy the checkpoint from each other (one "
                                          "hub download per group); unset: the pool.")
    weight_cache: bool = Field(False, description="Keep the loaded weights in a cache unit beside the engine "
                               "(`modelfleet-<pool>-weights.service`), so an engine restart, an image-only "
                               "upgrade or a drain/undrain maps them instead of loading them (docs/restart-tier.md); "
                               "only where the recipe's engine version has one (vLLM, SGLang).")
    engine_cache_sharing: bool = Field(True, description="Whether this service's engine cache is copied between "
                                       "hosts with the same cache key (code one host's engine wrote, another's "
                                       "runs; docs/engine-caches.md); false: each host compiles its own.")
    netcheck_min_busbw_gbps: Annotated[float, Field(gt=0, le=10000)] | None = Field(
        None, description="Gate threshold on all_reduce busbw at the largest size, GB/s; unset: the hardware "
        "catalog's (none for multi-node pools: checked for correctness only).")
    netcheck_timeout_s: int = Field(120, ge=5, le=3600, description="Seconds a gate rank waits for the others "
                                    "to join.")
    gpu_indices: Annotated[list[Annotated[int, Field(ge=0, le=71)]], _fits(_unique)] | None = Field(
        None, description="Which of the host's GPUs (nvidia-smi indices); unset: the lowest free ones, in "
        "service order.")
    router: Annotated[str, _fits(_host_name)] | None = Field(
        None, description="Host of this inventory that runs the model's front door (the "
                                "engine's own router, with `api_key_env` on every route); the replicas naming it "
                                "then listen on their fabric address, for the router only. Unset: no router.")
    router_port: Port = Field(8800, description="Port of the front door on `router_bind_address` (the router "
                              "host also uses the next two ports on loopback: the router behind a proxy, its "
                              "metrics).", json_schema_extra=applies("router"))
    router_bind_address: Annotated[str, _fits(grammar.address)] | None = Field(
        None, description="Address the front door listens on, where clients reach it; unset: the router host's "
        "SSH address.", json_schema_extra=applies("router"))
    router_server_name: Annotated[str, _fits(grammar.host_address)] | None = Field(
        None, description="The name clients use for the front door (`https://<name>:<port>/v1`, what `show` and "
        "`validate` print); with TLS the certificate's names must cover it and the verify gate checks it. Unset: "
        "the front door's address.", json_schema_extra=applies("router"))
    router_client_keys_env: list[SecretVar] | None = Field(
        None, description="Names of control-node variables, each holding a key the front door accepts from "
        "clients (an old and a new key overlap while clients move); the front door then reaches the replicas with "
        "`api_key_env`'s key, which clients never see (list `api_key_env` itself too while clients move off it). "
        "Unset: clients use `api_key_env`'s key.", json_schema_extra=applies("router"))
    router_tls_cert: Annotated[str, _fits(grammar.no_control)] | None = Field(
        None, description="The front door's TLS certificate chain (PEM), a file on the control node, with "
        "`router_tls_key`; unset: the front door speaks plain HTTP.", json_schema_extra=applies("router"))
    router_tls_key: Annotated[str, _fits(grammar.no_control)] | None = Field(
        None, description="The private key (PEM) of `router_tls_cert`, a file on the control node; the router "
        "host gets it as a 0600 file.", json_schema_extra=applies("router"))
    router_policy: Literal["random", "round_robin", "cache_aware", "power_of_two"] = Field(
        "cache_aware", description="How the router picks a replica for each request (both routers' names).",
        json_schema_extra=applies("router"))
    recipe_params: dict[Name, Annotated[float | int | str, _fits(grammar.flag_value)]] = Field(
        {}, description="Values for the recipe's required parameters (e.g. SGLang's `mamba_full_memory_ratio` "
        "for Kimi K3).")
    runtime: Literal["container", "venv"] | None = Field(
        None, description="`container` (the recipe's image) or `venv` (the engine installed from `venv_lock` "
        "into a virtual environment on the host, docs/venv.md); unset: the recipe's.")
    venv_lock: Annotated[str, _fits(grammar.no_control)] | None = Field(
        None, description="runtime venv: the lock on the control node, every requirement pinned with "
        "`--hash=sha256:` (pip installs it with --require-hashes); another lock is another venv.")
    venv_wheelhouse: Annotated[str, _fits(grammar.no_control)] | None = Field(
        None, description="runtime venv: a control-node directory holding every file the lock names, pushed "
        "to the host (air-gapped sites); unset: the host installs from `venv_index_url`.")
    venv_index_url: Url | None = Field(
        None, description="runtime venv: the package index the host installs from; unset (and no wheelhouse): "
        "the host's own pip settings.")
    venv_python: Annotated[str, _fits(grammar.no_control)] = Field(
        "python3", pattern=r"^(/[A-Za-z0-9._/-]+/)?python3(\.[0-9]+)?$",
        description="runtime venv: the host's interpreter that makes the venv (a name on PATH or an absolute "
        "path, e.g. python3.12); the system's own packages are never touched.")


# The keys a host, its group or a `services` entry may set for a service.
SERVICE_KEYS = tuple(ServiceData.model_fields)


class HostData(BaseModel):
    """Host-level settings; `services` (or the top-level service keys) say what the host serves."""

    # Unknown keys are refused by `resolve` (with a suggestion); pyinfra's own keys (ssh_*, _sudo, ...) pass.
    model_config = ConfigDict(extra="ignore", strict=True)
    hardware: Name | None = Field(None, description="Catalog hardware id of the board, e.g. `b300`, `gb300`, "
                                  "`mi355x` (required).")
    gpu_count: Annotated[int, Field(ge=1, le=72)] | None = Field(None, description="GPUs the host has; unset: the "
                                                          "hardware catalog's GPUs per node.",
                                                          json_schema_extra=applies("gpu"))
    ssh_hostname: Annotated[str, _fits(grammar.host_address)] | None = Field(
        None, description="pyinfra's own: the address to SSH to; unset: the inventory's host name.")
    ssh_port: Port = Field(22, description="pyinfra's own: the SSH port (an engine may not take it).")
    ssh_user: Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_.-]{0,31}$")] | None = Field(
        None, description="pyinfra's own: the SSH user; unset: pyinfra's default.")
    ssh_key: Annotated[str, _fits(grammar.single_line)] | None = Field(
        None, description="pyinfra's own: private key file; unset: the SSH agent and "
        "default keys.")
    ssh_known_hosts_file: Annotated[str, _fits(grammar.single_line)] | None = Field(
        None, description="pyinfra's own: known-hosts file, also used by "
        "status, logs, tunnel and upgrade; unset: `~/.ssh/known_hosts`.")
    ssh_strict_host_key_checking: Literal["yes", "accept-new", "no", "off"] | None = Field(
        None, description="pyinfra's own; status, logs, tunnel and upgrade honour it too (unset: unknown host "
        "keys refused).")
    model_root: OwnedDir = Field("/srv/models", description="Where checkpoints live, "
                                 "`<model_root>/<model>/<commit>` (an NVMe mount with `nvme_devices`).")
    config_dir: OwnedDir = Field("/etc/modelfleet", description="Env and secret files (0700 directory, 0600 "
                                 "files).")
    hf_token_env: SecretVar = Field("HF_TOKEN", description="Name of the control-node variable holding the hub "
                                    "token (reaches only the downloading host, in a 0600 file).",
                                    json_schema_extra=applies("model"))
    image_registry: Annotated[str, _fits(_registry)] | None = Field(
        None, description="Registry prefix put before every image (site mirror, lab registry); unset: images "
        "as named.")
    insecure_registries: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9.-]+(:[0-9]+)?$")]] = Field(
        [], description="Registries (host[:port], as the images name them) the control node reaches over plain "
        "HTTP to pin digests, as Docker's insecure-registries (the hosts' dockerd must name them too); loopback "
        "always is.")
    insecure_http_hosts: list[Annotated[str, _fits(_http_host)]] = Field(
        [], description="Hosts (host[:port]) the hub token may reach over plain HTTP (`hf_endpoint`): a site's "
        "own network; loopback always may. Never for a model that runs its own code.",
        json_schema_extra=applies("model"))
    gpu_passthrough: bool = Field(True, description="Hand the service's GPUs to its container (NVIDIA: CDI "
                                  "devices; AMD: /dev/kfd and its render nodes); False: the container gets none.",
                                  json_schema_extra=applies("gpu"))
    router_only: bool = Field(False, description="The host runs only front doors (a service elsewhere names it "
                              "in `router`), no engine: no `services` nor `model`, `hardware` unset (the catalog's "
                              "`cpu` board, no GPUs) and no driver, checkpoint or engine image.")
    router_pip_index_url: Annotated[str, _fits(_index_url)] | None = Field(
        None, description="The package index (a PEP 503 simple URL, e.g. a site mirror; plain HTTP off loopback "
        "is trusted for it) or `file:///` folder of wheels on the host that this host's pip installs a front "
        "door's router and its dependencies from; each wheel's sha256 is checked against the catalog's lock all "
        "the same. Unset: PyPI.", json_schema_extra=applies("front_door"))
    router_worker_firewall: bool = Field(True, description="A front door whose router checks no key itself "
                                         "(vLLM's) gets an nftables rule, loaded by the router's unit, that lets "
                                         "only the door's and the router's users reach the router on loopback; "
                                         "false only where the host takes no nftables rules (a container without "
                                         "NET_ADMIN, as the lab's hosts): any local process then reaches it.",
                                         json_schema_extra=applies("open_router", strict=True))
    services: Annotated[list[dict[str, Any]], Field(min_length=1)] | None = Field(
        None, description="Several services on one host, each entry a set of service settings; unset: the "
        "host's own service settings are its one service.")
    assess_models: list[Name] = Field([], description="Catalog model ids preflight also reports on: would they "
                                      "fit the measured GPUs.", json_schema_extra=applies("gpu"))
    host_ram_gib: Annotated[int, Field(ge=1, le=65536)] | None = Field(
        None, description="Host RAM (GiB) that llama.cpp recipes keeping MoE experts in RAM may fill; the planner "
        "sizes them against it and preflight checks it against /proc/meminfo. Unset: the hardware catalog's "
        "typical figure for the board.", json_schema_extra=applies("model"))
    hf_endpoint: Url | None = Field(None, description="Hugging Face hub to fetch from; unset: the control "
                                    f"node's HF_ENDPOINT, else {HUB_ENDPOINT}.", json_schema_extra=applies("model"))
    model_source: Url | None = Field(None, description="Air-gapped sites: a mirror URL or file:// directory "
                                     "holding `<repo>/<commit>/` with its manifest, used instead of the hub.",
                                     json_schema_extra=applies("model"))
    model_keep_revisions: int = Field(1, ge=0, le=100, description="Older revisions kept on disk for rollback "
                                      "beside the served one.", json_schema_extra=applies("model"))
    model_reverify: bool = Field(False, description="Hash every file again instead of trusting the manifest's "
                                 "size + mtime.", json_schema_extra=applies("model"))
    # Hosts that got their copy serve the next wave (a tree), so a large group takes log(N) waves, not N.
    model_fanout_width: int = Field(8, ge=1, le=1024, description="Peers one host serves the checkpoint to at "
                                    "once (the group's first host's value counts for the group).",
                                    json_schema_extra=applies("model"))
    model_fanout: Literal["swarm", "tree"] = Field("swarm", description="How a group's hosts copy the checkpoint: "
                                                   "`swarm`, piece by piece from every peer at once, each serving "
                                                   "the pieces it verified while it receives; `tree`, whole copies "
                                                   "in waves of model_fanout_width (the group's first host's value "
                                                   "counts).", json_schema_extra=applies("model"))
    model_fanout_rate_mb_s: int | None = Field(None, ge=1, le=1_000_000, description="Cap on what a host serving "
                                               "peers sends in all, MB/s, leaving room for inference; unset: no cap.",
                                               json_schema_extra=applies("model"))
    model_stall_s: int = Field(60, ge=5, le=3600, description="Seconds a download or peer copy may go without "
                               "receiving a byte before it fails, naming host, source and file (other hosts go "
                               "on); a peer server with no request for twice as long ends.",
                               json_schema_extra=applies("model"))
    verify_bench: bool = Field(False, description="The verify stage also runs a short bench and fails on a "
                               "regression against the previous one.")
    verify_full: bool = Field(False, description="Smoke test and tool probe on every converge, not only when a "
                              "unit (re)started.")
    admission: bool = Field(True, description="False: the admission stage leaves this host's GPUs unjudged "
                            "(NVIDIA: nvidia-smi -q -x; AMD: amd-smi metric).", json_schema_extra=applies("gpu"))
    admission_valid_h: int = Field(24, ge=1, le=720, description="Hours an admission pass holds "
                                   "(reports/admission).", json_schema_extra=applies("gpu"))
    admission_h2d: bool = Field(False, description="Also time each GPU's pinned host <-> device copies when the "
                                "pool's gate runs, against the hardware catalog's h2d_min_gbps.",
                                json_schema_extra=applies("gpu"))
    admission_dcgm_level: int = Field(0, ge=0, le=4, description="DCGM diagnostic level when admission judges "
                                      "the host (`dcgmi diag -r N`; 0 off, 1 about a minute, 3-4 half an hour+).",
                                      json_schema_extra=applies("nvidia"))
    dcgm_exporter: bool = Field(False, description="Run a DCGM exporter unit on NVIDIA hosts (:9400 on the "
                                "fabric address).", json_schema_extra=applies("nvidia"))
    unit_dropins: Literal["remove", "keep"] = Field(
        "remove", description="Drop-ins and masks on the units modelfleet writes, which it did not write: removed "
        "(remove), or the site keeps its own and the host is refused, naming each file (keep).")
    # NVIDIA's tag from github.com/NVIDIA/dcgm-exporter's README quickstart (DCGM 4.4.2, exporter 4.7.1)
    dcgm_exporter_image: Image = Field("nvcr.io/nvidia/k8s/dcgm-exporter:4.4.2-4.7.1-ubuntu22.04",
                                       description="Image of the DCGM exporter unit.",
                                       json_schema_extra=applies("nvidia"))
    nvme_devices: Annotated[list[str], _each(lambda v: None if v == "auto" else grammar.device(v)),
                            _fits(_unique)] = Field(
        [], description="NVMe for model_root: device paths, or `[\"auto\"]` for every blank NVMe disk; several "
        "become one RAID0; empty: model_root is left as it is.")
    model_filesystem: Literal["xfs", "ext4"] = Field("xfs", description="Filesystem made on `nvme_devices`.")
    format_allow_serials: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")]] = Field(
        [], description="Serial numbers of devices that may be formatted although they hold a partition table, "
        "filesystem or RAID metadata.")
    # The pool network: the gate and the engine units get the same settings.
    fabric_address: Annotated[str, _fits(grammar.address)] | None = Field(
        None, description="The host's address on the pool network (rendezvous, peers); unset: the SSH address.")
    nccl_socket_ifname: Annotated[str, _fits(grammar.interfaces)] | None = Field(
        None, description="NCCL_SOCKET_IFNAME for the gate and the engines; unset: NCCL chooses.")
    gloo_socket_ifname: Annotated[str, _fits(grammar.interfaces)] | None = Field(
        None, description="GLOO_SOCKET_IFNAME for the gate and the engines; unset: Gloo chooses.")
    nccl_ib_hca: Annotated[str, _fits(grammar.ib_hca)] | None = Field(
        None, description="NCCL_IB_HCA (keep one order on every member); unset: NCCL chooses.")
    # The GPU host stack (stages os_base, gpu_driver, container_runtime). Every outside URL is data: a site
    # mirror replaces it; nothing is downloaded from anywhere not named here.
    gpu_stack: bool = Field(True, description="Install the driver, Fabric Manager, Docker and the toolkit; "
                            "False: someone else's job (checked, not installed).")
    driver_branch: str = Field("580", pattern=r"^[0-9]{3}$", description="NVIDIA driver branch installed and "
                               "held.", json_schema_extra=applies("nvidia"))
    # Changing it is a driver upgrade (`modelfleet upgrade` drains, installs, reboots and gates batch by batch).
    driver_version: str | None = Field(None, pattern=r"^[0-9]{3}\.[0-9]{2,3}(\.[0-9]{2})?$", description="One "
                                       "release of the branch (e.g. 580.159.04), Fabric Manager at the same "
                                       "version; unset: a loaded driver of the branch is kept, else the newest.",
                                       json_schema_extra=applies("nvidia"))
    driver_flavor: Literal["open", "proprietary"] = Field("open", description="Open kernel modules (NVIDIA's "
                                                          "default since R560) or the proprietary ones.",
                                                          json_schema_extra=applies("nvidia"))
    driver_source: Literal["auto", "cuda", "ubuntu-signed"] = Field(
        "auto", description="Where the NVIDIA kernel module comes from: `cuda` (the CUDA repository, built by "
        "DKMS), `ubuntu-signed` (Canonical's signed modules for the running kernel); `auto`: ubuntu-signed on "
        "Ubuntu with Secure Boot on and DKMS's key not enrolled, else cuda.", json_schema_extra=applies("nvidia"))
    driver_allow_downgrade: bool = Field(False, description="Accept replacing a loaded driver newer than the "
                                         "branch (refused otherwise).", json_schema_extra=applies("nvidia"))
    driver_pinning: bool = Field(True, description="Hold the branch with NVIDIA's "
                                 "nvidia-driver-pinning-<branch> package; False: `apt-mark hold`.",
                                 json_schema_extra=applies("nvidia"))
    cuda_toolkit: Annotated[str, Field(pattern=r"^[0-9]{1,2}-[0-9]{1,2}$")] | None = Field(
        None, description="e.g. `13-0` installs cuda-toolkit-13-0; unset: none (the engine images bring their "
        "own).", json_schema_extra=applies("nvidia"))
    reboot: bool = Field(True, description="Reboot when the driver's kernel module changed; False "
                         "(`--data reboot=false`): record \"reboot pending\" instead.")
    # https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/ (network repository, cuda-keyring)
    nvidia_repo_url: Url = Field("https://developer.download.nvidia.com/compute/cuda/repos",
                                 description="NVIDIA's CUDA network repository (cuda-keyring, driver, Fabric "
                                 "Manager), or a site mirror of it.", json_schema_extra=applies("nvidia"))
    # https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html
    container_toolkit_repo_url: Url = Field("https://nvidia.github.io/libnvidia-container/stable/deb",
                                            description="NVIDIA Container Toolkit repository, or a mirror.",
                                            json_schema_extra=applies("nvidia"))
    container_toolkit_key_url: Url = Field("https://nvidia.github.io/libnvidia-container/gpgkey",
                                           description="Signing key of the Container Toolkit repository.",
                                           json_schema_extra=applies("nvidia"))
    repo_key_fingerprints: dict[Literal[trust.REPOSITORIES],  # catalog/signing_keys.yaml's names
                                Annotated[list[Annotated[str, Field(pattern=r"^([0-9A-Fa-f]{40}|[0-9A-Fa-f]{64})$")]],
                                          Field(min_length=1)]] = Field(
        {}, description="A repository's signing key fingerprints (40 or 64 hex), for a site mirror that signs with "
        "its own key; unset: the catalog's (catalog/signing_keys.yaml). A key not pinned is refused on the host.")
    docker_source: Literal["docker", "distro"] = Field("docker", description="Docker's repository (docker-ce) "
                                                       "or the distribution's docker.io.")
    # https://docs.docker.com/engine/install/ubuntu/
    docker_repo_url: Url = Field("https://download.docker.com/linux", description="Docker's repository, or a "
                                 "mirror.")
    # https://rocm.docs.amd.com/projects/install-on-linux/ (amdgpu-install, then amdgpu-dkms and rocm)
    amd_repo_url: Url = Field("https://repo.radeon.com", description="AMD's repository (amdgpu-install, "
                              "amdgpu-dkms, rocm), or a mirror.", json_schema_extra=applies("amd"))
    rocm_version: str = Field("7.0", pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$", description="ROCm release "
                              "installed on AMD hosts.", json_schema_extra=applies("amd"))
    amdgpu_install_build: str = Field("7.0.70000-1", pattern=r"^[0-9][0-9.]*-[0-9]+$", description="Build of "
                                      "amdgpu-install_<build>_all.deb for rocm_version.",
                                      json_schema_extra=applies("amd"))
    gpu_check_image: Image | None = Field(None, description="Image that must see the host's GPUs after the "
                                          "stack; unset: NVIDIA's CUDA base image, Ubuntu's on AMD hosts.",
                                          json_schema_extra=applies("gpu"))
    service_user: str = Field("root", pattern=r"^[a-z_][a-z0-9_-]{0,31}$", description="User added to the "
                              "render and video groups on AMD hosts.", json_schema_extra=applies("amd"))


