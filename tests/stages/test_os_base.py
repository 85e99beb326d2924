"""os_base, the first part of the gpu_stack stage: the tools the repository steps use, and the running kernel's
headers only when gpu_driver is about to build a kernel module; nothing where the stack is not ours."""

from modelfleet.plan.inventory import resolve
from modelfleet.run.pipeline import run_stages
from modelfleet.run.stages import gpu_stack, os_base, preflight
from tests.helpers.fake_hosts import DF

HOST = {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm"}
KERNEL = {"kernel": "6.8.0-87-generic"}


def plan(**data):
    return resolve([("n1", {**HOST, **data})]).hosts["n1"]


def test_headers_only_when_a_module_is_built_for_a_known_kernel():
    assert list(os_base.base_packages(plan(), KERNEL)) == ["ca-certificates", "curl", "linux-headers-6.8.0-87-generic"]
    assert list(os_base.base_packages(plan(), KERNEL, builds_module=False)) == ["ca-certificates", "curl"]
    assert list(os_base.base_packages(plan(), {})) == ["ca-certificates", "curl"]


def test_nothing_where_the_stack_is_not_ours():
    assert os_base.base_packages(plan(gpu_stack=False), KERNEL) == {}
    assert os_base.wants(plan(gpu_stack=False), {"os": KERNEL}) == {"packages": []}


def test_its_packages_are_installed_before_any_other_part_on_a_bare_host(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    os_lines = fake.recorded(fake.H200 / "os-release.txt") + ["KERNEL_RELEASE=6.8.0-87-generic", "MACHINE_ARCH=x86_64"]
    host = {**HOST, "fake_responses": {"@@modelfleet-probe": fake.probe_reply({"os": os_lines, "disk": DF,
                                                                               "ports": []})}}
    state = fake.run_fake([("n1", host)], lambda: run_stages(preflight, gpu_stack), dry=True)
    steps = fake.planned(state, "n1")
    first = next(i for i, step in enumerate(steps) if " install " in step or step.startswith("curl "))
    assert "install ca-certificates curl linux-headers-6.8.0-87-generic" in steps[first], steps[first]
