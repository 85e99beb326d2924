"""No setting vanishes (issue 50, item 4): every setting that declares where it applies (NVIDIA hosts, AMD hosts,
hosts with GPUs, a service with a front door) is refused, naming host and field, where it cannot apply, and
taken where it can. The cases are made from the declarations, so a setting declared tomorrow is held too."""

import pytest

from modelfleet.plan.inventory import HostData, ServiceData, resolve
from modelfleet.plan.inventory.applies import SCOPES, scope_of

# A value other than the default for every declared setting (the test fails when a declaration has none).
SAMPLES = {
    "driver_branch": "590", "driver_version": "580.159.04", "driver_flavor": "proprietary",
    "driver_source": "ubuntu-signed", "driver_allow_downgrade": True, "driver_pinning": False,
    "cuda_toolkit": "13-0", "nvidia_repo_url": "https://mirror.site/cuda",
    "container_toolkit_repo_url": "https://mirror.site/nct", "container_toolkit_key_url": "https://mirror.site/k",
    "admission": False, "admission_valid_h": 48, "admission_h2d": True, "admission_dcgm_level": 1,
    "dcgm_exporter": True, "dcgm_exporter_image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.2-4.7.1-ubuntu24.04",
    "rocm_version": "7.1", "amdgpu_install_build": "7.1.70100-1", "amd_repo_url": "https://mirror.site/amd",
    "service_user": "svc", "gpu_count": 1, "gpu_passthrough": False, "gpu_check_image": "ubuntu:24.04",
    "router_port": 9000, "router_bind_address": "10.0.0.5", "router_client_keys_env": ["CLIENT_KEY"],
    "router_tls_cert": "/etc/door.crt", "router_tls_key": "/etc/door.key", "router_policy": "random",
    "router_server_name": "door.example.com",
    "hf_token_env": "SITE_HF_TOKEN", "insecure_http_hosts": ["hub.site"], "host_ram_gib": 512,
    "hf_endpoint": "https://hub.site", "model_source": "https://mirror.site/m", "model_keep_revisions": 2,
    "model_reverify": True, "model_fanout_width": 4, "model_fanout": "tree", "model_fanout_rate_mb_s": 100,
    "model_stall_s": 120, "assess_models": ["qwen3-8b"],
    "router_pip_index_url": "https://pypi.site/simple", "router_worker_firewall": False,
}
DECLARED = {name: scope_of(model, name) for model in (HostData, ServiceData) for name in model.model_fields
            if scope_of(model, name)}
STRICT = {"router_worker_firewall"}  # off is what it asks for: refused where it cannot apply

NVIDIA = {"ssh_hostname": "10.0.0.1", "hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm"}
AMD = {"ssh_hostname": "10.0.0.2", "hardware": "mi355x", "model": "kimi-k3", "engine": "sglang", "revision": "c" * 40,
       "recipe_params": {"mamba_full_memory_ratio": 0.5}}
REPLICA = {"ssh_hostname": "10.0.0.4", "hardware": "lab-cpu", "model": "tiny-lab", "engine": "sglang",
           "recipe": "tiny-lab-sglang", "router": "gw", "api_key_env": "MF_APPLIES_KEY"}
# A vLLM replica behind its own host's front door (vLLM's router checks no key: an nginx door before it).
VLLM_DOOR = {"ssh_hostname": "10.0.0.6", "hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm",
             "recipe": "tiny-lab-vllm", "router": "v1", "router_bind_address": "127.0.0.1", "served_name": "tiny-v",
             "api_key_env": "MF_APPLIES_KEY"}


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("MF_APPLIES_KEY", "applies-key-0123456")
    monkeypatch.setenv("CLIENT_KEY", "client-key-0123456")


def unused(result, host: str) -> set[str]:
    return {f for w, f, m in result.errors if w == f"host {host}" and " applies only to " in m}


def test_every_declared_setting_has_a_sample_and_a_known_scope():
    assert set(DECLARED) == set(SAMPLES)
    assert set(DECLARED.values()) <= set(SCOPES)
    # The cases are declared, not special-cased.
    assert {DECLARED[k] for k in ("cuda_toolkit", "admission_dcgm_level", "dcgm_exporter", "driver_source")} == {
        "nvidia"}
    assert {DECLARED[k] for k in ("router_tls_cert", "router_tls_key", "router_client_keys_env", "router_port")} == {
        "router"}


def _fleet(where: str, name: str, value) -> list:
    gw = ("gw", {"router_only": True, "ssh_hostname": "10.0.0.3"})
    hosts = {"nvidia": ("n1", dict(NVIDIA)), "amd": ("m1", dict(AMD)), "router_only": gw,
             "replica": ("r1", dict(REPLICA)), "vllm_door": ("v1", dict(VLLM_DOOR))}
    hosts[where][1][name] = value
    return list(hosts.values())


WHERE_NOT = {"nvidia": ["amd", "router_only"], "amd": ["nvidia", "router_only"], "gpu": ["router_only"],
             "router": ["nvidia"], "model": ["router_only"], "front_door": ["nvidia", "replica"],
             "open_router": ["nvidia", "router_only"]}  # gw's front door is SGLang's, whose router checks keys
WHERE_YES = {"nvidia": "nvidia", "amd": "amd", "gpu": "nvidia", "router": "replica", "model": "nvidia",
             "front_door": "router_only", "open_router": "vllm_door"}
HOST_OF = {"nvidia": "n1", "amd": "m1", "router_only": "gw", "replica": "r1", "vllm_door": "v1"}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_setting_where_it_cannot_apply_is_refused_naming_host_and_field(name):
    scope = DECLARED[name]
    for where in WHERE_NOT[scope]:
        result = resolve(_fleet(where, name, SAMPLES[name]))
        if not SAMPLES[name] and name not in STRICT:  # turning off what the host does not have asks for nothing
            assert name not in unused(result, HOST_OF[where]), (name, where, result.errors)
            continue
        assert name in unused(result, HOST_OF[where]), (name, where, result.errors)
        message = next(m for w, f, m in result.errors if f == name and " applies only to " in m)
        assert SCOPES[scope] in message
    result = resolve(_fleet(WHERE_YES[scope], name, SAMPLES[name]))
    assert name not in unused(result, HOST_OF[WHERE_YES[scope]]), (name, result.errors)


def test_the_default_written_out_is_not_refused():
    result = resolve(_fleet("amd", "dcgm_exporter", False) + [("n2", {**NVIDIA, "ssh_hostname": "10.0.0.9",
                                                                        "router_policy": "cache_aware"})])
    assert unused(result, "m1") == set() and unused(result, "n2") == set()


def test_a_fleet_wide_value_is_a_warning_on_the_hosts_it_cannot_apply_to(tmp_path):
    """`--data dcgm_exporter=true` (or group_data/all.py) on a mixed fleet is meant for the NVIDIA hosts: the
    AMD host's is a warning (`--strict` refuses it); the same value in the AMD host's own data is an error."""
    from modelfleet.plan.inventory.door import open_inventory

    inv = tmp_path / "inv.py"
    inv.write_text(f"nvidia = [('n1', {NVIDIA!r})]\namd = [('m1', {AMD!r})]\n")
    result = open_inventory(str(inv), data={"dcgm_exporter": True})
    assert unused(result, "m1") == set()
    assert [(w, f) for w, f, m in result.warnings if f == "dcgm_exporter"] == [("host m1", "dcgm_exporter")]
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "amd.py").write_text("cuda_toolkit = '13-0'\n")
    result = open_inventory(str(inv), cwd=str(tmp_path))
    assert unused(result, "m1") == {"cuda_toolkit"}
    assert "group_data/amd.py)" in next(m for w, f, m in result.errors if f == "cuda_toolkit")


@pytest.mark.parametrize("engine_recipe,spelling", [
    (("kimi-k2-thinking-vllm-h200", "h200"), ["--load_format", "safetensors"]),
    (("kimi-k2-thinking-vllm-h200", "h200"), ["--load-format=safetensors"]),
    (("kimi-k2-thinking-vllm-h200", "h200"), ["--load_format=safetensors"]),
    (("kimi-k2-thinking-vllm-h200", "h200"), ["--model-loader-extra-config.socket_dir=/tmp/x"]),
    (("kimi-k3-sglang-b300", "b300"), ["--weight-cache-mode=off"]),
])
def test_weight_cache_beside_its_own_flag_in_any_spelling_the_engine_reads_is_refused(engine_recipe, spelling):
    """`--load_format` is vLLM's `--load-format`: beside `weight_cache` (whose client sets it) the engine would
    load the weights twice per GPU; refused as the written spelling was."""
    from tests.helpers.recipe_pools import pool

    result = pool(*engine_recipe, weight_cache=True, extra_args=spelling)
    assert ("host n0", "weight_cache") in [(w, f) for w, f, _ in result.errors], (spelling, result.errors)


@pytest.mark.parametrize("name,value", [("engine", "vllm"), ("port", 8123), ("extra_args", ["--seed", "1"]),
                                        ("router", "gw"), ("weight_cache", True), ("gpus", 1)])
def test_a_service_setting_on_a_router_only_host_is_refused(name, value):
    result = resolve(_fleet("router_only", name, value))
    assert name in unused(result, "gw"), result.errors
    assert "router_only (it serves no model)" in next(m for w, f, m in result.errors if f == name)


def test_trust_remote_code_on_gguf_weights_is_refused():
    """llama.cpp reads GGUF weights and runs no checkpoint code: the setting would vanish."""
    from tests.helpers.recipe_pools import pool

    result = pool("kimi-k3-llamacpp-ud-iq1-m", "h200", trust_remote_code=True)
    assert [(w, f) for w, f, _ in result.errors] == [("host n0", "trust_remote_code")], result.errors
    assert pool("kimi-k3-llamacpp-ud-iq1-m", "h200", trust_remote_code=False).errors == []


@pytest.fixture
def pyinfra_run(tmp_path, monkeypatch):
    """`pyinfra INV ... --data dcgm_exporter=true` on an NVIDIA and an AMD host: (door, the invocation, the host
    data pyinfra merges)."""
    from modelfleet.base.loader import read_inventory
    from modelfleet.plan.inventory import door

    inv = tmp_path / "inv.py"
    inv.write_text(f"nvidia = [('n1', {NVIDIA!r})]\namd = [('m1', {AMD!r})]\n")
    run = {"inventory": str(inv), "cwd": str(tmp_path), "group_data": (), "data": {"dcgm_exporter": True}}
    monkeypatch.setattr(door, "invocation", lambda: run)
    monkeypatch.setattr(door, "_guarded", {})
    monkeypatch.setattr(door.masking, "install", lambda: None)
    return door, run, read_inventory(str(inv), cwd=str(tmp_path), override_data=run["data"]).entries


def test_the_runs_own_resolution_judges_a_fleet_wide_value_as_validate_did(pyinfra_run):
    """Inside `pyinfra INV ... --data dcgm_exporter=true`, the run resolves pyinfra's merged data (where the value
    came from is lost there): the guard's sources keep it a warning on the AMD host, not a failure mid-run."""
    door, _, entries = pyinfra_run
    assert "dcgm_exporter" in unused(door.for_run(entries), "m1")  # nothing to tell where it came from
    door.guard()  # passes: a warning
    result = door.for_run(entries)
    assert unused(result, "m1") == set() and ("host m1", "dcgm_exporter") in [(w, f) for w, f, _ in result.warnings]


def test_the_guards_resolution_is_the_runs_where_pyinfra_merged_the_same_data(pyinfra_run, monkeypatch):
    """The inventory is resolved once per run: the guard's result is the run's; data pyinfra merged otherwise
    (a host's value it changed) is resolved again, with the guard's sources."""
    door, run, entries = pyinfra_run
    door.guard()
    resolves = []
    real = door.resolve
    monkeypatch.setattr(door, "resolve", lambda *a, **k: resolves.append(a) or real(*a, **k))
    guarded = door._guarded[door._key(run)]
    assert door.for_run(entries) is guarded and resolves == []
    changed = [(name, {**data, "model_keep_revisions": 3}) for name, data in entries]
    again = door.for_run(changed)
    assert len(resolves) == 1 and again is not guarded and again.warnings == guarded.warnings


def test_a_fleet_wide_router_index_is_a_warning_on_the_hosts_without_a_front_door(tmp_path):
    """`--data router_pip_index_url=...` is meant for the front doors' hosts: a warning on the others; the same
    value in a host's own data where it runs no front door is refused, naming host and field."""
    from modelfleet.plan.inventory.door import open_inventory

    inv = tmp_path / "inv.py"
    gw = {"router_only": True, "ssh_hostname": "10.0.0.3"}
    inv.write_text(f"hosts = [('gw', {gw!r}), ('r1', {REPLICA!r})]\n")
    result = open_inventory(str(inv), data={"router_pip_index_url": "https://pypi.site/simple"})
    assert result.errors == [] and [(w, f) for w, f, _ in result.warnings if f.startswith("router")] == [
        ("host r1", "router_pip_index_url")]
    inv.write_text(f"hosts = [('gw', {gw!r}), ('r1', {{**{REPLICA!r}, 'router_pip_index_url': 'https://x.site/s'}})]\n")
    assert unused(open_inventory(str(inv)), "r1") == {"router_pip_index_url"}
