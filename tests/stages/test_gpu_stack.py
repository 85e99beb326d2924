"""Stage gpu_stack through pyinfra's @fake connector: its three parts in order, decided before the first runs (a
refused host gets nothing from os_base either), one report of all three, a pending reboot stopping the serving
stages that follow (and only reported when nothing follows), and nothing at all where the stack is not ours."""

import json

import pytest

from modelfleet.plan.inventory import resolve
from modelfleet.run.pipeline import run_stages
from modelfleet.run.stages import gpu_stack, images, preflight
from tests.helpers.fake_hosts import DF

HOST = {"hardware": "h200", "gpu_count": 8, "model": "kimi-k2-thinking", "engine": "vllm", "pool": "p",
        "revision": "e" * 40, "image": "vllm/vllm-openai:v0.34.0@sha256:" + "f" * 64}


@pytest.fixture(autouse=True)
def reports(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    return tmp_path


def bare(fake, **data) -> dict:
    os_lines = fake.recorded(fake.H200 / "os-release.txt") + ["KERNEL_RELEASE=6.8.0-87-generic", "MACHINE_ARCH=x86_64"]
    return {**HOST, **data, "fake_responses": {"@@modelfleet-probe": fake.probe_reply({"os": os_lines, "disk": DF,
                                                                                        "ports": []})}}


def names(state) -> list[str]:
    return [sorted(state.get_op_meta(h).names)[0] for h in state.get_op_order()]


def test_the_parts_run_in_order_and_a_pending_reboot_stops_the_serving_stages(fake, reports):
    state = fake.run_fake([("n1", bare(fake, reboot=False))], lambda: run_stages(preflight, gpu_stack, images),
                          dry=True)
    ops = names(state)
    first = {part: next(i for i, n in enumerate(ops) if n.startswith(f"modelfleet {part.NAME} |"))
             for part in gpu_stack.PARTS}
    assert list(first) == sorted(first, key=first.get)  # os_base, gpu_driver, container_runtime
    assert ops[-1] == "Reboot pending" and "<refuse>" in fake.planned(state, "n1")
    assert not any(n.startswith("modelfleet images |") for n in ops)  # the serving stage never planned


def test_alone_a_pending_reboot_is_reported_not_refused(fake, reports):
    state = fake.run_fake([("n1", bare(fake, reboot=False))], lambda: run_stages(preflight, gpu_stack))
    assert "Reboot pending" not in names(state) and not state.failed_hosts
    report = json.loads((reports / "gpu_stack" / "_fake_n1.json").read_text())
    assert report["stages"] == ["preflight", "os_base", "gpu_driver", "container_runtime"]
    assert report["reboot"] == {"needed": True, "taken": False, "pending": True, "reason": report["reboot"]["reason"]}
    assert "nvidia-driver-580-open" in report["packages_installed"] and "docker-ce" in report["packages_installed"]
    assert "linux-headers-6.8.0-87-generic" in report["packages_installed"]  # os_base, for the driver's module


def test_a_host_the_driver_decision_refuses_gets_nothing_from_any_part(fake, reports):
    newer = fake.probe_reply({"os": fake.recorded(fake.H200 / "os-release.txt"), "disk": DF, "ports": [],
                              "nvidia_versions": ["DRIVER version      : 590.44.01", "CUDA Version        : 13.1"]})
    host = {**HOST, "fake_responses": {"@@modelfleet-probe": newer}}
    state = fake.run_fake([("n1", host)], lambda: run_stages(preflight, gpu_stack), dry=True)
    assert names(state) == ["GPU driver: refused"]


def test_a_stack_that_is_not_ours_gets_no_operation_no_report_and_the_run_goes_on(fake, reports):
    state = fake.run_fake([("n1", bare(fake, gpu_stack=False))], lambda: run_stages(gpu_stack, images), dry=True)
    ops = names(state)
    assert ops and all(n.startswith("modelfleet images |") for n in ops)
    assert gpu_stack.wants(resolve([("n1", {**HOST, "gpu_stack": False})]).hosts["n1"], {}) == {}
    assert not (reports / "gpu_stack").exists()
