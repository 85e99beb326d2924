"""The typed plans stages read: what a resolved host and service are called on the host, where their files sit,
what a commit changes, where their defaults come from, and how errors are reported."""

from dataclasses import replace

import pytest

from modelfleet.plan.inventory import resolve
from modelfleet.plan.inventory.plan import InventoryError, RouterPlan, StackPlan
from modelfleet.plan.inventory.schema import HostData
from tests.helpers.recipe_pools import PIN, pool

TINY = {"hardware": "h200", "gpu_count": 2, "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm"}


def hosts(*entries):
    result = resolve(list(entries))
    assert result.errors == []
    return result


def test_a_replica_is_named_after_what_it_serves_and_a_pool_after_itself():
    result = hosts(("h1", TINY), ("h2", {**TINY, "pool": "lab"}))
    replica, pooled = result.hosts["h1"].services[0], result.hosts["h2"].services[0]
    assert (replica.unit_name, replica.legacy_unit_name) == ("modelfleet-tiny-lab.service", "modelfleet-h1.service")
    assert (pooled.unit_name, pooled.legacy_unit_name) == ("modelfleet-lab.service", None)
    assert (replica.container_name, pooled.container_name) == ("modelfleet-h1-h1", "modelfleet-lab-h2")
    assert (pooled.env_file, pooled.secrets_config_file, pooled.auth_file) == (
        "/etc/modelfleet/lab.env", "/etc/modelfleet/lab.secrets.yaml", "/etc/modelfleet/lab.auth")
    assert sorted(result.pools) == ["h1", "lab"] and result.pools["lab"].hosts == ["h2"]


def test_files_follow_the_hosts_config_dir():
    svc = hosts(("h1", {**TINY, "pool": "lab", "config_dir": "/opt/mf"})).hosts["h1"].services[0]
    assert (svc.config_dir, svc.env_file, svc.auth_file) == ("/opt/mf", "/opt/mf/lab.env", "/opt/mf/lab.auth")


@pytest.mark.parametrize("address, loopback", [("127.0.0.1", True), ("::1", True), ("localhost", True),
                                               ("0.0.0.0", False), ("10.0.0.5", False)])
def test_a_service_on_loopback_is_told_apart(address, loopback):
    # (the resolver refuses an engine off loopback without a front door: the plan alone decides here)
    svc = replace(hosts(("h1", TINY)).hosts["h1"].services[0], bind_address=address)
    assert svc.loopback is loopback
    assert svc.base_url == (f"http://[{address}]:8000" if ":" in address else f"http://{address}:8000")


def test_a_commit_gives_the_service_its_own_model_directory_beside_the_others():
    svc = hosts(("h1", TINY)).hosts["h1"].services[0]
    assert svc.model_dir == "/srv/models/tiny-lab/main"
    pinned = svc.at_commit(PIN)
    assert (pinned.revision, pinned.model_dir, pinned.model_file) == (PIN, f"/srv/models/tiny-lab/{PIN}", None)
    assert pinned.at_commit("d" * 40, model_file="a.gguf").model_dir == "/srv/models/tiny-lab/" + "d" * 40
    assert replace(pinned, revision=svc.revision, model_dir=svc.model_dir) == svc  # nothing else changed


def test_a_gguf_recipe_fetches_its_quantization_from_the_gguf_repository():
    tiny = hosts(("h1", TINY)).hosts["h1"].services[0]
    assert (tiny.hf_repo, tiny.checkpoint_patterns) == ("modelfleet/tiny-lab", ())
    gguf = pool("kimi-k3-llamacpp-ud-iq1-m", "h200").hosts["n0"].services[0]
    assert gguf.hf_repo == gguf.model.gguf["repo"] != gguf.model.hf_repo
    assert gguf.checkpoint_patterns == ("UD-IQ1_M/*",)


def test_unset_settings_take_the_schemas_defaults_and_services_their_hosts_driver_branch():
    plan = hosts(("h1", TINY)).hosts["h1"]
    for name in ("model_keep_revisions", "model_fanout_width", "admission_valid_h", "unit_dropins", "ssh_port"):
        assert getattr(plan, name) == HostData.model_fields[name].default, name
    assert plan.nvme_devices == tuple(HostData.model_fields["nvme_devices"].default)  # lists held as tuples
    assert all(s.driver_branch == plan.stack.driver_branch != "" for s in plan.services)
    other = hosts(("h1", {**TINY, "driver_branch": "575"})).hosts["h1"]
    assert [s.driver_branch for s in other.services] == ["575"]
    assert set(StackPlan.__dataclass_fields__) - {"manage"} <= set(HostData.model_fields)


def test_a_front_doors_ports_and_url():
    door = RouterPlan(name="tiny", host="h1", engine_name="vllm", served_name="tiny-lab", bind_address="::1",
                      port=9000, policy="round_robin", api_key_env="KEY", config_dir="/etc/modelfleet", workers=())
    assert (door.backend_port, door.metrics_port, door.base_url) == (9001, 9002, "http://[::1]:9000")
    assert (door.unit_name, door.proxy_unit_name) == ("modelfleet-router-tiny.service",
                                                      "modelfleet-door-tiny.service")
    assert replace(door, bind_address="10.0.0.1").base_url == "http://10.0.0.1:9000"


def test_errors_are_reported_by_where_they_were_found():
    result = resolve([("h1", {**TINY, "model": "qwen3-9b", "gpu_count": "x"}), ("h2", {**TINY, "gpu_count": "y"})])
    assert [where for where, _, _ in result.errors][-1] == "host h2" and len(result.errors) >= 2
    report = result.error_report()
    assert report.startswith("host h1:\n  ") and "\nhost h2:\n  gpu_count: " in report
    assert report.count("host h1:") == 1 and report.count("host h2:") == 1
    assert result.error_lines()[-1].startswith("host h2: gpu_count: ")
    only = result.error_report([("pool p", "gpus", "too many")])
    assert only == "pool p:\n  gpus: too many"
    assert str(InventoryError(result.errors)) == "\n".join(result.error_lines())


def test_the_gpu_stack_is_ours_only_where_it_is_on_and_there_are_gpus_to_drive():
    gpu = {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm", "revision": PIN}
    cpu = {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm"}
    result = resolve([("ours", gpu), ("theirs", {**gpu, "gpu_stack": False}), ("none", cpu),
                      ("none-on", {**cpu, "gpu_stack": True})], offline=True)
    assert result.errors == []
    assert {name: plan.stack_ours for name, plan in result.hosts.items()} == {
        "ours": True, "theirs": False, "none": False, "none-on": False}


def test_no_module_decides_whose_stack_it_is_but_the_plan():
    # `stack.manage` beside the vendor "none" is stack_ours' rule: written anywhere else it can drift.
    import re

    from modelfleet import PACKAGE_DIR

    rule = re.compile(r"stack\.manage (and|or) [\w.]*vendor [!=]= \"none\"")
    assert [str(p.relative_to(PACKAGE_DIR)) for p in PACKAGE_DIR.rglob("*.py") if rule.search(p.read_text())] == [
        "plan/inventory/plan.py"]
